"""The local model's request scheduler: the inbox, the drivers that step the continuous batcher
in the event loops that await replies, fork safety, and delivery of finished sequences.

Every call becomes one or more sequences in a thread-safe inbox, each request with a
`concurrent.futures.Future`, and makes sure a driver task runs in the calling event loop. The
driver steps the continuous batcher (`selftaught.models.batching`: a sequence that finishes
frees its slot for the next waiting one at once) and yields to its loop between steps, until
every request made in that loop is answered; then it exits. So the model runs in the thread
that awaits it, usually the only thread of the process that runs torch (a second one costs
every forward on a CPU: libgomp keeps one OpenMP team per calling thread, and two teams on
too few cores make both spin politely and slowly). The cost: while a forward runs (one
decode step, or one prefill, or with `prefill_chunk` one chunk of one), nothing else runs in
that loop. A sequence being prefilled in chunks holds its slot like a running one; a free slot
is refilled only when the KV pool (`selftaught.models.kv_pool`) can set aside the blocks the
newcomer may need, so a full pool makes requests wait, never fail. How many
torch threads that forward uses follows the cores other processes leave free, checked again
while serving (`selftaught.models.threads`; `SELFTAUGHT_THREADS` fixes it).

Several loops in several threads may use one model at once (`run_sync` inside a running loop
runs in a helper thread; a sync scorer calls a local judge from a worker thread): one step
runs at a time (a lock), and each step serves every request, from any thread. A driver
whose lock attempt fails lets the stepping thread serve its requests and tries again a
little later, so it takes over when that thread stops stepping, also when that thread's loop
is blocked waiting for it. Nothing here is bound to one loop, which is why `run_sync` may
create a fresh one per call.

The scheduler holds no weights and formats no prompt: it asks the model it serves
(`ServedModel`, the hooks `LocalModel` gives it) for the batcher, a request's token ids, the
context length and a finished sequence's reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import logging
import os
import secrets
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any, Protocol

from selftaught.models.base import Completion, GenerationParams, Message, params_for_sample
from selftaught.models.batching import ContinuousBatcher, GenSequence
from selftaught.models.errors import BackendError, FatalBackendError
from selftaught.models.local_prompts import BACKEND
from selftaught.models.threads import governor
from selftaught.models.tools import apply_tool_reply, offered_tools

MAX_POLL_S = 0.02  # longest wait of a driver while another thread steps
FOLLOW_UP_TURNS = 4  # loop turns an answered caller gets to ask again before the next step
log = logging.getLogger(__name__)


class ServedModel(Protocol):
    """What the scheduler asks of the model it serves. On `LocalModel` these are private
    hooks a subclass may override (the tests script the decoder that way)."""

    name: str

    @property
    def max_batch_size(self) -> int: ...

    def _ensure_batcher(self) -> ContinuousBatcher:
        """The engine to step (made once; the scheduler keeps it in `batcher`)."""
        ...

    def _encode(
        self, messages: list[Message], params: GenerationParams | None = None
    ) -> list[int]: ...

    def _context_length(self) -> int | None: ...

    def _completion(self, seq: GenSequence, prompt_tokens: int) -> Completion: ...


@dataclass(eq=False)
class Request:
    """One `achat`/`achat_n`/`chat` call: its n completions arrive in `future` as a list."""

    messages: list[Message]
    params: GenerationParams
    n: int = 1
    future: Future[list[Completion]] = field(default_factory=Future)
    submitted_at: float = field(default_factory=time.perf_counter)
    prompt_tokens: int = 0
    completions: list[Completion | None] = field(default_factory=list)
    pending: int = 0  # sequences still generating

    @property
    def abandoned(self) -> bool:
        """Cancelled by its caller, or already failed: its sequences are dropped."""
        return self.future.done()


@dataclass(eq=False)
class Driver:
    """The serving task of one event loop and the requests made in that loop."""

    requests: list[Request] = field(default_factory=list)
    task: asyncio.Task[None] | None = None
    finished: bool = False  # decided to exit: a new request in its loop starts a new one
    seen: int = -1  # the requests were last looked at when `DoneMarks.mark` was this


class DoneMarks:
    """A done callback of every request's future: `mark` changes whenever one is done
    (answered, failed or cancelled, from any thread), so that the stepping thread looks for
    finished or abandoned requests only when there is something to find, not over every
    queued request at every step. (No reference back to the scheduler: a future outliving
    it keeps nothing alive.)"""

    def __init__(self) -> None:
        self._ids = itertools.count(1)  # next() is atomic: every mark is new
        self.mark = 0

    def __call__(self, _future: Future[list[Completion]]) -> None:
        self.mark = next(self._ids)


class RequestScheduler:
    """Queues the requests of any thread and loop and steps `model`'s batcher to answer
    them (the module docstring says how).

    The model served is an argument of every entry point, not an attribute: the scheduler
    belongs to the model, and a reference back would keep a dropped model's weights alive
    until the cyclic collector runs (a driver holds its model only while it serves).

    Args:
        batch_wait_ms: how long an idle model waits for more requests before the first
            prefill (requests arriving together share it).
        follow_up_turns: loop turns an answered caller gets to ask again before the next
            step (so that its next request joins that step).
    """

    def __init__(
        self,
        *,
        batch_wait_ms: float = 5.0,
        follow_up_turns: int = FOLLOW_UP_TURNS,
    ) -> None:
        self.batch_wait_ms = batch_wait_ms
        self.follow_up_turns = follow_up_turns
        self.batcher: ContinuousBatcher | None = None  # the model's, made on the first step
        # _inbox_lock guards the inbox and the drivers (held briefly); step_lock guards the
        # waiting sequences and the batcher (held for one step).
        self._inbox_lock = threading.Lock()
        self.step_lock = threading.Lock()
        self._inbox: list[Request] = []
        self.drivers: dict[asyncio.AbstractEventLoop, Driver] = {}
        self._waiting: deque[GenSequence] = deque()
        self._gather_until: float | None = None  # end of an idle model's wait for more
        self._answered = False  # the last step answered a request (its caller may ask again)
        self._done = DoneMarks()
        self._dropped_at = -1  # `self._done.mark` when abandoned sequences were last looked for
        self._pid = os.getpid()

    # ------------------------------------------------------------------ submission

    def submit(
        self, model: ServedModel, messages: list[Message], params: GenerationParams, n: int
    ) -> Request:
        """Queue a request (already checked) for `model` and make sure the running loop has a
        driver serving it."""
        loop = asyncio.get_running_loop()
        request = Request(messages, params, n)
        with self._inbox_lock:  # atomic with a driver's decision to exit: nothing is stranded
            self._inbox.append(request)
            driver = self.drivers.get(loop)
            if driver is None or driver.finished:
                driver = self.drivers[loop] = Driver()
                driver.task = loop.create_task(
                    self._drive(model, loop, driver), name=f"selftaught-{model.name}-driver"
                )
            driver.requests.append(request)
            # After the request is in the lists a look for done requests walks: if it is done
            # already, the callback runs now and the next look finds it.
            request.future.add_done_callback(self._done)
        return request

    def after_fork(self) -> bool:
        """In a forked child: forget the parent's requests and drivers (their threads do
        not exist here) and make fresh locks (one may have been held at the fork). Returns
        whether this is a forked child."""
        if self._pid == os.getpid():
            return False
        self._pid = os.getpid()
        self._inbox_lock = threading.Lock()
        self.step_lock = threading.Lock()
        self._inbox, self.drivers, self._waiting = [], {}, deque()
        self._gather_until = None
        self._dropped_at = -1
        if self.batcher is not None:
            self.batcher.reset()
        return True

    # ------------------------------------------------------------------ serving

    async def _drive(
        self, model: ServedModel, loop: asyncio.AbstractEventLoop, driver: Driver
    ) -> None:
        """Step the batcher, yielding to the loop between steps, until every request made
        in this loop is answered. While another thread steps (it serves these requests too),
        try again after a short, growing pause."""
        pause = 0.0
        try:
            while True:
                if self.step_lock.acquire(blocking=False):
                    try:
                        delay = self._drive_step(model, driver)
                    finally:
                        self.step_lock.release()
                    pause = 0.0
                elif self._settled(driver):
                    return
                else:
                    pause = delay = min(max(2 * pause, 0.001), MAX_POLL_S)
                if delay is None:
                    return
                await asyncio.sleep(delay)
                if self._answered:
                    await self._follow_ups(model)
        finally:
            with self._inbox_lock:
                driver.finished = True
                if self.drivers.get(loop) is driver:
                    del self.drivers[loop]

    async def _follow_ups(self, model: ServedModel) -> None:
        """A caller answered by the last step often asks again at once (the next rollout
        of a batch, an episode's next turn): while slots are free, give it the few loop
        turns it takes to reach the inbox, so that it joins the next step, not the one after."""
        self._answered = False
        for _ in range(self.follow_up_turns):
            if self._inbox or len(self._waiting) + self._running() >= model.max_batch_size:
                return
            await asyncio.sleep(0)

    def _drive_step(self, model: ServedModel, driver: Driver) -> float | None:
        """One serving step (caller holds step_lock). Returns how long to yield before the
        next one, or None when the driver's requests are all answered."""
        self._intake(model)
        if self._settled(driver):
            self._drop_abandoned()  # a cancelled request's rows must not outlive its driver
            return None
        if not self._waiting and not self._has_running():
            # Unreachable by design (a request is in the inbox, waiting, running or done);
            # never leave a caller waiting on it.
            _fail(driver.requests, BackendError(BACKEND, "internal error: request lost"))
            return None
        if not self._has_running() and len(self._waiting) < model.max_batch_size:
            now = time.perf_counter()
            if self._gather_until is None:  # idle: let requests arriving together share a prefill
                self._gather_until = now + self.batch_wait_ms / 1000
            if now < self._gather_until:
                return self._gather_until - now
        self._gather_until = None
        self._serve_guarded(model)
        return 0.0

    def _settled(self, driver: Driver) -> bool:
        """Whether every request of `driver`'s loop is answered (or abandoned); if so the
        driver is finished, atomically with `submit`'s look at it."""
        with self._inbox_lock:
            mark = self._done.mark
            if driver.seen != mark:  # some request was done since the last look
                driver.seen = mark
                driver.requests = [r for r in driver.requests if not r.future.done()]
            if not driver.requests:
                driver.finished = True
            return driver.finished

    def drain(self, model: ServedModel) -> None:
        """Serve until nothing is queued or running (caller holds step_lock)."""
        while True:
            self._intake(model)
            if not self._waiting and not self._has_running():
                return
            self._serve_guarded(model)

    def _intake(self, model: ServedModel) -> None:
        """Move the inbox's requests into the waiting sequences (caller holds step_lock). A
        request that cannot be prepared (a prompt too long, a template error, a failed load)
        fails alone."""
        with self._inbox_lock:
            taken, self._inbox = self._inbox, []
        for request in taken:
            if request.abandoned:
                continue
            try:
                self._waiting.extend(self._sequences(model, request))
            except Exception as err:
                _fail([request], err if isinstance(err, BackendError) else _as_backend_error(err))

    def _serve_guarded(self, model: ServedModel) -> None:
        """`_serve_step`, failing what is waiting and running if anything escapes it: a
        caller must never be left waiting on a step that will not come."""
        try:
            self._serve_step(model)
        except Exception as err:
            error = err if isinstance(err, BackendError) else _as_backend_error(err)
            _fail([s.owner for s in self._waiting], error)
            self._waiting.clear()
            self._fail_running(error)

    def _sequences(self, model: ServedModel, request: Request) -> list[GenSequence]:
        """The sequences of one request: n samples, or one for a greedy request (its n
        replies are copies); the token cap is clamped to what the context leaves."""
        ids = model._encode(request.messages, request.params)
        context = model._context_length()
        if context and len(ids) >= context:
            raise FatalBackendError(
                BACKEND,
                f"prompt of {len(ids)} tokens does not fit {model.name}'s context of "
                f"{context} tokens",
            )
        params = request.params
        max_new = min(params.max_tokens, context - len(ids)) if context else params.max_tokens
        count = request.n if params.temperature > 0 else 1
        request.prompt_tokens = len(ids)
        request.completions = [None] * request.n
        request.pending = count
        return [
            GenSequence(
                owner=request,
                index=i,
                prompt_ids=ids,
                max_new_tokens=max_new,
                temperature=params.temperature,
                top_p=params.top_p,
                generator=_generator(params_for_sample(params, i).seed)
                if params.temperature > 0
                else None,
                stop=params.stop,
                keep_kv=bool(params.tools),  # an episode's turn: the next one extends it
            )
            for i in range(count)
        ]

    def _has_running(self) -> bool:
        return self.batcher is not None and bool(self.batcher.in_flight)

    def _running(self) -> int:
        """Sequences decoding or being prefilled (chunked prefill): each holds a slot."""
        return 0 if self.batcher is None else len(self.batcher.in_flight)

    def _drop_abandoned(self) -> None:
        """Forget the sequences of cancelled or failed requests, running or waiting."""
        mark = self._done.mark
        if mark == self._dropped_at:  # no request was done since the last look
            return
        self._dropped_at = mark
        if self.batcher is not None:
            self.batcher.drop(lambda s: s.owner.abandoned)
        if any(s.owner.abandoned for s in self._waiting):
            self._waiting = deque(s for s in self._waiting if not s.owner.abandoned)

    def _serve_step(self, model: ServedModel) -> None:
        """Drop abandoned sequences, refill free slots from the waiting ones (as many as the
        KV pool holds), decode one step, deliver what finished. A failure fails only the
        requests it touched."""
        batcher = self.batcher = model._ensure_batcher()
        _follow_free_cores()
        self._drop_abandoned()
        newcomers: list[GenSequence] = []
        waiting = self._waiting
        free = model.max_batch_size - len(batcher.in_flight)
        if free > 0 and waiting:
            # The KV pool may not hold them all yet: the rest wait for running rows to end.
            # Alone with nothing running, one is admitted anyway (the pool says why it fails).
            count = batcher.fits([waiting[i] for i in range(min(free, len(waiting)))])
            count = count or int(not batcher.in_flight)
            newcomers = [waiting.popleft() for _ in range(count)]
        if newcomers:
            try:
                self._deliver(model, batcher.admit(newcomers))
            except Exception as err:
                error = err if isinstance(err, BackendError) else _as_backend_error(err)
                _fail([s.owner for s in newcomers], error)
                if any(s in batcher.rows for s in newcomers):  # failed mid-merge
                    self._fail_running(error)
        if batcher.in_flight:
            try:
                self._deliver(model, batcher.step())
            except Exception as err:
                self._fail_running(err if isinstance(err, BackendError) else _as_backend_error(err))

    def _fail_running(self, error: BaseException) -> None:
        if self.batcher is not None:
            _fail([s.owner for s in self.batcher.in_flight], error)
            self.batcher.reset()

    def _deliver(self, model: ServedModel, finished: list[GenSequence]) -> None:
        done = time.perf_counter()
        for seq in finished:
            request: Request = seq.owner
            if request.abandoned:
                continue
            completion = model._completion(seq, request.prompt_tokens)
            completion.latency_s = done - request.submitted_at
            if seq.first_token_at is not None:  # time to first token
                completion.extra["ttft_s"] = round(seq.first_token_at - request.submitted_at, 4)
            offered = offered_tools(request.params.tools, request.params.tool_choice)
            if offered:  # the reply's <tool_call> blocks become tool_calls (or errors)
                apply_tool_reply(completion, offered)
            if seq.index > 0:
                completion.extra["prompt_shared"] = True  # one call: its prompt counts once
            request.completions[seq.index] = completion
            request.pending -= 1
            if request.pending:
                continue
            if request.params.temperature <= 0:  # greedy: the n replies are one
                request.completions = [
                    completion,
                    *(_shared_copy(completion) for _ in range(request.n - 1)),
                ]
            # pending is 0: every index holds its completion
            _resolve(request.future, [c for c in request.completions if c is not None])
            self._answered = True


# ---------------------------------------------------------------------- helpers


def _follow_free_cores() -> None:
    """Between forward passes, in the thread that runs them: the torch threads follow the
    free cores (`selftaught.models.threads`). Tuning never fails a request."""
    try:
        governor().tick()
    except Exception as err:  # e.g. torch refusing a thread count: keep serving as before
        log.debug("thread tuning skipped: %s", err)


def _generator(seed: int | None) -> Any:
    """A private RNG for one sampled sequence (torch's global RNG is never touched)."""
    import torch

    return torch.Generator().manual_seed(secrets.randbits(63) if seed is None else seed)


def _shared_copy(completion: Completion) -> Completion:
    calls = copy.deepcopy(completion.tool_calls)  # each copy's own calls
    copy_ = Completion(
        **{**completion.__dict__, "extra": dict(completion.extra), "tool_calls": calls}
    )
    copy_.extra["prompt_shared"] = True
    return copy_


def _resolve(future: Future[list[Completion]], result: list[Completion]) -> None:
    with contextlib.suppress(InvalidStateError):  # cancelled meanwhile
        future.set_result(result)


def _fail(requests: Sequence[Request], error: BaseException) -> None:
    for r in requests:
        with contextlib.suppress(InvalidStateError):  # done or cancelled already
            r.future.set_exception(error)


def _as_backend_error(err: BaseException) -> BackendError:
    return FatalBackendError(BACKEND, f"generation failed: {type(err).__name__}: {err}")
