"""The local model's serving loop with the decoding replaced by a scripted batcher (no model,
fast): a finished sequence's slot is refilled at once, replies reach their callers, abandoned
requests are dropped mid-generation, a failure fails only the requests it touched, the model
runs in the thread of the loop that awaits it, and several loops in several threads share it
without deadlock."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import time
import weakref

import pytest

from selftaught.models import Completion, FatalBackendError, GenerationParams
from selftaught.models.batching import GenSequence
from selftaught.models.local import LocalModel


def ask(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": question}]


def name_of(seq: GenSequence) -> str:
    return seq.owner.messages[-1]["content"]


class ScriptedBatcher:
    """Every sequence emits one token per step (admission emits the first) until its cap;
    records what it was asked to do."""

    def __init__(self) -> None:
        self.rows: list[GenSequence] = []
        self.admitted: list[GenSequence] = []
        self.log: list[tuple] = []
        self.fail_step: Exception | None = None
        self.fail_admit: Exception | None = None
        self.delay_s = 0.01
        self.room: int | None = None  # rows a scripted KV pool holds (None: no limit)
        self.threads: dict[str, set[int]] = {}  # question -> threads that prefilled/decoded it

    def admit(self, sequences: list[GenSequence]) -> list[GenSequence]:
        self.log.append(("admit", [name_of(s) for s in sequences], len(self.rows)))
        self._record_thread(sequences)
        if self.fail_admit is not None:
            err, self.fail_admit = self.fail_admit, None
            raise err
        time.sleep(self.delay_s)
        self.admitted.extend(sequences)
        for s in sequences:
            self._advance(s)
        self.rows.extend(s for s in sequences if not s.finished)
        return [s for s in sequences if s.finished]

    def step(self) -> list[GenSequence]:
        self.log.append(("step", [name_of(s) for s in self.rows]))
        self._record_thread(self.rows)
        if self.fail_step is not None:
            err, self.fail_step = self.fail_step, None
            raise err
        time.sleep(self.delay_s)
        for s in self.rows:
            self._advance(s)
        done = [s for s in self.rows if s.finished]
        self.rows = [s for s in self.rows if not s.finished]
        return done

    def fits(self, sequences) -> int:
        """All of them, up to `room` rows in flight (a scripted KV pool)."""
        if self.room is None:
            return len(sequences)
        return max(0, min(len(sequences), self.room - len(self.rows)))

    def drop(self, predicate) -> list[GenSequence]:
        gone = [s for s in self.rows if predicate(s)]
        if gone:
            self.log.append(("drop", [name_of(s) for s in gone]))
            self.rows = [s for s in self.rows if not predicate(s)]
        return gone

    def reset(self) -> None:
        self.rows = []

    @property
    def in_flight(self) -> list[GenSequence]:
        return self.rows

    def _record_thread(self, sequences: list[GenSequence]) -> None:
        for s in sequences:
            self.threads.setdefault(name_of(s), set()).add(threading.get_ident())

    @staticmethod
    def _advance(s: GenSequence) -> None:
        s.tokens.append(7)
        if len(s.tokens) >= s.max_new_tokens:
            s.finish_reason = "length"


class ScriptedLocalModel(LocalModel):
    """A LocalModel whose tokenizer and decoder are scripted: a reply is 're: <question>'
    after `max_tokens` steps."""

    def __init__(self, **kwargs):
        kwargs.setdefault("max_batch_size", 2)
        super().__init__(None, **kwargs)
        self.batcher = ScriptedBatcher()

    def _ensure_loaded(self) -> None:
        pass

    def _ensure_batcher(self):
        self._batcher = self.batcher  # what `close` clears and the worker looks at
        return self.batcher

    def _encode(self, messages, params=None):
        if "too long" in messages[-1]["content"]:
            return [1] * 100
        return [1, 2, 3]

    def _context_length(self):
        return 50

    def _completion(self, seq, prompt_tokens):
        return Completion(
            text=f"re: {name_of(seq)}",
            prompt_tokens=prompt_tokens,
            completion_tokens=len(seq.tokens),
            finish_reason=seq.finish_reason or "length",
            model=self.name,
        )


def test_finished_slot_is_refilled_at_once_and_replies_are_routed():
    model = ScriptedLocalModel(max_batch_size=2, batch_wait_ms=50)
    lengths = {"a": 1, "b": 6, "c": 2, "d": 1}

    async def main():
        return await asyncio.gather(
            *(model.achat(ask(q), GenerationParams(max_tokens=n)) for q, n in lengths.items())
        )

    replies = asyncio.run(main())
    model.close()
    assert [r.text for r in replies] == [f"re: {q}" for q in lengths]
    assert [r.completion_tokens for r in replies] == list(lengths.values())
    admits = [entry for entry in model.batcher.log if entry[0] == "admit"]
    assert admits[0][1] == ["a", "b"]  # the first two arrive together: one prefill
    # a ended at admission, so c took its slot while b was still running, then d took c's.
    assert ("admit", ["c"], 1) in admits and ("admit", ["d"], 1) in admits
    steps = [entry[1] for entry in model.batcher.log if entry[0] == "step"]
    assert all(len(rows) <= 2 for rows in steps)
    assert ["b", "c"] in steps  # c decoded beside b: no wait for b to end


def test_requests_with_any_params_share_the_running_batch():
    model = ScriptedLocalModel(max_batch_size=8, batch_wait_ms=50)
    requests = [
        ("greedy", GenerationParams(max_tokens=3)),
        ("longer", GenerationParams(max_tokens=5)),
        ("stop", GenerationParams(max_tokens=3, stop=["x"])),
        ("seeded", GenerationParams(max_tokens=3, temperature=0.7, seed=1)),
        ("sampled", GenerationParams(max_tokens=3, temperature=0.7, top_p=0.9)),
    ]

    async def main():
        return await asyncio.gather(*(model.achat(ask(q), p) for q, p in requests))

    replies = asyncio.run(main())
    model.close()
    assert [r.text for r in replies] == [f"re: {q}" for q, _ in requests]
    first = next(entry for entry in model.batcher.log if entry[0] == "admit")
    assert first[1] == [q for q, _ in requests]
    seqs = {name_of(s): s for s in model.batcher.admitted}
    assert seqs["seeded"].generator is not None and seqs["greedy"].generator is None
    assert seqs["stop"].stop == ["x"] and seqs["sampled"].top_p == 0.9


def test_achat_n_expands_to_n_sequences_and_greedy_to_one():
    model = ScriptedLocalModel(max_batch_size=8, batch_wait_ms=20)
    sampled = asyncio.run(
        model.achat_n(ask("s"), GenerationParams(max_tokens=2, temperature=1.0, seed=3), 3)
    )
    greedy = asyncio.run(model.achat_n(ask("g"), GenerationParams(max_tokens=2), 3))
    model.close()
    assert len(sampled) == 3 and len(greedy) == 3
    admits = [entry[1] for entry in model.batcher.log if entry[0] == "admit"]
    assert admits == [["s", "s", "s"], ["g"]]
    # The prompt is charged once: later samples are marked as sharing it.
    assert [bool(c.extra.get("prompt_shared")) for c in sampled] == [False, True, True]
    assert [bool(c.extra.get("prompt_shared")) for c in greedy] == [False, True, True]
    assert len({c.text for c in greedy}) == 1
    with pytest.raises(ValueError, match="n must be"):
        asyncio.run(model.achat_n(ask("s"), GenerationParams(), 0))


def test_step_failure_fails_the_running_requests_and_the_worker_keeps_serving():
    model = ScriptedLocalModel(max_batch_size=4, batch_wait_ms=20)
    model.batcher.fail_step = RuntimeError("kaboom")

    async def main():
        return await asyncio.gather(
            *(model.achat(ask(f"q{i}"), GenerationParams(max_tokens=3)) for i in range(2)),
            return_exceptions=True,
        )

    errors = asyncio.run(main())
    assert all(isinstance(e, FatalBackendError) and "kaboom" in str(e) for e in errors)
    assert model.chat(ask("again"), GenerationParams(max_tokens=2)).text == "re: again"
    model.close()


def test_admission_failure_fails_only_the_newcomers():
    model = ScriptedLocalModel(max_batch_size=4, batch_wait_ms=0)
    model.batcher.delay_s = 0.02

    async def main():
        running = asyncio.ensure_future(model.achat(ask("running"), GenerationParams(max_tokens=8)))
        await asyncio.sleep(0.05)  # "running" is decoding now
        model.batcher.fail_admit = RuntimeError("prefill broke")
        late = await asyncio.gather(
            model.achat(ask("late"), GenerationParams(max_tokens=2)), return_exceptions=True
        )
        return await running, late[0]

    running, late = asyncio.run(main())
    model.close()
    assert running.text == "re: running" and running.completion_tokens == 8
    assert isinstance(late, FatalBackendError) and "prefill broke" in str(late)


def test_abandoned_requests_are_dropped_mid_generation_and_never_admitted():
    model = ScriptedLocalModel(max_batch_size=1, batch_wait_ms=0)
    model.batcher.delay_s = 0.02

    async def main():
        # Timeouts fire a few steps late (the loop runs a step between its turns): "slow" is
        # long enough to outlast them.
        slow = asyncio.ensure_future(model.achat(ask("slow"), GenerationParams(max_tokens=40)))
        await asyncio.sleep(0.05)
        with pytest.raises(asyncio.TimeoutError):  # queued behind "slow", then given up
            await asyncio.wait_for(model.achat(ask("queued"), GenerationParams(max_tokens=2)), 0.01)
        with pytest.raises(asyncio.TimeoutError):  # "slow" itself, given up mid-generation
            await asyncio.wait_for(asyncio.shield(slow), 0.05)
        slow.cancel()
        await asyncio.sleep(0.1)
        return await model.achat(ask("next"), GenerationParams(max_tokens=2))

    assert asyncio.run(main()).text == "re: next"
    model.close()
    log = model.batcher.log
    assert ("drop", ["slow"]) in log
    slow_steps = [e for e in log if e[0] == "step" and "slow" in e[1]]
    assert len(slow_steps) < 39  # it did not run to its cap
    assert not any(e[0] == "admit" and "queued" in e[1] for e in log)


def test_an_overlong_prompt_fails_alone():
    model = ScriptedLocalModel(max_batch_size=4, batch_wait_ms=20)

    async def main():
        return await asyncio.gather(
            model.achat(ask("too long"), GenerationParams(max_tokens=2)),
            model.achat(ask("fine"), GenerationParams(max_tokens=2)),
            return_exceptions=True,
        )

    too_long, fine = asyncio.run(main())
    model.close()
    assert isinstance(too_long, FatalBackendError) and "does not fit" in str(too_long)
    assert fine.text == "re: fine"


def test_token_cap_is_clamped_to_the_context():
    model = ScriptedLocalModel(batch_wait_ms=1)
    reply = model.chat(ask("q"), GenerationParams(max_tokens=500))
    model.close()
    assert reply.completion_tokens == 50 - 3  # context 50, prompt 3
    assert reply.prompt_tokens == 3


def test_fresh_event_loops_and_close():
    model = ScriptedLocalModel(batch_wait_ms=1)
    params = GenerationParams(max_tokens=2)
    for i in range(3):  # what `run_sync` does: a new loop per call
        assert asyncio.run(model.achat(ask(f"q{i}"), params)).text == f"re: q{i}"
    model.close()
    assert model.chat(ask("after close"), params).text == "re: after close"
    model.close()


def test_unused_model_is_freed_once_its_requests_are_answered():
    model = ScriptedLocalModel(batch_wait_ms=1)
    model.chat(ask("hi"), GenerationParams(max_tokens=2))
    assert model._drivers == {}  # the driver exited with its loop's last reply
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None


def test_close_answers_the_requests_already_made():
    model = ScriptedLocalModel(batch_wait_ms=0)

    async def main():
        running = asyncio.ensure_future(model.achat(ask("a"), GenerationParams(max_tokens=20)))
        await asyncio.sleep(0.03)
        model.close()  # blocking, in the loop's own thread: it finishes "a" itself
        return await running

    reply = asyncio.run(main())
    assert reply.text == "re: a" and reply.completion_tokens == 20


def run_with_watchdog(target, timeout_s: float = 20.0):
    """Run `target` in a thread; fail (instead of hanging the suite) on a deadlock."""
    outcome: dict = {}

    def body():
        try:
            outcome["value"] = target()
        except BaseException as err:  # re-raised in the test's thread
            outcome["error"] = err

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), "deadlock: the scenario did not finish"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def test_generation_runs_in_the_thread_of_the_awaiting_loop():
    model = ScriptedLocalModel(batch_wait_ms=1)
    params = GenerationParams(max_tokens=3)
    assert asyncio.run(model.achat(ask("main"), params)).text == "re: main"
    other: dict = {}

    def in_thread():
        other["ident"] = threading.get_ident()
        other["reply"] = model.chat(ask("thread"), params)  # run_sync: a loop in this thread

    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join(10)
    model.close()
    assert other["reply"].text == "re: thread"
    assert model.batcher.threads == {
        "main": {threading.get_ident()},
        "thread": {other["ident"]},
    }


def test_a_second_threads_loop_is_served_while_the_first_drives():
    model = ScriptedLocalModel(max_batch_size=4, batch_wait_ms=0)
    model.batcher.delay_s = 0.02  # "long" lasts ~0.9 s
    other: dict = {}

    def second_loop():
        other["reply"] = asyncio.run(model.achat(ask("other"), GenerationParams(max_tokens=3)))

    async def first_loop():
        long = asyncio.ensure_future(model.achat(ask("long"), GenerationParams(max_tokens=45)))
        await asyncio.sleep(0.05)
        thread = threading.Thread(target=second_loop)
        thread.start()
        while thread.is_alive():
            await asyncio.sleep(0.01)
        other["long_done_first"] = long.done()
        return await long

    long = run_with_watchdog(lambda: asyncio.run(first_loop()))
    model.close()
    assert long.text == "re: long" and long.completion_tokens == 45
    assert other["reply"].text == "re: other"
    assert not other["long_done_first"]  # served beside "long", not after it
    assert any(e[0] == "step" and set(e[1]) == {"long", "other"} for e in model.batcher.log)


def test_a_blocking_call_inside_a_driving_loop_is_served_by_its_helper_thread():
    # `chat` inside a running loop runs in run_sync's helper thread while the loop's own
    # driver cannot step: the helper's driver steps for both.
    model = ScriptedLocalModel(max_batch_size=4, batch_wait_ms=0)
    seen: dict = {}

    async def main():
        long = asyncio.ensure_future(model.achat(ask("long"), GenerationParams(max_tokens=45)))
        await asyncio.sleep(0.05)  # "long" is decoding in this loop's thread
        seen["inner"] = model.chat(ask("inner"), GenerationParams(max_tokens=3))
        return await long

    long = run_with_watchdog(lambda: asyncio.run(main()))
    model.close()
    assert seen["inner"].text == "re: inner"
    assert long.text == "re: long" and long.completion_tokens == 45
    assert len(model.batcher.threads["long"]) == 2  # the helper stepped it too meanwhile


def test_requests_from_many_loops_at_once_are_all_answered():
    model = ScriptedLocalModel(max_batch_size=3, batch_wait_ms=0)
    model.batcher.delay_s = 0.0005
    replies: list[str] = []

    def client(c: int) -> None:
        for i in range(25):  # a fresh loop per call: drivers start and exit all the time
            params = GenerationParams(max_tokens=1 + (c + i) % 3)
            replies.append(model.chat(ask(f"{c}-{i}"), params).text)

    def scenario():
        threads = [threading.Thread(target=client, args=(c,)) for c in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    run_with_watchdog(scenario, timeout_s=60)
    model.close()
    assert sorted(replies) == sorted(f"re: {c}-{i}" for c in range(4) for i in range(25))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_serves_even_if_a_step_was_running_at_the_fork():
    model = ScriptedLocalModel(batch_wait_ms=1)
    model.chat(ask("parent"), GenerationParams(max_tokens=2))
    read_end, write_end = os.pipe()
    with model._step_lock:  # as if another thread were mid-step when the process forked
        pid = os.fork()
        if pid == 0:  # the child: it must not wait for a lock no thread of it will release
            try:
                text = model.chat(ask("child"), GenerationParams(max_tokens=2)).text
                os.write(write_end, text.encode())
            finally:
                os._exit(0)
    os.close(write_end)
    deadline = time.monotonic() + 20
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:  # deadlocked: do not leave it behind
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            break
        time.sleep(0.05)
    answer = os.read(read_end, 100).decode()
    os.close(read_end)
    model.close()
    assert answer == "re: child"
