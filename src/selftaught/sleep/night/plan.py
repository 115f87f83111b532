"""Before a night: what it would cost (`selftaught sleep plan`, `sleep run --plan`).

The night's model-free phases run for real on the log, as the night would run them: the window
(the caps, each client's share), the threads and the signals the rules read, mining, recall,
the split and the kinds of request. What needs a model is counted from the configuration:

- the miner: the rows it would be shown and the next turns it would read, counted by running
  the miner's own choice with a stand-in that answers "cannot check" (no model is called), each
  call with one possible repair;
- weak labels and dreams: their caps;
- the skill and memory phases (`skill.plan.run_calls`): the starting skill's val replay
  (exact), then per step the train attempts, the analyst's reflections, merges and repairs,
  and each candidate's val replays; the test replays (outside the budget);
- the demo modes, leave-one-out (`--leave-one-out` trials), the weight phase: their val
  replays; a judge scores every replay of a task checked by a rubric (one repair each).

With a coding agent as the target each replay is a run of the agent. Every count but the
baselines and the miner's rows is an upper bound (`PhaseCalls.bound`). Tokens are estimates:
a replay's prompt and reply from the logged traffic (the reply capped at `--max-tokens`), a
model-written reply at its cap. Wall time: a local model's tokens at this machine's raw decode
rate (`selftaught doctor`'s measure), a remote one's calls at the traffic's logged latency,
`--concurrency` at a time. USD at the price table's rates (`models/usage.py`); a model without
a known price is said to be unpriced, never guessed. The smallest gain the gate could accept
on the planned val is the gate's own (`gate.smallest_accepted_gain`).

`sleep run`, `dry-run` and `api.sleep_night` with a budget refuse before any call when it
cannot cover the least a night spends to gate one candidate: the miner's rows, the starting
skill's val replay, one step's train attempts, one analyst call and the candidate's val replay
(`refuse_short_budget`; the night itself does not plan: this module sits above it).
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

from selftaught import prompts
from selftaught.demos import split_skill
from selftaught.errors import ConfigError, SelftaughtError
from selftaught.gate import SmallestGain, gate_power, smallest_accepted_gain
from selftaught.models.base import AsyncChatModel, Completion, GenerationParams, Message
from selftaught.models.raw_rate import RawRate
from selftaught.models.spec import parse_model_spec
from selftaught.models.usage import (
    LOCAL_PREFIX,
    PRICES_PER_MTOK,
    Budget,
    TrackedModel,
    UsageLedger,
    price_name,
    reports_cost,
)
from selftaught.progress_lines import duration
from selftaught.retrieval import available as retrieval_available
from selftaught.skill.plan import RunCalls, Sizes, run_calls, step_batches
from selftaught.sleep.adoption import staging
from selftaught.sleep.intake.log import Interaction, TaskLog
from selftaught.sleep.kinds_file import load_kinds
from selftaught.sleep.night.agent_outcome import WorkspaceMiner, for_target
from selftaught.sleep.night.agent_replay import NOT_CHECKABLE, for_agent, is_agent
from selftaught.sleep.night.cycle import (
    MINER_OFF,
    WORKSPACE_LEFT,
    NightConfig,
    NightModels,
    is_remote,
    logged_upstream,
    mine,
    window_rows,
)
from selftaught.sleep.night.dream import paraphrasable
from selftaught.sleep.night.kinds import find_kinds
from selftaught.sleep.night.mine import MinedTask
from selftaught.sleep.night.miner import Miner
from selftaught.sleep.night.recall import combine
from selftaught.sleep.night.recall import load as load_recall
from selftaught.sleep.night.signals import rejected_signals
from selftaught.sleep.night.split import TooFewTasks, assign_splits, more_tasks_for_val
from selftaught.sleep.night.weight_night import is_local_spec
from selftaught.sleep.night.window import take_fairly
from selftaught.sleep.paths import sleep_home

CHARS_PER_TOKEN = 4
EXACT, AT_MOST = "exact", "at most"
STAND_IN = '{"cannot_check": "counted by the plan", "kind": "none"}'
"""What the miner's stand-in answers: read as "cannot check" by the miner and "none" by the
follow-up reader, so neither asks for a repair."""
JUDGE_MAX_TOKENS = 512  # LlmJudge's reply cap (`tasks/scorers.py`)
RateOf = Callable[[str], RawRate]  # a local model's spec -> this machine's raw decode rate


# ---- what the traffic says of one call ------------------------------------------------------


@dataclass(frozen=True)
class Traffic:
    """The rows a night reads, as one call: their mean prompt and reply tokens (logged, else
    their characters / 4), their mean logged latency, and the model they name most."""

    rows: int
    prompt_tokens: float
    reply_tokens: float
    latency_s: float | None
    model: str | None
    upstream: str | None = None  # what the operator's proxy forwarded the rows to

    def logged(self, spec: str) -> bool:
        """The traffic was logged on this model (its latency is the model's)."""
        return spec == self.upstream or (self.model is not None and model_name(spec) == self.model)

    @classmethod
    def of(cls, rows: Sequence[Interaction]) -> Traffic:
        prompt = [r.prompt_tokens or _chars(r.messages) for r in rows]
        reply = [r.completion_tokens or len(r.reply or "") // CHARS_PER_TOKEN for r in rows]
        latency = [r.latency_s for r in rows if r.latency_s]
        named = Counter(r.model for r in rows if r.model)
        return cls(
            rows=len(rows),
            prompt_tokens=sum(prompt) / len(rows) if rows else 0.0,
            reply_tokens=sum(reply) / len(rows) if rows else 0.0,
            latency_s=sum(latency) / len(latency) if latency else None,
            model=named.most_common(1)[0][0] if named else None,
            upstream=logged_upstream(list(rows)),
        )


def _chars(value: Any) -> int:
    return len(str(value)) // CHARS_PER_TOKEN


# ---- the night's models, as the plan sees them -------------------------------------------


@dataclass(frozen=True)
class Roles:
    """The night's models by role (specs, or the names of the models given), with what the
    target is: a coding agent (each replay a run of it), a local model (this machine)."""

    target: str
    optimizer: str
    judge: str | None = None
    miner: str | None = None
    agent: bool = False
    agent_analyst: bool = False  # the analyst is a coding agent: one run per proposal

    @classmethod
    def of(
        cls, config: NightConfig, rows: Sequence[Interaction], models: NightModels | None
    ) -> Roles:
        """From the models given, else from the config's specs (the target: the logged
        upstream when `--model` is not given, as the night does)."""
        if models is not None:
            return cls(models.target_spec, models.optimizer_spec, models.judge_spec,
                       models.miner_label(), is_agent(models.target),
                       is_agent(models.optimizer))  # fmt: skip
        target = config.model or logged_upstream(list(rows))
        if target is None:
            raise ConfigError(
                "no --model given and no proxy traffic names its upstream: pass --model (the "
                "model your agent uses, not the proxy)"
            )
        optimizer = config.optimizer_model or target
        miner = config.miner_model or optimizer
        return cls(target, optimizer, config.judge_model, None if miner == MINER_OFF else miner,
                   _agent_spec(target), _agent_spec(optimizer))  # fmt: skip

    def remote(self) -> bool:
        return any(is_remote(s) for s in (self.target, self.optimizer, self.judge, self.miner))


def _agent_spec(spec: str) -> bool:
    return parse_model_spec(spec).backend in ("claude-code", "codex", "cmd")


def model_name(spec: str) -> str:
    """The name the price table knows a model spec by (an agent keeps its spec: Claude Code
    reports its cost, `codex:MODEL` is priced as MODEL); a name that is no spec is itself."""
    try:
        parsed = parse_model_spec(spec)
    except SelftaughtError:
        return spec
    if parsed.backend == "local":
        return f"{LOCAL_PREFIX}{parsed.model or 'embedded'}"
    if parsed.backend in ("claude-code", "codex", "cmd"):
        return spec
    return parsed.model or spec


# ---- the records ----------------------------------------------------------------------------


@dataclass(frozen=True)
class PhaseCalls:
    """One role's calls in one phase: how many (`bound`: exact, or at most), the tokens
    they would take (estimates), the wall seconds and USD (None: not known, `why` says)."""

    phase: str
    role: str
    calls: int
    bound: str
    tokens_in: int
    tokens_out: int
    seconds: float | None
    usd: float | None
    note: str = ""
    outside_budget: int = 0  # of `calls`: the test replays, outside the budget


@dataclass(frozen=True)
class TaskCounts:
    """What the model-free phases found: the window, tonight's tasks by kind, trust and
    check, the split (train counting weak and dreamt tasks at their caps), the tasks a judge
    scores per split, and why the night would stop after mining (None: it would not)."""

    read: int
    waiting: int
    mined: int
    recalled: int
    by_kind: Mapping[str, int] = field(default_factory=dict)
    by_trust: Mapping[str, int] = field(default_factory=dict)
    by_check: Mapping[str, int] = field(default_factory=dict)
    dropped: Mapping[str, int] = field(default_factory=dict)
    train: int = 0
    val: int = 0
    test: int = 0
    train_only: int = 0  # weak labels and dreams at their caps (in `train`)
    judged: Sizes = Sizes(0, 0, 0)
    too_few: str | None = None


@dataclass(frozen=True)
class Minimum:
    """The least a night spends to gate one candidate (`refuse_short_budget`) in what the
    budget counts: the calls (a floor), and the prompt tokens and their USD (estimates from
    the traffic; None: a model without a known price)."""

    calls: int
    tokens: int
    usd: float | None
    parts: str


@dataclass(frozen=True)
class NightPlan:
    """One project's night, before it runs."""

    project: str
    roles: Roles
    tasks: TaskCounts
    phases: tuple[PhaseCalls, ...] = ()
    smallest_gain: SmallestGain | None = None
    power: str | None = None
    minimum: Minimum | None = None
    refusal: str | None = None
    unpriced: tuple[str, ...] = ()
    timing: str = ""
    """How the wall time was estimated (the raw rate, the logged latency)."""
    notes: tuple[str, ...] = ()

    @property
    def calls(self) -> int:
        return sum(p.calls for p in self.phases)

    @property
    def tokens_in(self) -> int:
        return sum(p.tokens_in for p in self.phases)

    @property
    def tokens_out(self) -> int:
        return sum(p.tokens_out for p in self.phases)

    @property
    def usd(self) -> float | None:
        """The night's USD at most; None when a model that is called has no known price."""
        costs = [p.usd for p in self.phases if p.calls]
        return None if any(c is None for c in costs) else sum(c or 0.0 for c in costs)

    @property
    def seconds(self) -> float | None:
        known = [p.seconds for p in self.phases if p.calls]
        return None if any(s is None for s in known) else sum(s or 0.0 for s in known)

    def to_dict(self) -> dict[str, Any]:
        totals = {
            "calls": self.calls,
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "usd": self.usd,
            "seconds": self.seconds,
        }
        return {**asdict(self), "totals": totals}


# ---- the model-free phases ------------------------------------------------------------------


class StandIn(AsyncChatModel):
    """The miner while planning: answers every call "cannot check" (`STAND_IN`), so the
    night's own choice of rows and turns to show it is counted without a model."""

    def __init__(self, name: str):
        self.name = name

    async def achat(self, messages: list[Message], params: GenerationParams) -> Completion:
        return Completion(STAND_IN, model=self.name)


@dataclass(frozen=True)
class _Found:
    """Tonight's tasks as the night would find them, and the miner's calls to find them."""

    tasks: list[MinedTask]
    splits: dict[str, list[MinedTask]] | None
    counts: TaskCounts
    miner_calls: int
    unchecked: int


def _find_tasks(
    project: str, rows: list[Interaction], config: NightConfig, roles: Roles, home: Path
) -> _Found:
    """Mine, recall, split and give kinds as the night does (`phases.mine`, `phases.split`),
    with the miner's stand-in; nothing is written."""
    remote = roles.remote()
    kept = [it for it in rows if not it.private or it.reviewed or config.allow_remote or not remote]
    mining = dataclasses.replace(config.mining, judge=roles.judge is not None)
    ledger = UsageLedger()
    miner = None
    if roles.miner is not None:
        send = config.allow_remote or not is_remote(roles.miner)
        model = TrackedModel(StandIn(roles.miner), ledger, "miner")
        miner = Miner(model, roles.miner, config.miner, send_private=send, mining=mining)
    unchecked: list[Interaction] = []
    with tempfile.TemporaryDirectory(prefix="selftaught-plan-") as scratch:  # proofs: not kept
        workspaces = WorkspaceMiner(project, home, scratch=Path(scratch))
        tasks, report = mine(kept, mining, rejected_signals(project, home), unchecked, miner,
                             workspaces)  # fmt: skip
    adopted = staging.read_adopted_files(project, home)
    pool = load_recall(project, home) if config.recall_max else []
    combined, _, _ = combine(tasks, pool, threshold=mining.near_duplicate,
                             private_ok=config.allow_remote or not remote,
                             pinned=split_skill(adopted.skill).demos)  # fmt: skip
    dropped = Counter(report.dropped)
    tonight = {id(t) for t in tasks}
    if roles.agent:  # what the target cannot be checked on, counted as the night counts it
        combined, left = for_agent(combined)
        dropped[NOT_CHECKABLE] += sum(id(t) in tonight for t in left)
    combined, left = for_target(combined, roles.agent)
    dropped[WORKSPACE_LEFT] += sum(id(t) in tonight for t in left)
    asked = ledger.to_dict().get("miner", {}).get("calls", 0)
    used = sum(id(t) in tonight for t in combined)  # tonight's (mined counts those left out)
    base = TaskCounts(read=len(rows), waiting=0, mined=len(tasks), recalled=len(combined) - used,
                      dropped={k: n for k, n in dropped.items() if n})  # fmt: skip
    try:
        splits = assign_splits(
            combined, config.split, mining.near_duplicate, seed=config.training.seed
        )
    except TooFewTasks as err:
        counts = dataclasses.replace(base, too_few=str(err))
        return _Found(combined, None, counts, asked, len(unchecked))
    find_kinds([t for s in splits.values() for t in s], load_kinds(project, home), config.kinds,
               "plan")  # fmt: skip
    return _Found(combined, splits, _counts(base, splits, tasks, config, len(unchecked)), asked,
                  len(unchecked))  # fmt: skip


def _counts(
    base: TaskCounts,
    splits: dict[str, list[MinedTask]],
    tonight: list[MinedTask],
    config: NightConfig,
    unchecked: int,
) -> TaskCounts:
    """The split's sizes (train with weak and dreamt tasks at their caps), tonight's tasks by
    kind, trust and check, and the tasks a judge scores (those checked by a rubric)."""
    train = len(splits["train"])
    weak = min(unchecked, config.weak.max_candidates, math.floor(config.weak.weak_share * train))
    extra = (weak if config.weak.k else 0) + (
        math.floor(config.dream.synthetic_share * train + 1e-9) if config.dream.n else 0
    )

    def judged(split: str) -> int:
        return sum(bool(t.state.rubric) for t in splits[split])

    return dataclasses.replace(
        base,
        by_kind=dict(Counter(t.kind or "-" for t in tonight).most_common()),
        by_trust=dict(Counter(str(t.state.trust or "none") for t in tonight)),
        by_check=dict(Counter(t.check for t in tonight)),
        train=train + extra,
        val=len(splits["val"]),
        test=len(splits["test"]),
        train_only=extra,
        judged=Sizes(judged("train"), judged("val"), judged("test")),
    )


# ---- what the model phases cost --------------------------------------------------------------


@dataclass(frozen=True)
class Costing:
    """Per-call token estimates by role, and the seconds and USD of a phase's calls."""

    config: NightConfig
    roles: Roles
    traffic: Traffic
    documents: int  # tokens of the adopted skill and memory, in every replay's prompt
    rates: Mapping[str, RawRate] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def spec(self, role: str) -> str:
        return str(getattr(self.roles, role))

    def _specs(self) -> list[str]:
        r = self.roles
        return [s for s in (r.target, r.optimizer, r.judge, r.miner) if s]

    def per_call(self, role: str) -> tuple[int, int]:
        """(prompt, reply) tokens of one call of `role` (module doc: estimates)."""
        t, training, miner = self.traffic, self.config.training, self.config.miner
        reply = int(t.reply_tokens)
        if not self.roles.agent:  # an agent's run has no cap
            reply = min(reply, training.max_tokens)
        if role == "target":
            return int(t.prompt_tokens) + self.documents, reply
        if role == "judge":
            return _template("llm_judge") + int(t.prompt_tokens) + reply, JUDGE_MAX_TOKENS
        if role == "miner":
            shown = miner.max_conversation_chars // CHARS_PER_TOKEN
            return _template("miner") + shown, miner.check_max_tokens
        item = training.max_input_chars + training.max_reply_chars + training.max_feedback_chars
        shown = training.minibatch_size * item // CHARS_PER_TOKEN
        prompt = 2 * _template("reflect_failures") + self.documents + shown
        return prompt, training.analyst_max_tokens

    def least_prompt(self, role: str) -> int:
        """The prompt tokens one call of `role` takes at the least: a replay's task and
        documents, a judge's template and task, a reflection's or a miner's template."""
        replay = int(self.traffic.prompt_tokens) + self.documents
        return {
            "target": replay,
            "judge": _template("llm_judge") + int(self.traffic.prompt_tokens),
            "miner": _template("miner"),
        }.get(role, _template("reflect_failures"))

    def seconds(self, role: str, calls: int, tokens_out: int) -> float | None:
        """A local model's reply tokens at this machine's raw rate; a remote one's calls at
        the traffic's latency (for the models the traffic was logged on), `concurrency` at a
        time."""
        spec = self.spec(role)
        if is_local_spec(spec):
            rate = self.rates.get(spec)
            return tokens_out / rate.tok_per_s if rate and rate.tok_per_s > 0 else None
        if self.traffic.latency_s is None or not self.traffic.logged(spec):
            return None
        config = self.config
        at_once = config.miner.concurrent_calls if role == "miner" else config.training.concurrency
        return math.ceil(calls / max(at_once, 1)) * self.traffic.latency_s

    def timing(self) -> str:
        """How `seconds` was estimated, in one line."""
        how = [f"{spec} at {r.tok_per_s:.1f} tok/s (this machine's raw decode rate)"
               for spec, r in self.rates.items()]  # fmt: skip
        logged = [s for s in dict.fromkeys(self._specs()) if self.traffic.logged(s)]
        if self.traffic.latency_s is not None and logged:
            at_once = self.config.training.concurrency
            how.append(f"{', '.join(logged)} at {self.traffic.latency_s:.2f} s a call (the "
                       f"traffic's logged latency), {at_once} at a time")  # fmt: skip
        if not how:
            return "time: not estimated (no logged latency, no local model measured)"
        return "time: " + "; ".join(how)

    def usd(self, role: str, tokens_in: int, tokens_out: int) -> float | None:
        """At the price table's rates; a coding agent that reports its cost at the rate of
        the model its traffic names; None: no known price."""
        name = model_name(self.spec(role))
        if name.startswith(LOCAL_PREFIX):
            return 0.0
        price = PRICES_PER_MTOK.get(price_name(name))
        if price is None and role == "target" and reports_cost(name) and self.traffic.model:
            # the agent's own traffic names the model it runs on
            price = PRICES_PER_MTOK.get(price_name(self.traffic.model))
        if price is None:
            return None
        return (tokens_in * price[0] + tokens_out * price[1]) / 1e6

    def row(self, phase: str, role: str, calls: int, bound: str, note: str = "",
            outside_budget: int = 0) -> PhaseCalls:  # fmt: skip
        tin, tout = (calls * n for n in self.per_call(role))
        seconds, usd = self.seconds(role, calls, tout), self.usd(role, tin, tout)
        return PhaseCalls(phase, role, calls, bound, tin, tout,
                          None if seconds is None else round(seconds, 2),
                          usd, note, outside_budget)  # fmt: skip


def _template(name: str) -> int:
    return len(prompts.packaged(name)) // CHARS_PER_TOKEN


def _phases(found: _Found, config: NightConfig, costing: Costing) -> list[PhaseCalls]:
    """Every model phase's calls by role, in the night's order."""
    rows: list[PhaseCalls] = []
    roles = costing.roles
    if found.miner_calls:
        note = f"{found.miner_calls} rows and turns shown; each reply may need one repair"
        rows.append(costing.row("mine", "miner", 2 * found.miner_calls, AT_MOST, note))
        if roles.judge is not None:
            rows.append(costing.row("mine", "judge", 2 * found.miner_calls, AT_MOST,
                                    "a written rubric tested on two replies"))  # fmt: skip
    if found.splits is None:
        return rows
    if config.weak.k and not roles.agent:
        asked = min(found.unchecked, config.weak.max_candidates)
        rows.append(costing.row("weak labels", "target", asked * config.weak.k, AT_MOST))
    if config.dream.n and config.dream.paraphrase:
        sources = sum(paraphrasable(t) for t in found.splits["train"])
        rows.append(costing.row("dreams", "optimizer", sources * config.dream.n, AT_MOST))
    if config.many_skills:
        costing.notes.append("--skills: each kind's own skill run is not counted yet")
        return rows
    return rows + _text_phases(found, config, costing)


def _text_phases(found: _Found, config: NightConfig, costing: Costing) -> list[PhaseCalls]:
    """The skill and memory phases, the demo modes, leave-one-out and the weight phase."""
    counts, training = found.counts, config.training
    sizes = Sizes(counts.train, counts.val, counts.test)
    training = dataclasses.replace(training, evaluate_test=counts.test > 0)
    rows: list[PhaseCalls] = []
    judge = costing.roles.judge is not None
    agent = " (each a run of the agent)" if costing.roles.agent else ""
    train = found.splits["train"] if found.splits else []
    for document in config.documents:
        demos_on = document == "skill" and training.demos_max > 0
        told = document == "memory" and any(t.state.comment for t in train)
        run = run_calls(training, sizes, demos_on=demos_on, user_edits=told,
                        agent_analyst=costing.roles.agent_analyst)  # fmt: skip
        rows += _run_rows(document, run, costing, agent)
        if judge:
            scored = run_calls(training, sizes, demos_on=demos_on, user_edits=told,
                               counted=counts.judged)  # fmt: skip
            rows += [
                costing.row(f"{document}: baseline", "judge", 2 * scored.baseline, AT_MOST,
                            "rubric tasks' replays, a repair each"),
                costing.row(document, "judge", 2 * (scored.target - scored.baseline), AT_MOST,
                            "rubric tasks' replays, a repair each", 2 * scored.test),
            ]  # fmt: skip
        if document == "skill" and training.demos_max:
            modes = 3 + (config.demo_modes.retrieval != "off" and retrieval_available())
            rows += _val_rows("demo modes", modes, counts, costing, judge, agent)
    if config.leave_one_out and not training.gate.accept_all:
        rows += _val_rows("leave-one-out", config.leave_one_out + 1, counts, costing, judge, agent)
    if config.weights != "off" and is_local_spec(costing.roles.target):
        rows += _weight_rows(config, counts, costing)
    return rows


def _run_rows(document: str, run: RunCalls, costing: Costing, agent: str) -> list[PhaseCalls]:
    steps = f"{run.steps} steps, {run.candidates_per_step} candidates a step"
    test = f"; {run.test} test replays, outside the budget" if run.test else ""
    return [
        costing.row(f"{document}: baseline", "target", run.baseline, EXACT,
                    f"the starting {document} on val{agent}"),
        costing.row(document, "target", run.target - run.baseline, AT_MOST,
                    f"{steps}: train attempts and candidates' val{test}{agent}", run.test),
        costing.row(document, "optimizer", run.analyst, AT_MOST,
                    "a run of the agent a proposal" if costing.roles.agent_analyst
                    else "reflections, merges and a repair each"),
    ]  # fmt: skip


def _val_rows(
    phase: str, evals: int, counts: TaskCounts, costing: Costing, judge: bool, agent: str
) -> list[PhaseCalls]:
    """A phase of whole-val evaluations: `evals` of them at most."""
    rows = [costing.row(phase, "target", evals * counts.val, AT_MOST,
                        f"{evals} val evaluations{agent}")]  # fmt: skip
    if judge and counts.judged.val:
        rows.append(costing.row(phase, "judge", 2 * evals * counts.judged.val, AT_MOST))
    return rows


def _weight_rows(config: NightConfig, counts: TaskCounts, costing: Costing) -> list[PhaseCalls]:
    w = config.weight_training
    adapters = 2 if config.weights == "auto" else 1
    replays = counts.train * w.samples_per_prompt
    evals = 2 + 2 * adapters  # the adopted, the text, each adapter alone and with the text
    note = (
        f"train replays, then {evals} val evaluations; training {adapters} x at most "
        f"{w.adapter_max_minutes:g} min"
    )
    return [costing.row("weights", "target", replays + evals * counts.val, AT_MOST, note)]


# ---- the plan --------------------------------------------------------------------------------


def plan_project(
    project: str,
    rows: list[Interaction],
    config: NightConfig,
    *,
    models: NightModels | None = None,
    home: Path | None = None,
    rate_of: RateOf | None = None,
    waiting: int = 0,
) -> NightPlan:
    """One project's plan over `rows` (its window); `rate_of` measures a local model's raw
    decode rate (None: its wall time is not estimated)."""
    home = home or config.home or sleep_home()
    roles = Roles.of(config, rows, models)
    take = take_fairly(rows, config.max_tasks, config.max_sessions, config.max_client_share)
    found = _find_tasks(project, take.rows, config, roles, home)
    counts = dataclasses.replace(found.counts, waiting=len(rows) - len(take.rows))
    found = dataclasses.replace(found, counts=counts)
    adopted = staging.read_adopted_files(project, home)
    notes: list[str] = []
    costing = Costing(config, roles, Traffic.of(take.rows),
                      (len(adopted.skill) + len(adopted.memory)) // CHARS_PER_TOKEN,
                      _rates(roles, rate_of, notes), notes)  # fmt: skip
    phases = tuple(_phases(found, config, costing))
    gate = config.training.gate
    power = smallest = None
    if counts.too_few is None:
        smallest = smallest_accepted_gain(counts.val, gate)
        power = _power_line(counts.val, config)
    plan = NightPlan(project, roles, counts, phases, smallest, power,
                     _minimum(found, config, costing), unpriced=_unpriced(phases, roles),
                     timing=costing.timing(), notes=tuple(costing.notes))  # fmt: skip
    return dataclasses.replace(plan, refusal=budget_refusal(plan, config.training.budget))


def _power_line(n_val: int, config: NightConfig) -> str:
    power = gate_power(n_val, config.training.gate, items="val tasks")
    line = power.line()
    missing = None if power.needed_val is None else power.needed_val - n_val
    if missing:
        more = more_tasks_for_val(missing, config.split)
        line += f"; about {more} more checked tasks of your traffic" if more else ""
    return line


def _rates(roles: Roles, rate_of: RateOf | None, notes: list[str]) -> dict[str, RawRate]:
    """This machine's raw decode rate for each local model of the night (once each); one
    that cannot be measured (the local extra missing) is noted, its time left unknown."""
    out: dict[str, RawRate] = {}
    for spec in dict.fromkeys((roles.target, roles.optimizer, roles.judge, roles.miner)):
        if not spec or not is_local_spec(spec) or rate_of is None:
            continue
        try:
            out[spec] = rate_of(spec)
        except SelftaughtError as err:
            notes.append(f"{spec}: the raw decode rate was not measured ({err})")
    return out


def _unpriced(phases: Sequence[PhaseCalls], roles: Roles) -> tuple[str, ...]:
    called = {p.role for p in phases if p.calls and p.usd is None}
    return tuple(sorted({str(getattr(roles, r)) for r in called}))


def _minimum(found: _Found, config: NightConfig, costing: Costing) -> Minimum | None:
    """The least the night spends to gate one candidate (module doc), in what the budget
    counts; None when the night would stop after mining."""
    if found.splits is None or config.many_skills or "skill" not in config.documents:
        return None
    counts, training = found.counts, config.training
    first = step_batches(counts.train, training)[:1] or [0]
    calls = {
        "miner": found.miner_calls,
        "target": 2 * counts.val + first[0],
        "optimizer": int(training.proposals > 0),
        "judge": 2 * counts.judged.val if costing.roles.judge else 0,
    }
    counted = {
        r: n
        for r, n in calls.items()
        if training.budget.roles is None or r in training.budget.roles
    }
    tokens = {r: n * costing.least_prompt(r) for r, n in counted.items()}
    usd = [costing.usd(r, tokens[r], 0) for r in counted if counted[r]]
    parts = (f"{found.miner_calls} miner calls, {counts.val} val replays of the starting skill, "
             f"{first[0]} train attempts, {calls['optimizer']} analyst call, {counts.val} val "
             "replays of the candidate")  # fmt: skip
    if calls["judge"]:
        parts += f", {calls['judge']} judge calls"
    total_usd = None if any(u is None for u in usd) else sum(u or 0.0 for u in usd)
    return Minimum(sum(counted.values()), sum(tokens.values()), total_usd, parts)


def budget_refusal(plan: NightPlan, budget: Budget) -> str | None:
    """Why `budget` cannot gate one candidate of this night, with the numbers; None: it
    can, or the night has no such minimum (it stops after mining)."""
    least = plan.minimum
    if least is None or not budget.limited:
        return None
    short = []
    if budget.calls is not None and budget.calls < least.calls:
        short.append(f"--budget-calls {budget.calls} (at least {least.calls} calls)")
    if budget.tokens is not None and budget.tokens < least.tokens:
        short.append(f"--budget-tokens {budget.tokens} (about {least.tokens} prompt tokens)")
    if budget.usd is not None and least.usd is not None and budget.usd < least.usd:
        short.append(f"--budget-usd {budget.usd:g} (about ${least.usd:.4f} for the prompts)")
    if not short:
        return None
    return (
        f"{plan.project}: {' and '.join(short)} cannot cover the starting skill's val replay "
        f"and one candidate ({least.parts}); raise it, or see the whole night with "
        f"`selftaught sleep plan --project {plan.project}`"
    )


def _windows(config: NightConfig) -> dict[str, tuple[float, list[Interaction]]]:
    """Each project's window as a night starting now would read it."""
    log = TaskLog(config.log_path)
    try:
        return window_rows(log, config, config.home or sleep_home(), time.time())
    finally:
        log.close()


def plan_night(
    config: NightConfig,
    *,
    models: NightModels | None = None,
    rate_of: RateOf | None = None,
) -> list[NightPlan]:
    """The plan of every project the night would run (`config.project`, else every project
    with traffic since its last night); reads the log and the sleep home, writes nothing."""
    home = config.home or sleep_home()
    plans = []
    for project, (_, rows) in sorted(_windows(config).items()):
        if not rows:
            quiet = TaskCounts(0, 0, 0, 0, too_few="no interactions since the last night")
            roles = Roles(config.model or "-", config.optimizer_model or config.model or "-")
            plans.append(NightPlan(project, roles, quiet))
            continue
        plans.append(plan_project(project, rows, config, models=models, home=home, rate_of=rate_of))
    return plans


def refuse_short_budget(config: NightConfig, *, models: NightModels | None = None) -> None:
    """ConfigError, before any call, when the night's budget cannot gate one candidate of a
    project it would run (`sleep run`, `api.sleep_night`); a night without a budget is not
    planned."""
    if not config.training.budget.limited:
        return
    for plan in plan_night(config, models=models):
        if plan.refusal is not None:
            raise ConfigError(plan.refusal)


# ---- shown ------------------------------------------------------------------------------------


def plan_table(plan: NightPlan) -> Table:
    """The phases as a table: calls (exact or at most), tokens, wall time, USD."""
    table = Table(title=f"{plan.project}: the night's plan", expand=False)
    for column in ("phase", "role", "calls", "tokens in", "tokens out", "time", "USD", "note"):
        table.add_column(column, overflow="fold")
    for p in plan.phases:
        calls = f"{p.calls}" if p.bound == EXACT else f"≤ {p.calls}"
        table.add_row(p.phase, p.role, calls, f"{p.tokens_in:,}", f"{p.tokens_out:,}",
                      _time(p.seconds), _usd(p.usd), p.note)  # fmt: skip
    table.add_row("total", "", f"≤ {plan.calls}", f"{plan.tokens_in:,}", f"{plan.tokens_out:,}",
                  _time(plan.seconds), _usd(plan.usd), "")  # fmt: skip
    return table


def plan_lines(plan: NightPlan) -> list[str]:
    """What the table does not hold: the window, the tasks, the gate's power, the budget."""
    t = plan.tasks
    r = plan.roles
    lines = [
        f"{plan.project}: {t.read} interactions read ({t.waiting} wait for a later night); "
        f"target {r.target}{' (a coding agent)' if r.agent else ''}, analyst {r.optimizer}, "
        f"judge {r.judge or '-'}, miner {r.miner or '-'}",
        f"tasks: {t.mined} mined tonight, {t.recalled} recalled; by kind "
        f"{_counted(t.by_kind)}; by trust {_counted(t.by_trust)}; by check {_counted(t.by_check)}",
    ]
    if t.too_few is not None:
        return [*lines, f"the night would stop after mining: {t.too_few}"]
    extra = f" ({t.train_only} weak or dreamt at most)" if t.train_only else ""
    lines.append(f"split: {t.train} train{extra}, {t.val} val, {t.test} test")
    if plan.power:
        lines.append(plan.power)
    if plan.timing:
        lines.append(plan.timing)
    if plan.unpriced:
        lines.append(f"no known price for {', '.join(plan.unpriced)}: USD not estimated")
    if plan.minimum is not None:
        m = plan.minimum
        usd = f", ${m.usd:.4f}" if m.usd is not None else ""
        lines.append(f"to gate one candidate: at least {m.calls} calls; about {m.tokens:,} "
                     f"prompt tokens{usd} ({m.parts})")  # fmt: skip
    if plan.refusal:
        lines.append(f"REFUSED: {plan.refusal}")
    return [*lines, *plan.notes]


def _counted(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {n}" for k, n in counts.items()) or "-"


def _time(seconds: float | None) -> str:
    return "?" if seconds is None else duration(seconds)


def _usd(usd: float | None) -> str:
    return "?" if usd is None else f"${usd:.4f}"
