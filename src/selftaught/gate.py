"""The validation gate: one pure function, for both spaces, deciding from per-example val
scores whether a candidate (a skill, a ReST round's model, a GRPO-trained model, a night's
proposal) replaces the current one and/or the best (shipped) one.

Why a margin: on 20-40 val items a strict `>` accepts noise (measured on peers: a +1 item
"gain" shipped an edit that cost 16 test points). By default a new best must solve MORE THAN
ONE extra val item (net, in metric units); `--gate-margin 0` restores the strict `>`, and
`--gate-confidence C` additionally requires a one-sided paired test (exact sign test on the
hard metric, paired bootstrap otherwise) with p <= 1 - C. One-sided on purpose: a gate asks
"is the candidate better?" and keeps it only then. A table that reports two systems asks "do
they differ?", a two-sided question (`stats.sign_test_two_sided`), which the gate never asks.

Per-tag veto (opt-in, `tag_alpha` / `tag_margin`): examples may carry tags in
`Example.state["tags"]` (a task family, a cluster, a mined intent). A candidate that loses the
items of one tag beyond that tag's noise (a one-sided paired sign test for a loss on the tag's
items at `tag_alpha`, or more than `tag_margin` net items lost) is rejected even when its total
rises, and the reason names the tag: a total gain bought by collapsing one kind of request is
not a gain.

Decisions:
  accept_new_best  the candidate beats the best by the margin (and test): it becomes both
                   the current and the best (shipped) candidate.
  accept           not proven better than the best, but not worse than the current one
                   (ties allowed when `accept_ties`): training may continue from it; the
                   best is unchanged, so an unproven change is never shipped.
  reject           worse than the current one, or not evaluable (e.g. a skill's edits go to
                   the rejected buffer that the analyst sees next time).

`accept_all` turns the gate off (`sleep run --gate off`, SkillOpt-Sleep's greedy ablation):
every candidate becomes the new best whatever its val score; the scores and the reason are
still reported, so a run without a gate shows what it let through.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from selftaught.errors import ConfigError
from selftaught.stats import paired_bootstrap_pvalue, sign_test_pvalue
from selftaught.tasks.base import Example, Score

Metric = Literal["hard", "soft", "mixed"]
METRICS: tuple[str, ...] = ("hard", "soft", "mixed")
Decision = Literal["accept_new_best", "accept", "reject"]
COSTS: tuple[str, ...] = ("tokens", "latency", "usd")  # what a cost objective may name
COST_TIE_SAVING = 0.05
"""A tie on score goes to the candidate only when it costs at least this share less per item
than the best: a saving within measurement noise is not a reason to change what ships."""


@dataclass(frozen=True)
class GateConfig:
    """The one gate's settings (skills, rounds, GRPO runs and nights alike)."""

    metric: Metric = "hard"
    """Gate metric: hard | soft | mixed."""
    margin: float = 1.0
    """A new best must gain MORE than this many val items (0 = strict >)."""
    confidence: float | None = None
    """Also require a one-sided paired test with p <= 1 - C (e.g. 0.9; 0: none)."""
    accept_ties: bool = True
    """Let the current skill move to an equal-scoring candidate."""
    mixed_weight: float = 0.5
    """The mixed metric is w * hard + (1 - w) * soft."""
    max_missing: float = 0.1
    """Reject when more val rollouts than this share errored."""
    accept_all: bool = False
    """Gate off: accept every candidate as the new best (greedy)."""
    tag_alpha: float | None = None
    """Per-tag no-regression veto (off when None): reject a candidate that loses the val items
    of one tag (`Example.state["tags"]`) with a one-sided paired sign test p <= this against
    the skill it would replace, even when its total rises; e.g. 0.1."""
    tag_margin: float | None = None
    """Per-tag no-regression veto by a margin (off when None): reject a candidate that loses
    more than this many net val items of one tag against the skill it would replace."""
    objective: tuple[str, ...] = ("score",)
    """What a new best is chosen on: score, or score then one cost measured per val item
    (score,tokens | score,latency | score,usd): a candidate within noise of the best (no net
    val loss, not past the margin) that costs at least 5% less per item becomes the best."""
    min_gain: float | None = None
    """The smallest true gain the run looks for, as a share of val items (e.g. 0.05): said
    before the first model call with the val size it needs at this gate; `--val-size auto`
    picks that size; a night says how many more tasks it needs. Changes no decision (unset:
    the statement names a gain of 0.05)."""

    @property
    def tag_veto(self) -> bool:
        return self.tag_alpha is not None or self.tag_margin is not None

    @property
    def cost(self) -> str | None:
        """The cost a tie on score is broken by (`objective`'s second part; None: none)."""
        return self.objective[1] if len(self.objective) > 1 else None

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ConfigError(
                f"gate metric must be one of {', '.join(METRICS)}, got {self.metric!r}"
            )
        if self.margin < 0:
            raise ConfigError(f"gate margin must be >= 0, got {self.margin}")
        if self.confidence is not None and not 0.5 <= self.confidence < 1.0:
            raise ConfigError(f"gate confidence must be in [0.5, 1), got {self.confidence}")
        if not 0.0 <= self.mixed_weight <= 1.0:
            raise ConfigError(f"mixed weight must be in [0, 1], got {self.mixed_weight}")
        if not 0.0 <= self.max_missing <= 1.0:
            raise ConfigError(f"max_missing must be in [0, 1], got {self.max_missing}")
        if self.tag_alpha is not None and not 0.0 < self.tag_alpha < 1.0:
            raise ConfigError(f"gate tag_alpha must be in (0, 1), got {self.tag_alpha}")
        if self.tag_margin is not None and self.tag_margin < 0:
            raise ConfigError(f"gate tag_margin must be >= 0, got {self.tag_margin}")
        objective = tuple(self.objective)
        if (
            objective[:1] != ("score",)
            or len(objective) > 2
            or not set(objective[1:]) <= set(COSTS)
        ):
            raise ConfigError(
                f"gate objective is score, or score and one of {', '.join(COSTS)} "
                f"(e.g. score,tokens), got {','.join(objective)!r}"
            )
        object.__setattr__(self, "objective", objective)  # a list given reads as the tuple
        if self.min_gain is not None and not 0.0 < self.min_gain <= 1.0:
            raise ConfigError(
                f"min_gain is a share of val items in (0, 1] (0.05: five points), "
                f"got {self.min_gain}"
            )


def metric_value(
    score: Score | Mapping[str, float], metric: Metric, mixed_weight: float = 0.5
) -> float:
    hard = score.hard if isinstance(score, Score) else float(score["hard"])
    soft = score.soft if isinstance(score, Score) else float(score["soft"])
    if metric == "hard":
        return float(hard)
    if metric == "soft":
        return float(soft)
    return mixed_weight * hard + (1.0 - mixed_weight) * soft


ValScores = Mapping[str, float | None]  # example id -> metric value (None: backend error)


@dataclass
class GateResult:
    decision: Decision
    reason: str
    candidate: float  # mean metric over the val examples scored for every skill compared
    current: float
    best: float
    gain_vs_best: float  # net gain in items (sum of metric), on paired examples
    gain_vs_current: float
    pvalue: float | None = None
    n_paired: int = 0
    n_missing: int = 0
    tag_losses: list[dict[str, Any]] = field(default_factory=list)  # the per-tag veto's finds

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GateResult:
        """Back from `to_dict()` (a run's history row, state or result); a number an older
        row did not store reads as 0."""
        pvalue = d.get("pvalue")
        return cls(
            decision=d.get("decision") or "reject",
            reason=str(d.get("reason") or ""),
            candidate=float(d.get("candidate") or 0.0),
            current=float(d.get("current") or 0.0),
            best=float(d.get("best") or 0.0),
            gain_vs_best=float(d.get("gain_vs_best") or 0.0),
            gain_vs_current=float(d.get("gain_vs_current") or 0.0),
            pvalue=None if pvalue is None else float(pvalue),
            n_paired=int(d.get("n_paired") or 0),
            n_missing=int(d.get("n_missing") or 0),
            tag_losses=[dict(t) for t in d.get("tag_losses") or []],
        )


def _paired(a: ValScores, b: ValScores) -> tuple[list[float], list[float]]:
    pairs = [(x, y) for i, x in a.items() if x is not None and (y := b.get(i)) is not None]
    return [float(x) for x, _ in pairs], [float(y) for _, y in pairs]


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


@dataclass(frozen=True)
class Paired:
    """`new` against `old` per item, on the items both scored: wins, losses, ties and the
    one-sided exact sign test p of the wins (ties do not count)."""

    wins: int
    losses: int
    ties: int
    sign_test_p: float

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "sign_test_p": round(self.sign_test_p, 6)}


def paired_comparison(new: ValScores, old: ValScores) -> Paired:
    """The one paired win/loss count (the gate's sign test, a run's test split, a night's
    proposal): per-item scores of two skills, None where an item was not scored."""
    a, b = _paired(new, old)
    wins = sum(1 for x, y in zip(a, b, strict=True) if x > y)
    losses = sum(1 for x, y in zip(a, b, strict=True) if x < y)
    return Paired(wins, losses, len(a) - wins - losses, sign_test_pvalue(wins, losses))


def _pvalue(new: ValScores, old: ValScores, metric: Metric) -> float:
    if metric == "hard":
        return paired_comparison(new, old).sign_test_p
    return paired_bootstrap_pvalue(*_paired(new, old))


Costs = tuple[float | None, float | None]  # (candidate, best) per item, in `cfg.cost`'s unit


def gate(
    candidate: ValScores,
    current: ValScores,
    best: ValScores,
    cfg: GateConfig,
    tags: Tags | None = None,
    costs: Costs | None = None,
) -> GateResult:
    """Decide on `candidate` given per-example val scores of the current and best skills;
    `tags` (example id -> its tags) feeds the per-tag veto when the config turns it on; `costs`
    (what the candidate and the best spend per val item, in the objective's cost) break a tie
    on score when the objective names a cost."""
    result = _decide(candidate, current, best, cfg)
    if cfg.cost is not None and costs is not None and result.decision != "reject":
        _cheaper_tie(result, cfg, costs)
    if cfg.tag_veto and tags and result.decision != "reject" and not cfg.accept_all:
        replaced = best if result.decision == "accept_new_best" else current
        _veto_tags(result, tag_regressions(candidate, replaced, tags, cfg))
    return result


def _decide(
    candidate: ValScores, current: ValScores, best: ValScores, cfg: GateConfig
) -> GateResult:
    """The total's verdict: margin and paired test against the best, ties with the current."""
    n = len(candidate)
    missing = sum(1 for v in candidate.values() if v is None)
    cb, bb = _paired(candidate, best)
    cc, cur = _paired(candidate, current)
    gain_best = sum(cb) - sum(bb)
    gain_cur = sum(cc) - sum(cur)
    result = GateResult(
        decision="reject",
        reason="",
        candidate=_mean(cb),
        current=_mean(cur),
        best=_mean(bb),
        gain_vs_best=round(gain_best, 6),
        gain_vs_current=round(gain_cur, 6),
        n_paired=len(cb),
        n_missing=missing,
    )
    if cfg.accept_all:
        result.decision = "accept_new_best"
        result.reason = f"gate off: accepted unchecked ({gain_best:+g} items vs best on val)"
        return result
    if n == 0 or not cb:
        result.reason = "no val example could be scored"
        return result
    if missing > cfg.max_missing * n:
        result.reason = f"{missing}/{n} val rollouts failed (backend errors); not evaluable"
        return result
    eps = 1e-9
    beats_best = gain_best > cfg.margin + eps
    if beats_best and cfg.confidence is not None:
        result.pvalue = _pvalue(candidate, best, cfg.metric)
        if result.pvalue > 1.0 - cfg.confidence + eps:
            beats_best = False
            test_note = f"; paired test p={result.pvalue:.3f} > {1 - cfg.confidence:.3f}"
        else:
            test_note = f"; paired test p={result.pvalue:.3f}"
    else:
        test_note = ""
    if beats_best:
        result.decision = "accept_new_best"
        result.reason = f"beats best by {gain_best:+g} items (> margin {cfg.margin:g}){test_note}"
    elif gain_cur > eps or (cfg.accept_ties and gain_cur >= -eps):
        result.decision = "accept"
        result.reason = (
            f"{gain_cur:+g} items vs current, {gain_best:+g} vs best "
            f"(new best needs > {cfg.margin:g}){test_note}"
        )
    else:
        result.reason = f"{gain_cur:+g} items vs current{test_note}"
    return result


def _cheaper_tie(result: GateResult, cfg: GateConfig, costs: Costs) -> None:
    """A candidate within noise of the best on score (no net val loss, not past the margin)
    that costs at least `COST_TIE_SAVING` less per item becomes the best: two skills the val
    cannot tell apart, the cheaper ships. No net loss, so a chain of ties never walks the
    score down."""
    new, old = costs
    if result.decision == "accept_new_best" or new is None or old is None or old <= 0:
        return
    if result.gain_vs_best < -1e-9 or new > old * (1.0 - COST_TIE_SAVING) + 1e-12:
        return
    saving = 1.0 - new / old
    result.decision = "accept_new_best"
    result.reason = (
        f"ties the best within noise ({result.gain_vs_best:+g} items, new best needs "
        f"> {cfg.margin:g}) and costs {saving:.0%} less {cfg.cost} per item "
        f"({new:.4g} vs {old:.4g})"
    )


Tags = Mapping[str, Sequence[str]]  # example id -> its tags


def example_tags(examples: Iterable[Example]) -> dict[str, tuple[str, ...]]:
    """Each example's tags, from `Example.state["tags"]` (a string or a list of strings;
    examples without tags are left out)."""
    out: dict[str, tuple[str, ...]] = {}
    for ex in examples:
        raw = ex.state.get("tags") if isinstance(ex.state, Mapping) else None
        if raw is None:
            continue
        found = (raw,) if isinstance(raw, str) else tuple(str(t) for t in raw)
        if found:
            out[ex.id] = found
    return out


def gate_tags(examples: Iterable[Example], cfg: GateConfig) -> dict[str, tuple[str, ...]]:
    """The val examples' tags for `gate`, checked once before a run: a veto asked for on
    examples that carry no tag would silently never fire, so it is refused."""
    examples = list(examples)
    tags = example_tags(examples)
    if cfg.tag_veto and examples and not tags:
        raise ConfigError(
            "the gate's per-tag veto (tag_alpha / tag_margin) needs tagged val examples; "
            'none has `tags` in its state (a JSONL line takes "tags": ["family", ...])'
        )
    return tags


@dataclass(frozen=True)
class TagLoss:
    """One tag whose val items the candidate lost beyond the tag's noise."""

    tag: str
    n_items: int
    wins: int
    losses: int
    net: float  # candidate minus the replaced skill, in items of this tag
    p_loss: float  # one-sided exact sign test for a loss on this tag's items

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "net": round(self.net, 6), "p_loss": round(self.p_loss, 6)}

    def describe(self) -> str:
        return (
            f"tag {self.tag!r} lost {-self.net:g} of {self.n_items} items "
            f"({self.wins} won / {self.losses} lost, one-sided p={self.p_loss:.3f})"
        )


def tag_regressions(
    candidate: ValScores, replaced: ValScores, tags: Tags, cfg: GateConfig
) -> list[TagLoss]:
    """Tags whose items `candidate` loses against `replaced` beyond the tag's noise: a
    one-sided paired sign test for a loss with p <= `cfg.tag_alpha`, or a net loss of more
    than `cfg.tag_margin` items. Pure; the worst first."""
    by_tag: dict[str, list[str]] = {}
    for example_id, names in tags.items():
        for name in names:
            by_tag.setdefault(name, []).append(example_id)
    found = []
    for name, ids in sorted(by_tag.items()):
        new, old = _paired({i: candidate.get(i) for i in ids}, replaced)
        if not new:
            continue
        paired = paired_comparison(
            {str(i): x for i, x in enumerate(new)}, {str(i): y for i, y in enumerate(old)}
        )
        net = sum(new) - sum(old)
        p_loss = sign_test_pvalue(paired.losses, paired.wins)
        by_test = cfg.tag_alpha is not None and p_loss <= cfg.tag_alpha + 1e-9
        by_margin = cfg.tag_margin is not None and -net > cfg.tag_margin + 1e-9
        if by_test or by_margin:
            found.append(TagLoss(name, len(new), paired.wins, paired.losses, net, p_loss))
    return sorted(found, key=lambda t: (t.net, t.p_loss))


def _veto_tags(result: GateResult, losses: list[TagLoss]) -> None:
    if not losses:
        return
    result.tag_losses = [t.to_dict() for t in losses]
    result.decision = "reject"
    result.reason = (
        f"per-tag veto: {'; '.join(t.describe() for t in losses)} (the total: {result.reason})"
    )


@dataclass(frozen=True)
class SmallestGain:
    """The smallest net val gain a gate could accept at a val size: `items` net wins (None:
    none at all, the val set is too small), `share` the same as a fraction of val."""

    n_val: int
    items: int | None
    share: float | None
    why: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _fewest_wins(cfg: GateConfig) -> tuple[int, str]:
    """The fewest net val wins `gate` accepts as a new best in the most favourable split (wins,
    no losses), whatever the val size, and what sets it: more than `cfg.margin` items, and
    with `cfg.confidence` a one-sided sign test p = 2^-w <= 1 - confidence. (For a soft metric
    the bootstrap test of all-positive differences passes at any w, so only the margin
    counts there.)"""
    w = math.floor(cfg.margin + 1e-9) + 1  # the first whole number of items > margin
    need = [f"> {cfg.margin:g} items (margin)"]
    if cfg.confidence is not None and cfg.metric == "hard":
        alpha = 1.0 - cfg.confidence
        while sign_test_pvalue(w, 0) > alpha + 1e-9:
            w += 1
        need.append(f"sign test p <= {alpha:.3g} (all wins: 2^-w)")
    return w, " and ".join(need)


def smallest_accepted_gain(n_val: int, cfg: GateConfig) -> SmallestGain:
    """The fewest net val wins that `gate` accepts as a new best on `n_val` items, with the
    most favourable split of them (`_fewest_wins`). A night that learned nothing states it,
    so "nothing helped" is told from "too few tasks to see it"."""
    if n_val < 0:
        raise ConfigError(f"n_val must be >= 0, got {n_val}")
    if cfg.accept_all:
        return SmallestGain(n_val, 0, 0.0, "gate off: every candidate is accepted")
    w, why = _fewest_wins(cfg)
    if w > n_val:
        return SmallestGain(
            n_val, None, None, f"no gain can pass on {n_val} val items: needs {w} net wins ({why})"
        )
    return SmallestGain(n_val, w, round(w / n_val, 6), f"{w} net wins of {n_val} ({why})")


# ---- power said before a run (issue 65) ----------------------------------------------------

DEFAULT_TARGET_GAIN = 0.05
"""The gain a power statement names when `GateConfig.min_gain` is unset: five points, the
size of a real gain a 30-item val rarely shows."""


def val_size_for(gain: float, cfg: GateConfig) -> int | None:
    """The fewest val items on which `gate` could accept a true gain of `gain` (a share of val
    items) as a new best: the smallest n with `smallest_accepted_gain(n).items <= gain * n`.
    The most favourable case (every net win with no loss), so a lower bound: a gain that also
    loses items needs more. None with the gate off (any size passes)."""
    if not 0.0 < gain <= 1.0:
        raise ConfigError(f"a gain is a share of val items in (0, 1], got {gain}")
    if cfg.accept_all:
        return None
    w, _ = _fewest_wins(cfg)
    return max(w, math.ceil(w / gain - 1e-9))


@dataclass(frozen=True)
class GatePower:
    """What a gate can see on a val size, said before a run: the smallest gain it could accept
    there, and the val size the gain the run looks for needs (None: the gate is off)."""

    smallest: SmallestGain
    target_gain: float
    needed_val: int | None
    items: str = "val items"  # what is counted: "val tasks" in a night

    @property
    def n_val(self) -> int:
        return self.smallest.n_val

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        """One sentence: `power: on 30 val items ...`."""
        items = self.items
        if self.needed_val is None:
            return "power: the gate is off: every candidate is accepted unchecked"
        s, n = self.smallest, self.n_val
        seen = (
            f"can accept a gain of {s.items} net items ({s.share:.2f} of val) at the least"
            if s.items is not None
            else f"can accept no gain ({s.why.split(': ', 1)[-1]})"
        )
        reach = "within reach" if n >= self.needed_val else "out of reach"
        return (
            f"power: on {n} {items} the gate {seen}; a gain of {self.target_gain:g} is "
            f"{reach}: it needs at least {self.needed_val} {items} (more when the candidate "
            "also loses items)"
        )


def gate_power(n_val: int, cfg: GateConfig, items: str = "val items") -> GatePower:
    """The gate's power on `n_val` items for the gain the run looks for (`cfg.min_gain`, else
    `DEFAULT_TARGET_GAIN`); `items` names what is counted in its line."""
    target = cfg.min_gain if cfg.min_gain is not None else DEFAULT_TARGET_GAIN
    smallest = smallest_accepted_gain(n_val, cfg)
    return GatePower(smallest, target, val_size_for(target, cfg), items)


def auto_val_size(cfg: GateConfig, budget_calls: int | None = None) -> int:
    """`--val-size auto`: the smallest val size on which the gate could accept `cfg.min_gain`
    (`val_size_for`), refused (one sentence) without a min_gain, with the gate off, or when
    `budget_calls` target calls cannot pay for scoring the starting skill and one candidate on
    that many items."""
    if cfg.min_gain is None:
        raise ConfigError(
            "--val-size auto needs --min-gain: the gain the val set must be able to see"
        )
    n = val_size_for(cfg.min_gain, cfg)
    if n is None:
        raise ConfigError("--val-size auto needs the gate on: with it off any val size accepts")
    if budget_calls is not None and budget_calls < 2 * n:
        raise ConfigError(
            f"--val-size auto: a gain of {cfg.min_gain:g} needs at least {n} val items at this "
            f"gate, and --budget-calls {budget_calls} cannot score the starting skill and one "
            f"candidate on them ({2 * n} calls); raise the budget or --min-gain"
        )
    return n


# ---- the pooled val (issue 52): more items where the step's val is too small --------------


@dataclass(frozen=True)
class PooledVerdict:
    """A gate decision taken on the pooled val (the step's val plus a held-out pool), with the
    power of each: the smallest net gain val alone and the pooled val can show (`pooled`:
    False when the pool was not consulted, the val's own rejection standing)."""

    result: GateResult
    pooled: bool
    n_val: int
    n_pool: int
    power_val: SmallestGain
    power_pooled: SmallestGain

    def to_dict(self) -> dict[str, Any]:
        return {
            "pooled": self.pooled,
            "n_val": self.n_val,
            "n_pool": self.n_pool,
            "power_val": self.power_val.to_dict(),
            "power_pooled": self.power_pooled.to_dict(),
        }


def pool_scores(val: ValScores, pool: ValScores) -> dict[str, float | None]:
    """One score map over the val and the pool items (keys kept apart by a prefix)."""
    return {**{f"val:{k}": v for k, v in val.items()}, **{f"pool:{k}": v for k, v in pool.items()}}


def pooled_gate(
    val: tuple[ValScores, ValScores, ValScores],
    pool: tuple[ValScores, ValScores, ValScores],
    cfg: GateConfig,
    tags: Tags | None = None,
    costs: Costs | None = None,
) -> PooledVerdict:
    """The gate on the pooled val: (candidate, current, best) scores on the step's val and on
    the pool. A candidate the val alone rejects (worse than the current one) stays rejected and
    the pool is not consulted: a filter, which can only lower the accept rate. Every other
    decision is the one gate's on val and pool together, a single look (not val first and the
    pool as a second chance, which would add the two looks' false accepts). The per-tag veto
    reads the val items' tags."""
    n_val, n_pool = len(val[0]), len(pool[0])
    power_val = smallest_accepted_gain(n_val, cfg)
    power_pooled = smallest_accepted_gain(n_val + n_pool, cfg)
    alone = gate(val[0], val[1], val[2], cfg, tags=tags, costs=costs)
    if alone.decision == "reject" or not n_pool:
        return PooledVerdict(alone, False, n_val, n_pool, power_val, power_pooled)
    candidate, current, best = (pool_scores(v, p) for v, p in zip(val, pool, strict=True))
    pooled_tags = {f"val:{k}": t for k, t in (tags or {}).items()}
    result = gate(candidate, current, best, cfg, tags=pooled_tags, costs=costs)
    result.reason = f"pooled val ({n_val} val + {n_pool} pool items): {result.reason}"
    return PooledVerdict(result, True, n_val, n_pool, power_val, power_pooled)
