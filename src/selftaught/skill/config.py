"""SkillOptConfig: every knob of skill optimization, with the SkillOpt paper's defaults
(4 epochs, batch 40, minibatch 8, merge batch 8, edit budget 4 → 2 on a cosine schedule, hard
gate) and our own safety defaults (a margin gate with a paired test, bounded reflection
context)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from selftaught.demos import PLACEMENTS
from selftaught.errors import ConfigError
from selftaught.gate import GateConfig
from selftaught.models.usage import Budget
from selftaught.skill.budget_schedule import SCHEDULES, Schedule
from selftaught.skill.document import EDIT_OPS
from selftaught.stops import Stops
from selftaught.tracking import check_report_to

# On a 30-item val set the margin alone let noise through: simulated runs whose edits were
# mostly harmful shipped a true regression 25% of the time with it, 10% with this test, while
# keeping about 80% of the mean gain when edits do help.
SKILL_GATE_CONFIDENCE = 0.8


@dataclass
class SkillOptConfig:
    # --- schedule: epochs over the train split, one step per batch --------------------
    epochs: int = 4
    """Passes over the train split (SkillOpt: 4)."""
    batch_size: int = 40
    """Train examples rolled out per step (SkillOpt: 40)."""
    max_steps: int | None = None
    """Stop after this many steps in all (None: epochs × ceil(train / batch))."""
    seed: int = 0
    """Seeds the per-epoch shuffle of the train split."""
    # curriculum (issue 52): off until chosen on dev seeds
    curriculum: bool | None = False
    """The first epoch's batches go from easier to harder train examples (ties in the
    seeded shuffle); later epochs are shuffled as without it. Only the order changes: train
    gains and loses nothing, and val and test (the gate's and the report's items) are never
    reordered or changed. True needs a task that gives every train example a difficulty
    (`Example.state["difficulty"]`: reasoning-gym generators whose metadata gives each knob's
    value, JSONL lines with a `difficulty`); any other task refuses it. None: wherever the
    task gives one (differing) difficulty to every train example, else off."""

    # --- rollout: attempts per train example --------------------------------------------
    rollouts_k: int = 1
    """Attempts per train example per step. K > 1 samples them at `rollout_temperature`, and
    the analyst also reflects on the contrast between a solved and a failed attempt at the
    same task (contrastive reflection); val and test stay greedy."""
    rollout_temperature: float = 0.7
    """Sampling temperature of the K train attempts (used only when rollouts_k > 1)."""

    # --- reflect: the analyst reads bounded minibatches of trajectories ----------------
    minibatch_size: int = 8
    """Trajectories per analyst call (SkillOpt: 8); bounds the reflection context."""
    reflect_on_successes: bool = True
    """Also reflect on solved examples (success-driven edits), as SkillOpt does."""
    max_minibatches: int = 4
    """At most this many failure and this many success minibatches per step (bounds calls)."""
    max_input_chars: int = 1200
    """Each example's prompt is clipped (head and tail kept) to this many characters."""
    max_reply_chars: int = 600
    """Each reply shown to the analyst is clipped to this many characters."""
    max_feedback_chars: int = 300
    """Each scorer feedback shown to the analyst is clipped to this many characters."""
    rejected_buffer_size: int = 16
    """The analyst sees the last N rejected edits (and select drops them if proposed again)."""
    analyst_max_tokens: int = 768
    """max_tokens of each analyst call (reflect, merge, repair)."""
    analyst_temperature: float = 0.0
    """Greedy by default: reproducible, cacheable; the rejected buffer varies the prompt."""
    repair: bool = True
    """One repair call when an analyst reply is not valid JSON edits."""
    preferences: str = ""
    """The user's house rules (free text), shown to the analyst in every reflection and merge
    prompt: the document must never contradict them (`--preferences TEXT|FILE`)."""
    prompts: str | None = None
    """A folder of prompt templates (`NAME.md`) that replace the packaged ones of the same
    name: the analyst's, the judge's, the night's readers'. An unknown name is refused
    (listing the valid ones), and so is a template without a placeholder the packaged one
    fills; a resumed run whose templates changed is refused (docs/optimize.md)."""
    guard_edits: bool = True
    """Refuse edits that echo the analyst's prompts or carry a train / val example's content
    (its numbers or wording): a skill holds rules, not examples (see `skill.guard`)."""

    # --- aggregate: hierarchical merge of the proposed patches -------------------------
    merge_batch_size: int = 8
    """Patches merged per analyst merge call (SkillOpt: 8)."""
    llm_merge: bool = True
    """Merge with the analyst; False merges deterministically (dedupe, rank by support)."""

    # --- select / update: edit budget on a schedule ------------------------------------
    edit_budget_max: int = 4
    """Edits applied at the first step (SkillOpt: 4)."""
    edit_budget_min: int = 2
    """Edits applied at the last step (SkillOpt: 2)."""
    edit_schedule: Schedule = "cosine"
    """constant | linear | cosine (SkillOpt: cosine) | adaptive: the budget starts at
    edit_budget_max, loses one edit after a step the gate rejected and gains one after a step
    it accepted, within max(edit_budget_min, 1)..edit_budget_max (an "autonomous" learning
    rate; the state keeps it across a resume)."""
    accumulate_steps: int = 1
    """Patch accumulation: each step rolls out this many batches on the same parent, the
    analyst reflects on each batch as a step would, and the edits of all of them are merged
    and ranked before one update under the budget and one gate call (gradient accumulation's
    text-space twin: an epoch has ceil(batches / N) steps). 1: one batch per step."""
    max_skill_chars: int = 6000
    """Edits that would grow the skill beyond this are skipped (keeps prompts bounded)."""
    max_edit_chars: int = 800
    """Longer edit targets / contents are refused as invalid."""
    fallback_append: bool = True
    """An insert_after whose target is not found is appended at the end instead."""
    edit_ops: tuple[str, ...] = EDIT_OPS
    """The edit operations a step may apply; the analyst's other edits are dropped at select,
    each saying why. `("append",)`: an append-only playbook that only grows (ACE's design, as
    `benchmarks/bench_stream.py` runs it); it cannot go with the slow update, which rewrites."""

    # --- demonstrations: worked train examples, the second trainable part of a skill ---
    demos_max: int = 4
    """Most demonstrations a skill may carry (0: rules only, no demo search). Candidates come
    from train only: the target's passing replies and the references the scorer passes. On the
    peer benchmark (Qwen 0.5B, basic_arithmetic, 3 seeds) a cap of 3 took mean test +0.100
    against this cap's +0.193 (benchmarks/README.md, "The search's own defaults")."""
    demo_placement: str = "turns"
    """turns (prior user/assistant turns) | system (a "Worked examples" section)."""
    demo_sets_per_step: int = 2
    """New demo sets proposed per step around the parent's (add, swap, fresh, drop; then
    further rounds and random draws); sets already scored or screened out are skipped."""
    demo_references: bool = True
    """Also offer the task's references (those its scorer passes) as demos."""
    demo_stratify: bool = True
    """On a task with at most `demos_max` distinct answers (Yes / No, a label), the first
    fresh demo set gives each answer its share of the slots instead of the top-ranked ones
    (the model's own passing replies, which all carry the answer it already gives). On
    gym:syllogism's dev seeds it took val from 11, 8, 8 to 20, 27, 24 of 30 where the
    top-ranked set changed nothing (docs/optimize.md)."""

    # --- teacher demos (issue 52): replies the optimizer writes, the scorer verifies ----
    teacher_demos: int = 0
    """Where the target solves too few train items to bootstrap demos from: at each step
    whose demo pool holds fewer than `demos_max` demos beyond bare references, the optimizer
    model is asked to write the reply to at most this many train items of the step's batch
    the target failed (each item once per run); a reply the task's own scorer passes joins
    the pool as a "teacher" demo, ranked after the model's own replies and the user's
    corrections, and gated on val like every candidate. Never an item marked `no_demo`
    (sleep: an end user's evidence), nor one of a tool or workspace task. 0: off (the
    default until it is measured on dev seeds)."""

    # --- grounded proposals (issue 52): MIPRO's data-aware instruction proposer -------
    grounded_proposals: bool = False
    """Once per run the analyst writes a short summary of the train set from at most
    `summary_items` train items (inputs and references; never val / test, never an item
    marked `no_demo`), saved in the run (train_summary.json; a resumed run reads it); each
    proposal then makes one more reflection call that proposes instructions grounded in that
    summary and the step's failed replies, merged with the failure-driven edits and gated as
    every edit. Off (the default until it is measured on dev seeds)."""
    summary_items: int = 20
    """Train items the summary is written from (a seeded sample; `grounded_proposals`)."""

    # --- candidates per step: proposals, pool, merge, successive halving --------------
    proposals: int = 1
    """Analyst proposals per step; the second and later are sampled at
    `proposal_temperature`, so a weak analyst's rare good edit gets more chances. 0: no
    analyst at all, the demo search alone (as DSPy's BootstrapFewShot). With a 0.5B analyst 0
    shipped the same skills as 1 on every peer-benchmark seed and task in a tenth to a third
    of the wall time; the default asks the analyst because rules are what a strong one can
    improve."""
    proposal_temperature: float = 0.7
    """Analyst temperature of the extra proposals."""
    pool: bool = True
    """Keep every candidate that passed the gate and draw each step's parent from the
    per-val-item Pareto front (GEPA); False: always build on the current skill (the same
    skills on the peer benchmark's three seeds)."""
    merge: bool = True
    """Also propose a merge of two pool members that win on different val items (rules of
    one, demos of the other)."""
    screen_size: int = 10
    """Successive halving: with more than `screen_keep` candidates, all are scored first on
    this many val items (a seeded subset) and only the best `screen_keep` on the rest of val
    (0: every candidate on full val)."""
    screen_keep: int = 1
    """Candidates that go on from screening to the full val split and the gate."""

    # --- gate on the val split ---------------------------------------------------------
    gate: GateConfig = field(default_factory=lambda: GateConfig(confidence=SKILL_GATE_CONFIDENCE))
    """The validation gate (metric, margin, paired test; see `selftaught.gate`). By default a
    new best must gain more than one val item *and* pass a one-sided paired sign test at
    p <= 0.2: chosen from `benchmarks/bench_gate_sim.py` (README: "Choosing the default gate").
    SkillOpt's plain strict `>` is `GateConfig(margin=0)`."""

    # --- pooled val gate (issue 52): more items where the step's val is too small --------
    pooled_val: int = 0
    """Hold out this many train items (a seeded draw, before training) as a second val pool:
    a candidate the val alone does not reject is judged on val and pool together, one look
    (`gate.pooled_gate`), and the step's diagnostics state the power of each (the smallest
    gain it can show). The pool leaves train, so it never feeds rules, demos, the teacher or
    the summary; an overlap with what is learned fails closed, naming the items. Refused in
    nights unless `NightConfig.allow_pooled_val`. 0: off (the default until its false-accept
    rate is measured on dev seeds: `benchmarks/bench_gate_sim.py --pooled`)."""

    # --- budget ------------------------------------------------------------------------
    budget: Budget = field(default_factory=Budget)
    """Most calls / tokens / USD the run may spend, every role counted (target, optimizer,
    judge, repairs, gate evaluations). Hitting it ends the run cleanly: the best skill so far
    is shipped and evaluated on test outside the budget. Unlimited by default."""

    # --- stops: wall clock and patience (issue 51, `selftaught.stops`) ------------------
    stops: Stops = field(default_factory=Stops)
    """`max_minutes` (a wall-clock limit per invocation, checked after each step) and
    `patience` (steps in a row without an accepted candidate): the run ends cleanly with the
    best skill so far, and re-running the same command resumes it."""

    # --- rollouts ------------------------------------------------------------------------
    concurrency: int = 8
    """Concurrent target calls (and analyst calls) in flight."""
    max_tokens: int = 256
    """max_tokens of each target call; truncated replies are flagged in diagnostics."""
    temperature: float = 0.0
    """Target sampling temperature (0: greedy, so val scores are reproducible)."""
    timeout_s: float = 300.0
    """Per-call timeout on top of the backend's own retries."""
    evaluate_test: bool = True
    """At the end, evaluate the initial and the best skill on the test split."""

    # --- slow update (issue 51): the edit ledger across runs, consolidation ------------
    edit_ledger: str | None = None
    """The edit ledger: every edit proposed and its fate (accepted, rejected, rolled back), kept
    across runs (`skill.ledger`). Default: edit_ledger.jsonl in the run dir (a night: in the
    project's folder); give several runs of one skill the same file to share it."""
    tried_failed_min: int = 2
    """Edits the ledger holds as rejected (or rolled back) at least this often are shown to
    the analyst as "tried and failed" and not applied again (0: off)."""
    tried_failed_max: int = 10
    """At most this many "tried and failed" edits in the analyst's prompt (the most failed)."""
    slow_every: int = 0
    """Slow update: at the end of every Nth run the ledger records (a night: every Nth night),
    one rewrite of the skill that drops the rules whose leave-one-out costs nothing on val and
    merges rules accepted many times, gated against the current skill (0: off)."""
    slow_max_trials: int = 12
    """Val evaluations the slow update's leave-one-out may spend (one per rule tried)."""
    slow_min_accepted: int = 2
    """Rules the ledger holds as accepted at least this often are offered to the analyst to
    merge where they overlap."""

    # --- tracking ------------------------------------------------------------------------
    report_to: str = "none"
    """Experiment tracker the run logs to: `none`, `trackio`, `mlflow` or `wandb` (val
    scores, gate decisions, usage, the shipped skill as a text artifact; see
    `selftaught.tracking`). Each needs its optional extra installed."""

    def __post_init__(self) -> None:
        self._check_counts()
        self._check_learning()
        self._check_edits()
        self._check_sampling()

    def _check_counts(self) -> None:
        """Sizes and counts: each at least 1, or at least 0 where 0 turns a part off."""

        def positive(name: str) -> None:
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")

        for name in (
            "rollouts_k",
            "epochs",
            "batch_size",
            "minibatch_size",
            "merge_batch_size",
            "max_minibatches",
            "concurrency",
            "max_tokens",
            "analyst_max_tokens",
            "max_input_chars",
            "max_reply_chars",
            "max_feedback_chars",
            "max_skill_chars",
            "max_edit_chars",
            "screen_keep",
            "summary_items",
            "accumulate_steps",
        ):
            positive(name)
        for name in (
            "demos_max",
            "demo_sets_per_step",
            "screen_size",
            "proposals",
            "teacher_demos",
            "pooled_val",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")

    def _check_learning(self) -> None:
        """What a step may learn: demonstrations, proposals, steps."""
        if self.demo_placement not in PLACEMENTS:
            raise ConfigError(
                f"demo_placement must be one of {', '.join(PLACEMENTS)}, "
                f"got {self.demo_placement!r}"
            )
        if self.proposals == 0 and self.demos_max == 0:
            raise ConfigError("proposals=0 and demos_max=0 leave nothing to learn")
        if self.proposals > 1 and self.proposal_temperature <= 0:
            raise ConfigError("proposals > 1 needs proposal_temperature > 0 (N greedy copies)")
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigError(f"max_steps must be >= 1 or None, got {self.max_steps}")
        if self.merge_batch_size < 2:
            raise ConfigError(f"merge_batch_size must be >= 2, got {self.merge_batch_size}")

    def _check_edits(self) -> None:
        """The edit budget, its schedule and the operations a step may apply."""
        if self.edit_budget_min < 0 or self.edit_budget_max < max(1, self.edit_budget_min):
            raise ConfigError(
                "need 0 <= edit_budget_min <= edit_budget_max and edit_budget_max >= 1, got "
                f"{self.edit_budget_min}, {self.edit_budget_max}"
            )
        if self.edit_schedule not in SCHEDULES:
            raise ConfigError(
                f"edit_schedule must be one of {', '.join(SCHEDULES)}, got {self.edit_schedule!r}"
            )
        for name in ("tried_failed_min", "tried_failed_max", "slow_every", "slow_max_trials"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        unknown_ops = [op for op in self.edit_ops if op not in EDIT_OPS]
        if unknown_ops or not self.edit_ops:
            raise ConfigError(
                f"edit_ops must be some of {', '.join(EDIT_OPS)}, got {list(self.edit_ops)}"
            )
        if self.slow_every and not {"replace", "delete"} & set(self.edit_ops):
            raise ConfigError(
                "slow_every needs replace or delete among edit_ops (the slow update rewrites)"
            )

    def _check_sampling(self) -> None:
        """Temperatures, time limits and the nested configs."""
        if self.slow_min_accepted < 1:
            raise ConfigError(f"slow_min_accepted must be >= 1, got {self.slow_min_accepted}")
        if self.rejected_buffer_size < 0:
            raise ConfigError("rejected_buffer_size must be >= 0")
        if self.rollouts_k > 1 and self.rollout_temperature <= 0:
            raise ConfigError("rollouts_k > 1 needs rollout_temperature > 0 (K greedy copies)")
        if self.temperature < 0 or self.analyst_temperature < 0:
            raise ConfigError("temperatures must be >= 0")
        if self.timeout_s <= 0:
            raise ConfigError("timeout_s must be > 0")
        if not isinstance(self.budget, Budget):
            raise ConfigError(f"budget must be a Budget, got {type(self.budget).__name__}")
        if not isinstance(self.stops, Stops):
            raise ConfigError(f"stops must be a Stops, got {type(self.stops).__name__}")
        if not isinstance(self.gate, GateConfig):
            raise ConfigError(f"gate must be a GateConfig, got {type(self.gate).__name__}")
        check_report_to(self.report_to)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
