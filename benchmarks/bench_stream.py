"""Sleep on mixed traffic (issue 62): does a deployed agent learn each kind of request it gets,
night after night, while the mix drifts, and forget none of them?

A stream of requests of four kinds goes through `selftaught proxy` (in process, in front of the
target), each kind seeded, with a deterministic check; a kind's held-out items are its
generator's test split, never in the stream:

- **arithmetic**: reasoning-gym basic_arithmetic about distances in km; a wrong reply is
  corrected with the value and the unit ("Nope, 7 km."); checked by the number and km at the
  end (`quantity`);
- **text**: reasoning-gym word_sequence_reversal; corrected with the reversed list, quoted;
  checked by the generator's own `score_answer`;
- **rule**: reasoning-gym letter_counting; the house rule is restated after a reply that
  breaks it ("Please reply in JSON with the key \"answer\"."), never given with a request;
  checked by the rule: a JSON object with the key `answer` in the reply;
- **tool**: tool:calculator, the calculator offered as a tool in the OpenAI shape; the client
  runs each call and sends the result back; corrected with the number; checked by the final
  answer's number.

A right reply is thanked ("Thanks, that's right.", "Perfect, thanks!", ...); every fourth wrong
reply is asked again in a new conversation instead (a re-ask). There is no feedback call at all:
what a night learns from is the conversation. Every phrasing is one the follow-up reader reads
(tests/test_bench_stream.py); its recall on phrasings written blind is `bench_followups.py`'s.

The drift (requests per night out of 16, scaled to `--requests-per-night`): arithmetic heavy
early and rare later, text absent on nights 2-3 and then back, tool only on the last two:

| night | arithmetic | text | rule | tool |
|---|---|---|---|---|
| 1 | 10 | 3 | 3 | 0 |
| 2 | 8 | 0 | 8 | 0 |
| 3 | 5 | 0 | 11 | 0 |
| 4 | 2 | 8 | 2 | 4 |
| 5 | 1 | 5 | 4 | 6 |

Configurations, side by side in one run (each its own deployment: the same stream, the same
held-out items): `none` (nothing learns; its held-out set is answered again every night, the
noise floor of the retention test); `default` (today's night: one skill and memory, recall);
`skills` (`sleep run --skills`: one skill per cluster, each gated on its own cluster's val and on
the whole val); `gepa-style` (the design GEPA's users run: one prompt re-optimized on each
night's data, no recall, no per-kind veto; selftaught with those parts off, since GEPA's driver
takes a benchmark task, not a night's mined tasks); `ace-style` (ACE's design: an append-only
playbook, no gate: `edit_ops=("append",)`, the gate off, no demonstrations, no recall).
`--weights sft|dpo|auto` lets `default` and `skills` train adapters too (a local target); the
two peer designs learn text only, as the tools they stand for. Two more configurations, named
with `--configs` only (never in a default run), measure the choice of `sleep run
--skill-adapters` on dev streams: `skills-per-skill` (an adapter per kind, each gated on its
own val) and `skills-shared` (one adapter for every kind, gated with the per-kind veto), both
`--skills` with `--weights` (sft unless given) on a local target. A configuration the code
cannot build is recorded as unavailable, with the reason.

Deployments: `--deployment person` (one person, `--trusted-clients '*'`: their corrections may
become demonstrations) or `app` (six end users with their own keys: their words are evidence
only, never demonstrations or rules).

Per night and configuration the results hold held-out hard accuracy per kind with 95% Wilson
intervals (and each item's score), the night's status, the tasks it mined per kind and split,
and calls and wall time of the traffic, the night and the held-out evaluation. The summary per
configuration: per kind the start, the final figure, the best earlier one and **retention**
(final against the best earlier night, paired on the same items: wins, losses, the two-sided
exact sign test, i.e. exact McNemar); the gain per kind and its mean over kinds.
`--single-kind KIND` sends a stream of the same size of that kind alone (the same held-out
items): the mixed stream's mean gain is compared with those streams' gains (target: at least
0.8 of them).

    python benchmarks/bench_stream.py --quick                 # smoke: nights 4-5 of the table
    python benchmarks/bench_stream.py --deployment app        # a dev run (seed 0)
    python benchmarks/bench_stream.py --single-kind text      # the same size, one kind
    python benchmarks/bench_stream.py --target local --configs none,skills-per-skill,skills-shared
    python benchmarks/bench_stream.py --report 620 --target local   # a reported run, once

Results: benchmarks/results/stream_<target>_<deployment>[...].json, written after every
night; each deployment's home is snapshotted beside it (`.state/<config>.night<k>`), so a
killed run resumes after its last completed night (the same settings; `--fresh` starts over).
Report seeds and settings: benchmarks/report_settings_stream.json (`--report SEED` runs one,
once; `--rerun` adds a row beside it); dev seeds are never report seeds.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

import common  # noqa: E402
from protocol import code_state  # noqa: E402

from selftaught.errors import ConfigError  # noqa: E402
from selftaught.gate import GateConfig  # noqa: E402
from selftaught.runs import atomic_write_json, read_json, slug  # noqa: E402
from selftaught.tasks.base import Example, Score  # noqa: E402

SETTINGS_FILE = HERE / "report_settings_stream.json"
KIND_NAMES = ("arithmetic", "text", "rule", "tool")
SCHEDULE: tuple[dict[str, int], ...] = (  # requests per night out of 16 (the docstring's table)
    {"arithmetic": 10, "text": 3, "rule": 3, "tool": 0},
    {"arithmetic": 8, "text": 0, "rule": 8, "tool": 0},
    {"arithmetic": 5, "text": 0, "rule": 11, "tool": 0},
    {"arithmetic": 2, "text": 8, "rule": 2, "tool": 4},
    {"arithmetic": 1, "text": 5, "rule": 4, "tool": 6},
)
QUICK_NIGHTS = (4, 5)  # --quick: the two nights that hold every kind
CONFIGS = ("none", "default", "skills", "gepa-style", "ace-style")
# many skills with an adapter per kind or one shared (`--skill-adapters`): chosen between by
# measurement, so run with --configs and a local target; never in a default run
ADAPTER_CONFIGS = {"skills-per-skill": "per-skill", "skills-shared": "shared"}
ALL_CONFIGS = (*CONFIGS, *ADAPTER_CONFIGS)
WEIGHT_CONFIGS = ("default", "skills")  # the peer designs learn text only
REASK_EVERY = 4  # every 4th wrong reply is asked again instead of corrected
MAX_TOOL_TURNS = 4
UNIT = "km"
THANKS = ("Thanks, that's right.", "Perfect, thanks!", "Great, that works.", "Exactly, thank you.")


# ---- the kinds of request ---------------------------------------------------------------


@dataclass(frozen=True)
class Kind:
    """One kind of request: its generator, how a request is phrased, what the user says to a
    wrong reply (templates of `{ref}`, taken in turn), and what its check is."""

    name: str
    spec: str
    about: str
    check: str
    feedback: tuple[str, ...]
    suffix: str = ""  # added to each question
    unit: str = ""  # added to each reference
    system: str | None = None  # the app's own system prompt
    tools: bool = False


KINDS: dict[str, Kind] = {
    "arithmetic": Kind(
        "arithmetic",
        "gym:basic_arithmetic?max_terms=2&max_digits=1",
        "reasoning-gym basic_arithmetic, the numbers distances in km",
        "the number, and km at the end (quantity)",
        (
            "No, that's wrong: it's {ref}.",
            "Not quite, it should be {ref}.",
            "Wrong, the answer is {ref}.",
            "Nope, {ref}.",
        ),
        suffix=f" The numbers are distances in {UNIT}.",
        unit=f" {UNIT}",
    ),
    "text": Kind(
        "text",
        "gym:word_sequence_reversal?min_words=3&max_words=5",
        "reasoning-gym word_sequence_reversal (3-5 words)",
        "the generator's own score_answer",
        ('Wrong, it should be "{ref}".', 'No, it\'s "{ref}".', 'That\'s not right: "{ref}".'),
    ),
    "rule": Kind(
        "rule",
        "gym:letter_counting",
        "reasoning-gym letter_counting; the house rule (JSON with the key answer) is only ever "
        "restated after a reply that breaks it",
        'a JSON object with the key "answer" in the reply',
        (
            'Please reply in JSON with the key "answer".',
            'Answer as JSON, like {{"answer": ...}}.',
            'Return valid JSON with an "answer" field, please.',
            'JSON only, please: {{"answer": ...}}',
        ),
    ),
    "tool": Kind(
        "tool",
        "tool:calculator",
        "tool:calculator (4-5 digit products and sums), the calculator offered as a tool",
        "the final answer's number",
        ("That's incorrect, it's {ref}.", "No, the answer is {ref}.", "Wrong, it should be {ref}."),
        tools=True,
    ),
}


@dataclass(frozen=True)
class Request:
    """One request of the stream or of the held-out set; `index` orders the stream (and
    picks the user's phrasing and key)."""

    kind: str
    id: str
    index: int
    question: str
    reference: str
    example: Example = field(compare=False)
    score: Callable[[str, Example], Score] = field(compare=False, repr=False)

    def opening(self) -> list[dict[str, Any]]:
        system = KINDS[self.kind].system
        head = [{"role": "system", "content": system}] if system else []
        return [*head, {"role": "user", "content": self.question}]

    def passes(self, reply: str) -> bool:
        """The kind's check on a reply."""
        if self.kind == "rule":
            return json_answer(reply)
        return self.score(reply, self.example).hard == 1.0


def json_answer(reply: str) -> bool:
    """The rule kind's check: the reply holds a JSON object with the key `answer`."""
    from selftaught.tasks.extract import extract_json

    try:
        value = extract_json(reply)
    except ValueError:
        return False
    return isinstance(value, dict) and "answer" in value


def kind_items(kind: str, seed: int, n_stream: int, n_heldout: int) -> tuple[list[Request], ...]:
    """(stream items, held-out items) of one kind: its generator's train and test splits."""
    from selftaught.tasks import load_task
    from selftaught.tasks.scorers import quantity

    k = KINDS[kind]
    task = load_task(k.spec, train_size=n_stream, val_size=0, test_size=n_heldout, seed=seed)
    score = quantity if kind == "arithmetic" else task.score

    def request(ex: Example, tag: str, i: int) -> Request:
        reference = f"{ex.reference}{k.unit}"
        shown = Example(ex.id, f"{ex.input}{k.suffix}", reference, state=dict(ex.state))
        return Request(kind, f"{kind}-{tag}{i}", i, str(shown.input), reference, shown, score)

    return (
        [request(ex, "s", i) for i, ex in enumerate(task.examples("train"))],
        [request(ex, "h", i) for i, ex in enumerate(task.examples("test"))],
    )


# ---- the stream and its drift -----------------------------------------------------------


def night_counts(weights: Mapping[str, int], per_night: int) -> dict[str, int]:
    """Requests of each kind in a night of `per_night` (largest remainders; a kind of weight
    0 gets none)."""
    total = sum(weights.values())
    exact = {k: per_night * weights.get(k, 0) / total for k in KIND_NAMES}
    counts = {k: int(v) for k, v in exact.items()}
    left = per_night - sum(counts.values())
    for k in sorted(KIND_NAMES, key=lambda k: counts[k] - exact[k])[:left]:
        counts[k] += 1
    return counts


@dataclass(frozen=True)
class Stream:
    nights: tuple[tuple[Request, ...], ...]
    heldout: tuple[Request, ...]
    counts: tuple[dict[str, int], ...]


def schedule(args: argparse.Namespace) -> list[dict[str, int]]:
    """Each night's requests per kind: the drift table, or one kind alone (`--single-kind`)."""
    rows = [SCHEDULE[n - 1] for n in QUICK_NIGHTS] if args.quick else list(SCHEDULE)
    rows = rows[: args.nights]
    if args.single_kind:
        return [{k: args.requests_per_night * (k == args.single_kind) for k in KIND_NAMES}] * len(
            rows
        )
    return [night_counts(w, args.requests_per_night) for w in rows]


def make_stream(args: argparse.Namespace) -> Stream:
    """The nights' requests (each night's kinds interleaved by a seeded shuffle) and the
    held-out items, from the kinds' seeded generators. Each kind's stream items are drawn in
    order from one list of nights x requests items, so a single-kind stream and the mixed one
    share items and the held-out set is the same for both."""
    counts = schedule(args)
    size = args.nights * args.requests_per_night
    items = {k: kind_items(k, args.seed, size, args.heldout) for k in KIND_NAMES}
    taken = dict.fromkeys(KIND_NAMES, 0)
    nights: list[tuple[Request, ...]] = []
    index = 0
    for k, night in enumerate(counts, 1):
        requests = []
        for kind in KIND_NAMES:
            requests += items[kind][0][taken[kind] : taken[kind] + night[kind]]
            taken[kind] += night[kind]
        random.Random(f"stream:{args.seed}:{k}").shuffle(requests)
        nights.append(tuple(replace(r, index=index + i) for i, r in enumerate(requests)))
        index += len(requests)
    heldout = tuple(r for k in KIND_NAMES for r in items[k][1])
    return Stream(tuple(nights), heldout, tuple(counts))


# ---- the users ---------------------------------------------------------------------------


def followup(r: Request, reply: str) -> str | None:
    """The user's next turn: thanks for a right reply; for a wrong one the kind's feedback in
    turn (a correction with the value, or the rule restated), except every `REASK_EVERY`th,
    which is asked again in a new conversation (None)."""
    if r.passes(reply):
        return THANKS[r.index % len(THANKS)]
    if r.index % REASK_EVERY == REASK_EVERY - 1:
        return None
    said = KINDS[r.kind].feedback
    return said[r.index % len(said)].format(ref=r.reference)


@dataclass(frozen=True)
class Deployment:
    """Who sends the traffic: one person whose words are the operator's, or an app's end
    users, each with a key of their own, whose words are evidence only."""

    name: str
    trusted: tuple[str, ...]
    users: int

    def keys(self) -> dict[str, str]:
        return {f"user{u}": f"bench-stream-user{u}-key" for u in range(1, self.users + 1)}

    def key_for(self, index: int) -> str | None:
        keys = list(self.keys().values())
        return keys[index % len(keys)] if keys else None


DEPLOYMENTS = {"person": Deployment("person", ("*",), 0), "app": Deployment("app", (), 6)}


@dataclass(frozen=True)
class Conversation:
    ids: tuple[str, ...]  # the rows logged, one per request (a tool episode logs each step)
    messages: list[dict[str, Any]]
    reply: str


def converse(
    client: common.ProxyClient, r: Request, messages: list[dict[str, Any]], key: str | None
) -> Conversation:
    """Ask; for a tool request, run each call the reply makes on the calculator and ask again
    with the results (at most `MAX_TOOL_TURNS` requests): what a tool-using app does."""
    from selftaught.tasks.episode import call_tool
    from selftaught.tasks.tools.calculator import CalculatorEnvironment

    env = CalculatorEnvironment()
    tools = env.schemas() if KINDS[r.kind].tools else None
    msgs, ids, message = list(messages), [], {}
    for _ in range(MAX_TOOL_TURNS):
        iid, message = client.ask(msgs, tools=tools, key=key)
        ids.append(iid)
        calls = message.get("tool_calls") or []
        turn: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
        msgs.append({**turn, "tool_calls": calls} if calls else turn)
        if not calls:
            break
        for call in calls:
            result = call_tool(env, call)[0]
            msgs.append({"role": "tool", "tool_call_id": call.get("id"), "content": result})
    return Conversation(tuple(ids), msgs, str(message.get("content") or ""))


# ---- one night of one configuration -----------------------------------------------------


@dataclass(frozen=True)
class Run:
    """What every configuration's nights share."""

    args: argparse.Namespace
    stream: Stream
    deployment: Deployment
    models: Any
    root: Path  # the deployments' homes

    @property
    def keys_file(self) -> Path | None:
        return self.root / "client_keys.json" if self.deployment.users else None

    def proxy(self, home: Path, log_path: Path | None = None) -> Any:
        m = self.models
        return common.deployment_proxy(
            home,
            m.target,
            m.target_spec,
            trusted=self.deployment.trusted,
            client_keys=self.keys_file,
            log_path=log_path,
        )


IDS_FILE = "stream_ids.json"  # in a deployment's home: each logged row's kind


def send_traffic(home: Path, run: Run, requests: Sequence[Request]) -> dict[str, Any]:
    """The night's requests through the deployment's proxy, each followed by the user's next
    turn (or a re-ask); records which kind each logged row is."""
    ids_path = home / IDS_FILE
    kinds: dict[str, str] = read_json(ids_path) if ids_path.exists() else {}
    lock = threading.Lock()
    right = dict.fromkeys(KIND_NAMES, 0)
    t0 = time.perf_counter()
    with run.proxy(home) as (url, app):
        client = common.ProxyClient(url, run.args.max_tokens)

        def one(r: Request) -> None:
            key = run.deployment.key_for(r.index)
            first = converse(client, r, r.opening(), key)
            said = followup(r, first.reply)
            if said is None:  # a re-ask: the same request in a new conversation
                then = converse(client, r, r.opening(), key)
            else:
                then = converse(
                    client, r, [*first.messages, {"role": "user", "content": said}], key
                )
            with lock:
                right[r.kind] += r.passes(first.reply)
                kinds.update(dict.fromkeys((*first.ids, *then.ids), r.kind))

        with concurrent.futures.ThreadPoolExecutor(run.args.concurrency) as pool:
            list(pool.map(one, requests))
        app.state.proxy.writer.flush(60)
    atomic_write_json(ids_path, kinds)
    sent = {k: sum(r.kind == k for r in requests) for k in KIND_NAMES}
    return {
        **client.usage,
        "seconds": round(time.perf_counter() - t0, 1),
        "requests_by_kind": sent,
        "right_first_by_kind": right,
    }


def heldout_scores(home: Path, run: Run) -> dict[str, Any]:
    """The held-out items through a proxy of the deployment that logs apart (the nights never
    read them): as deployed, with the adopted skills, routing and adapter. Per kind, each
    item's hard score (None: the request failed) and the accuracy with its 95% interval."""
    import httpx

    from selftaught.sleep.adoption.skill_units import adopted_skills
    from selftaught.sleep.paths import read_adopted

    def one(r: Request) -> tuple[Request, float | None]:
        try:
            reply = converse(client, r, r.opening(), run.deployment.key_for(r.index)).reply
        except httpx.HTTPError:
            return r, None
        return r, float(r.passes(reply))

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=run.root) as tmp:
        proxy = run.proxy(home, log_path=Path(tmp) / "heldout.db")
        with proxy as (url, _), concurrent.futures.ThreadPoolExecutor(run.args.concurrency) as pool:
            client = common.ProxyClient(url, run.args.max_tokens)
            scored = list(pool.map(one, run.stream.heldout))
    items = {k: {r.id: s for r, s in scored if r.kind == k} for k in KIND_NAMES}
    adopted = read_adopted(common.PROJECT, home)
    return {
        "kinds": {k: common.accuracy(v) for k, v in items.items()},
        "all": common.accuracy({r.id: s for r, s in scored}),
        "items": items,
        "adopted": {
            "version": adopted.version or "0",
            "adapter": adopted.adapter is not None,
            "skills": {s.name: s.version for s in adopted_skills(common.PROJECT, home)},
        },
        "requests": client.usage["requests"],
        "seconds": round(time.perf_counter() - t0, 1),
    }


def night_settings(name: str, args: argparse.Namespace, home: Path) -> Any:
    """The configuration's night (`NightConfig`); raises ConfigError where the code cannot
    build it (the configuration needs a feature that is missing)."""
    training = common.night_training(args)
    weights = args.weights if name in WEIGHT_CONFIGS else "off"
    if name == "default":
        return common.night_config(args, home, training, weights=weights)
    if name == "skills":
        return common.night_config(args, home, training, weights=weights, many_skills=True)
    if name in ADAPTER_CONFIGS:  # an adapter per kind, or one shared: sft unless --weights
        weights = args.weights if args.weights != "off" else "sft"
        return common.night_config(args, home, training, weights=weights, many_skills=True,
                                   skill_adapters=ADAPTER_CONFIGS[name])  # fmt: skip
    if name == "gepa-style":  # one prompt, re-optimized on tonight's data; no per-kind veto
        gate = replace(training.gate, tag_alpha=None, tag_margin=None)
        return common.night_config(args, home, replace(training, gate=gate), recall_max=0)
    if name == "ace-style":  # a playbook that only grows, nothing gated
        playbook = replace(
            training, gate=GateConfig(accept_all=True), edit_ops=("append",), demos_max=0
        )
        return common.night_config(args, home, playbook, recall_max=0)
    raise ConfigError(f"unknown configuration {name!r}")


def mined_by_kind(
    night_dir: Path | None, kinds: Mapping[str, str]
) -> dict[str, dict[str, int]] | None:
    """The night's tasks (tasks.jsonl) per kind and split, a task's kind that of the rows it
    came from (`?`: none known), recalled ones also counted apart; None when the night wrote
    no task list (too few tasks: they wait for the next night)."""
    path = night_dir / "tasks.jsonl" if night_dir else None
    if path is None or not path.exists():
        return None
    out = {k: {"train": 0, "val": 0, "test": 0, "recalled": 0} for k in (*KIND_NAMES, "?")}
    for line in path.read_text(encoding="utf-8").splitlines():
        task = json.loads(line)
        kind = next((kinds[s] for s in task.get("sources") or () if s in kinds), "?")
        split = task.get("split")
        if split in ("train", "val", "test"):
            out[kind][split] += 1
        out[kind]["recalled"] += bool(task.get("recalled"))
    return out


def learn(name: str, k: int, home: Path, run: Run) -> dict[str, Any]:
    """Night `k` of one configuration: its traffic, then the night (`sleep run
    --auto-adopt`)."""
    from selftaught.sleep.night.cycle import run_night

    traffic = send_traffic(home, run, run.stream.nights[k - 1])
    t0 = time.perf_counter()
    (night,) = run_night(night_settings(name, run.args, home), models=run.models)
    report = night.report_dict()
    mining = report.get("mining") or {}
    row = common.night_row(k, report)
    row.update(
        traffic=traffic,
        night_s=round(time.perf_counter() - t0, 1),
        mining={key: mining.get(key) for key in ("read", "tasks", "by_check", "dropped")},
        signals=(mining.get("conversation") or {}).get("signals"),
        mined=mined_by_kind(night.night_dir, read_json(home / IDS_FILE)),
        skills=[
            {"name": s.get("name"), "status": s.get("status"), "why": s.get("why")}
            for s in report.get("skills") or ()
        ],
        kinds_report=report.get("kinds"),  # the night's own per-kind report, where it has one
    )
    row["notes"] = unread_kinds(row)
    return row


def unread_kinds(row: Mapping[str, Any]) -> list[str]:
    """A kind that had traffic tonight but gave the night no task, said plainly."""
    if row["mined"] is None:
        tasks = row["mining"].get("tasks")
        return [f"no task list tonight ({row['status']}): {tasks} tasks in all, kinds unknown"]
    notes = []
    for kind, sent in row["traffic"]["requests_by_kind"].items():
        mined = row["mined"][kind]
        if sent and not sum(mined[s] for s in ("train", "val", "test")) - mined["recalled"]:
            notes.append(f"{kind}: {sent} requests, no task mined from them tonight")
    return notes


def run_config_night(name: str, k: int, run: Run, entry: dict[str, Any]) -> None:
    """Night `k` of one configuration, then its held-out evaluation; `none` only answers the
    held-out set again."""
    home = run.root / name
    t0 = time.perf_counter()
    row = {"night": k, "status": "no learning"} if name == "none" else learn(name, k, home, run)
    row["heldout"] = heldout_scores(home, run)
    row["wall_s"] = round(time.perf_counter() - t0, 1)
    night_calls = sum(int(u.get("calls") or 0) for u in (row.get("night_usage") or {}).values())
    row["calls"] = {
        "traffic": (row.get("traffic") or {}).get("requests", 0),
        "night": night_calls,
        "heldout": row["heldout"]["requests"],
    }
    row["load"] = [round(x, 2) for x in os.getloadavg()]
    entry["nights"].append(row)
    common.snapshot_state(home, k)
    acc = " ".join(f"{kind} {h['hard']:.2f}" for kind, h in row["heldout"]["kinds"].items())
    print(
        f"[{name}] night {k}: {row['status']} · held-out {acc}",
        *row.get("notes", ()),
        sep="\n    ",
        flush=True,
    )


# ---- the summary ------------------------------------------------------------------------


def retention(items: Sequence[Mapping[str, float | None]]) -> dict[str, Any] | None:
    """The last night's items against the best earlier night's (its highest accuracy, the
    earliest on ties), paired on the same items: wins, losses, the two-sided exact sign test
    (exact McNemar). `forgot`: more losses than wins at p < 0.05."""
    if len(items) < 2:
        return None
    earlier = [common.accuracy(x)["hard"] for x in items[:-1]]
    best = max(range(len(earlier)), key=lambda i: (earlier[i], -i))
    paired = common.compare_paired(items[best], items[-1])
    forgot = paired["losses"] > paired["wins"] and paired["p_two_sided"] < 0.05
    return {
        "best_night": best,
        "best": earlier[best],
        "final": common.accuracy(items[-1])["hard"],
        **paired,
        "forgot": forgot,
    }


def summarize(entry: Mapping[str, Any]) -> dict[str, Any]:
    """Per kind: start, final, retention and gain; the mean gain over kinds; calls and wall
    time per night."""
    rows = entry["nights"]
    kinds = {}
    for kind in KIND_NAMES:
        series = [row["heldout"]["items"][kind] for row in rows]
        start, final = (common.accuracy(series[i])["hard"] for i in (0, -1))
        kinds[kind] = {
            "start": start,
            "final": final,
            "gain": round(final - start, 6),
            "retention": retention(series),
        }
    gains = [v["gain"] for v in kinds.values()]
    forgotten = [k for k, v in kinds.items() if (v["retention"] or {}).get("forgot")]
    return {
        "nights": len(rows) - 1,
        "kinds": kinds,
        "mean_gain": round(sum(gains) / len(gains), 6),
        "forgotten": forgotten,
        "night_s": [r.get("night_s") for r in rows[1:]],
        "wall_s": [r.get("wall_s") for r in rows[1:]],
        "calls": [r.get("calls") for r in rows[1:]],
    }


# ---- the run ----------------------------------------------------------------------------


def start_config(name: str, run: Run, results: dict[str, Any]) -> dict[str, Any] | None:
    """A configuration's entry, night 0 measured (the same base deployment for all: measured
    once, copied); None when the code cannot build its night, said in the results."""
    home = run.root / name
    configs = results["configs"]
    if name in configs:
        return None if configs[name].get("unavailable") else configs[name]
    try:
        settings = {} if name == "none" else night_settings(name, run.args, home).to_dict()
    except ConfigError as err:
        configs[name] = {"unavailable": f"needs what the code lacks: {err}", "nights": []}
        print(f"[{name}] unavailable: {err}", flush=True)
        return None
    home.mkdir(parents=True, exist_ok=True)
    first = next((c["nights"][0] for c in configs.values() if c["nights"]), None)
    start = first or {"night": 0, "heldout": heldout_scores(home, run)}
    configs[name] = {"night_settings": settings, "nights": [start]}
    common.snapshot_state(home, 0)
    return configs[name]


def run_stream(run: Run, results: dict[str, Any], save: Callable[[], None]) -> None:
    """Night by night, every configuration in turn (so a sitting ends with all of them at the
    same night); after a kill, each resumes after its last completed night."""
    names = [c for c in run.args.configs.split(",") if c]
    restored: set[str] = set()
    for k in range(1, len(run.stream.nights) + 1):
        for name in names:
            entry = start_config(name, run, results)
            save()
            if entry is None or len(entry["nights"]) > k:
                continue
            if name not in restored:  # a night killed half way left traffic behind
                common.resume_state(run.root / name, k - 1)
                restored.add(name)
            run_config_night(name, k, run, entry)
            entry["summary"] = summarize(entry)
            save()


def run_settings(args: argparse.Namespace) -> dict[str, Any]:
    """What a resumed run must match."""
    keys = (
        "target",
        "optimizer_model",
        "deployment",
        "configs",
        "seed",
        "nights",
        "requests_per_night",
        "heldout",
        "max_tokens",
        "analyst_max_tokens",
        "epochs",
        "batch_size",
        "min_val",
        "documents",
        "weights",
        "max_steps",
        "max_train_seconds",
        "preferences",
        "single_kind",
        "quick",
        "report",
    )
    return {k: getattr(args, k) for k in keys}


def new_results(args: argparse.Namespace, stream: Stream) -> dict[str, Any]:
    return {
        "benchmark": "stream",
        "issue": 62,
        "settings": run_settings(args),
        "command": common.command_line(),
        "machine": common.machine_info(),
        "code": code_state(),
        "settings_commit": getattr(args, "settings_commit", None),  # a reported run's
        "kinds": {
            k: {"about": v.about, "check": v.check, "feedback": list(v.feedback)}
            for k, v in KINDS.items()
        },
        "schedule": [{"night": k, "requests": c} for k, c in enumerate(stream.counts, 1)],
        "deployment": asdict(DEPLOYMENTS[args.deployment]),
        "configs": {},
    }


def load_results(path: Path, args: argparse.Namespace, stream: Stream) -> dict[str, Any]:
    """The saved results to go on from, or a fresh start (`--fresh`, or no file)."""
    state = path.with_suffix(".state")
    if path.exists() and not args.fresh:
        saved: dict[str, Any] = read_json(path)
        if saved.get("settings") != run_settings(args):
            raise SystemExit(f"{path} holds a run with other settings: --fresh starts over")
        print(f"resuming {path}", flush=True)
        return saved
    shutil.rmtree(state, ignore_errors=True)
    return new_results(args, stream)


def output_path(args: argparse.Namespace) -> Path:
    name = f"stream_{'report_' if args.report is not None else ''}{slug(args.target)}"
    name += f"_{args.deployment}"
    name += f"_single-{args.single_kind}" if args.single_kind else ""
    name += f"_seed{args.seed}" if args.report is not None else ""
    name += f"_rerun{args.rerun}" if args.rerun else ""
    return args.output or common.RESULTS / f"{name}{'_quick' if args.quick else ''}.json"


def apply_report_settings(args: argparse.Namespace) -> None:
    """`--report SEED`: every setting from report_settings_stream.json (refused until it is
    frozen), the target among its runs, the seed among its report seeds."""
    from protocol import check_round_commit, settings_commit

    frozen = read_json(SETTINGS_FILE)
    if not (frozen.get("frozen") or {}).get("date"):
        raise SystemExit(f"{SETTINGS_FILE.name} is not frozen yet: set frozen.date, commit it")
    args.settings_commit = settings_commit(SETTINGS_FILE)  # refuses uncommitted settings
    check_round_commit(frozen)  # a `code_tag`, where the file names one
    if args.report not in frozen["report_seeds"]:
        raise SystemExit(
            f"--report {args.report} is not among the report seeds {frozen['report_seeds']}"
        )
    run = next((r for r in frozen["runs"] if r["target"] == args.target), None)
    if run is None:
        targets = ", ".join(r["target"] for r in frozen["runs"])
        raise SystemExit(f"--target {args.target} is not a reported run's; those are {targets}")
    if args.single_kind:  # the 0.8x target's streams: one kind each, the same size
        single = frozen["single_kind"]
        if args.single_kind not in single["kinds"]:
            raise SystemExit(f"--single-kind {args.single_kind} is not a reported stream's")
        run = {**run, "configs": single["configs"]}
    for key, value in {**frozen["settings"], **run}.items():
        setattr(args, key, ",".join(value) if isinstance(value, list) else value)
    args.seed = args.report


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    names = [c for c in args.configs.split(",") if c]
    unknown = [c for c in names if c not in ALL_CONFIGS]
    if unknown or not names:
        p.error(f"unknown config(s) {unknown}; valid: {', '.join(ALL_CONFIGS)}")
    if args.single_kind and args.single_kind not in KIND_NAMES:
        p.error(f"--single-kind must be one of {', '.join(KIND_NAMES)}")
    if not 1 <= args.nights <= (len(QUICK_NIGHTS) if args.quick else len(SCHEDULE)):
        p.error(f"--nights must be 1 to {len(SCHEDULE)} (the drift table's nights)")
    if args.report is None and args.seed in read_json(SETTINGS_FILE)["report_seeds"]:
        p.error(f"seed {args.seed} is a report seed: run it with --report {args.seed}, once")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="2 nights, tiny sizes: a smoke test")
    common.add_deployment_options(p, max_tokens=64)
    p.add_argument("--deployment", default="person", choices=sorted(DEPLOYMENTS))
    p.add_argument("--configs", default=",".join(CONFIGS), help=", ".join(ALL_CONFIGS))
    p.add_argument("--single-kind", default=None, help="a stream of this kind alone")
    p.add_argument("--weights", default="off", help="default / skills: off | sft | dpo | auto")
    p.add_argument("--nights", type=int, default=len(SCHEDULE))
    p.add_argument("--requests-per-night", type=int, default=16)
    p.add_argument("--heldout", type=int, default=20, help="held-out items per kind")
    p.add_argument("--seed", type=int, default=0, help="a dev seed (never a report seed)")
    p.add_argument(
        "--report",
        type=int,
        default=None,
        metavar="SEED",
        help="a reported run: settings and seed from report_settings_stream.json",
    )
    p.add_argument("--rerun", type=int, default=0, help="with --report: re-run N, a row beside")
    args = p.parse_args(argv)
    if args.report is not None:
        apply_report_settings(args)
    if args.quick:
        args.nights, args.requests_per_night, args.heldout = len(QUICK_NIGHTS), 8, 2
        args.max_tokens, args.analyst_max_tokens, args.min_val = 32, 64, 2
        args.documents, args.batch_size = "skill", 8
    check_args(p, args)
    return args


def main(argv: Sequence[str] | None = None) -> Path:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    output = output_path(args)
    if args.report is not None and output.exists() and not args.fresh:
        saved = read_json(output)
        if saved.get("complete"):
            raise SystemExit(f"{output} is a complete reported run: --rerun N adds one beside")
    stream = make_stream(args)
    results = load_results(output, args, stream)
    root = output.with_suffix(".state")
    root.mkdir(parents=True, exist_ok=True)
    deployment = DEPLOYMENTS[args.deployment]
    if deployment.users:
        atomic_write_json(root / "client_keys.json", deployment.keys())
    models = common.load_night_models(args.target, args.optimizer_model)
    run = Run(args, stream, deployment, models, root)

    def save() -> None:
        atomic_write_json(output, results)

    t0 = time.perf_counter()
    run_stream(run, results, save)
    results["wall_s"] = round(results.get("wall_s", 0) + time.perf_counter() - t0, 1)
    results["complete"] = all(
        c.get("unavailable") or len(c["nights"]) == args.nights + 1
        for c in results["configs"].values()
    )
    save()
    print(
        json.dumps(
            {
                k: (v.get("summary") or {}).get("mean_gain", v.get("unavailable"))
                for k, v in results["configs"].items()
            },
            indent=2,
        )
    )
    print(f"results: {output}")
    return output


if __name__ == "__main__":
    main()
