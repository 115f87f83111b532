"""Many skills with weights and memory (issue 62): each skill's unit holds its own memory and
LoRA adapter; the proxy routes each request to its skill and that skill's adapter (several
resident at once, each merged once), or with vLLM `--lora` to the adapter's name; adopt,
rollback and probation per skill carry the adapter. Scripted models and fake adapter folders
here (a merge that counts its calls); the embedded model end to end at the bottom."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import httpx
import pytest

from selftaught.runs import atomic_write_json
from selftaught.sleep.adoption import staging
from selftaught.sleep.adoption.skill_units import (
    adopt_skill,
    adopted_skills,
    rollback_skill,
    skill_adapter_dir,
    write_skill_proposal,
)
from selftaught.sleep.night.weight_night import TrainedAdapter, WeightData
from selftaught.sleep.paths import Unit, read_adopted
from selftaught.sleep.records import (
    AdapterRecord,
    SkillRecord,
    TaskChecks,
    TrainedRecord,
    ValPairRecord,
)
from tests import loopback
from tests.scripted import (
    ScriptedModel,
    append,
    canned_analyst,
    edits_json,
    rule_answer,
    user_of,
)

PROJECT = "demo"
UNITS, SQL = "unit-conversion", "sql-queries"
CARDS = {
    UNITS: ("Convert between units: km, miles, kg, pounds.", "convert 5 km to miles"),
    SQL: ("Write SQL queries over the orders table.", "select the orders of May"),
}
ASK = {UNITS: "please convert 12 km to miles", SQL: "which orders shipped in May? the query"}


def fake_adapter(folder: Path, content: bytes) -> Path:
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    (folder / "adapter_model.safetensors").write_bytes(content)
    return folder


def stage(
    home: Path,
    night: str,
    skills: dict[str, tuple[str, bytes | None]],
    bases: dict[str, int] | None = None,
    memory: dict[str, str] | None = None,
) -> Path:
    """A many-skills night that staged each skill: name -> (body, adapter bytes or None)."""
    folder = staging.nights_dir(PROJECT, home) / night
    entries = []
    for name, (body, weights) in skills.items():
        description, task = CARDS[name]
        adapter = None
        if weights is not None:
            fake_adapter(skill_adapter_dir(folder, name), weights)
            adapter = AdapterRecord(dir="adapter", method="sft", base_model="local")
        entry = SkillRecord(
            name=name,
            dir=f"skills/{name}",
            description=description,
            status="staged",
            reason="accepted",
            base_version=(bases or {}).get(name, 0),
            train_ids=(f"{name}-t1",),
            val_ids=(f"{name}-v1",),
            tasks=(task,),
            own_val=ValPairRecord(before=0.5, after=1.0, n=2),
            candidate="sft+text" if weights is not None else "text",
            adapter=adapter,
        )
        write_skill_proposal(folder, PROJECT, entry, body, home,
                             memory=(memory or {}).get(name))  # fmt: skip
        entries.append(entry.to_dict())
    report = {"kind": staging.NIGHT_KIND, "night": night, "project": PROJECT, "status": "staged",
              "base_version": 0, "skills": entries}  # fmt: skip
    atomic_write_json(folder / "report.json", report)
    return folder


def version_adapter(home: Path, name: str, version: int) -> Path:
    return staging.versions_dir(Unit(PROJECT, name), home) / str(version) / "adapter"


# ---- adopt and rollback, adapters included ------------------------------------------------------


def test_a_skills_unit_holds_its_memory_and_adapter_and_rollback_of_one_leaves_the_other(
    tmp_path,
):
    home = tmp_path / "home"
    stage(home, "n1", {UNITS: ("UNITS ONE", b"units-1"), SQL: ("SQL ONE", b"sql-1")},
          memory={UNITS: "Miles are 1.609 km."})  # fmt: skip
    adopt_skill(PROJECT, UNITS, home=home)
    adopt_skill(PROJECT, SQL, home=home)
    units = read_adopted(Unit(PROJECT, UNITS), home)
    assert units.memory == "Miles are 1.609 km."
    assert units.adapter == version_adapter(home, UNITS, 1)
    assert (units.adapter / "adapter_model.safetensors").read_bytes() == b"units-1"
    meta = staging.version_meta(Unit(PROJECT, UNITS), 1, home)
    assert meta["adapter"]["night"] == "n1" and meta["adapter"]["method"] == "sft"
    # a text-only proposal gated against version 1 keeps serving version 1's adapter and memory
    stage(home, "n2", {UNITS: ("UNITS TWO", None)}, bases={UNITS: 1})
    assert adopt_skill(PROJECT, UNITS, home=home).version == 2
    units = read_adopted(Unit(PROJECT, UNITS), home)
    assert units.skill == "UNITS TWO" and units.memory == "Miles are 1.609 km."
    assert (units.adapter / "adapter_model.safetensors").read_bytes() == b"units-1"
    assert staging.version_meta(Unit(PROJECT, UNITS), 2, home)["adapter"]["carried_from"] == 1
    # a new adapter, then rolled back: skill sql-queries' adapter is never touched
    stage(home, "n3", {UNITS: ("UNITS THREE", b"units-3")}, bases={UNITS: 2})
    adopt_skill(PROJECT, UNITS, home=home)
    sql_before = read_adopted(Unit(PROJECT, SQL), home)
    rollback_skill(PROJECT, UNITS, 1, home=home)
    assert read_adopted(Unit(PROJECT, UNITS), home).adapter == version_adapter(home, UNITS, 1)
    sql = read_adopted(Unit(PROJECT, SQL), home)
    assert sql == sql_before and sql.adapter == version_adapter(home, SQL, 1)
    served = {s.name: s.adapter for s in adopted_skills(PROJECT, home)}
    assert served == {UNITS: version_adapter(home, UNITS, 1), SQL: version_adapter(home, SQL, 1)}
    from selftaught.sleep.adoption.skill_units import skill_status_lines

    status = "\n".join(skill_status_lines(PROJECT, home))
    assert f"skill {UNITS}: version 1 adopted (versions: 1, 2, 3), serving its adapter" in status
    assert staging.current_version(PROJECT, home) == 0  # the project's own unit: untouched


def test_a_skill_whose_gate_chose_its_adapter_alone_is_still_routed_to(tmp_path):
    """A new kind whose weight gate chose the adapter with no text: version 1 has an empty
    body and an adapter; it is served (routed to), with nothing injected but its adapter."""
    from selftaught.sleep.adoption.skill_units import route_request

    stage(tmp_path, "n1", {UNITS: ("", b"units-1")})
    adopt_skill(PROJECT, UNITS, home=tmp_path)
    routed, decision = route_request(PROJECT, tmp_path, [{"role": "user", "content": ASK[UNITS]}])
    assert routed is not None and routed.name == UNITS and routed.skill == ""
    assert routed.adapter == version_adapter(tmp_path, UNITS, 1) and decision.version == 1


def test_a_routed_skills_memory_is_injected_after_it_and_stripped_with_it():
    from selftaught.sleep.adoption.inject import (
        RoutedSkill,
        inject_adopted,
        strip_injected_messages,
    )
    from selftaught.sleep.paths import Adopted

    client = [{"role": "user", "content": ASK[UNITS]}]
    routed = RoutedSkill(UNITS, "Answer in miles.", 2, memory="A mile is 1.609 km.")
    sent = inject_adopted(client, Adopted("", "", None), routed)
    system = sent[0]["content"]
    assert system.index("Answer in miles.") < system.index("A mile is 1.609 km.")
    assert f"<!-- selftaught:memory name={UNITS} version=2 -->" in system
    assert strip_injected_messages(sent) == client


# ---- serving: a local upstream ------------------------------------------------------------------


class Merges:
    """A merge that answers as the adapter it was given (`adapter <skill>/<bytes>`), counted."""

    def __init__(self) -> None:
        self.folders: list[Path] = []

    def __call__(self, base, folder: Path):
        self.folders.append(folder)
        label = f"{folder.parents[2].name}/{(folder / 'adapter_model.safetensors').read_text()}"
        return ScriptedModel(lambda m: f"adapter {label}: {user_of(m)[:12]}", base.name)


def _local_proxy(home: Path, tmp_path: Path, merges: Merges, max_adapters: int = 4):
    from selftaught.serve import create_app
    from selftaught.sleep.adoption.serving import FollowAdopted
    from selftaught.sleep.intake.proxy import ProxyConfig, Upstream, proxy_in_background

    base = ScriptedModel(lambda m: f"base: {user_of(m)[:12]}", "scripted-base")
    followed = FollowAdopted(base, PROJECT, home, max_adapters, merge=merges)  # served as "m"
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(followed, "m")))
    upstream = Upstream(client, "http://localhost/v1", "m", True, None, False, local=followed)
    config = ProxyConfig(upstream="local", project=PROJECT, port=0, log_path=tmp_path / "l.db",
                         home=home, max_adapters=max_adapters)  # fmt: skip
    return proxy_in_background(config, upstream=upstream), followed


def _ask(url: str, text: str) -> str:
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": 8}
    resp = loopback.post(f"{url}/chat/completions", json=body, timeout=30)
    resp.raise_for_status()
    return resp.json()["choices"][0]["message"]["content"]


def test_the_local_upstream_serves_each_routed_skill_its_adapter_merging_each_once(tmp_path):
    """Ten requests alternating between two kinds: each answered by its skill's adapter, each
    adapter merged once and both resident; a request of no skill gets the base. Rolling back
    one skill's adapter switches its requests only."""
    home = tmp_path / "home"
    stage(home, "n1", {UNITS: ("UNITS RULE", b"u1"), SQL: ("SQL RULE", b"s1")})
    stage(home, "n2", {UNITS: ("UNITS RULE 2", b"u2")}, bases={UNITS: 1})
    for name in (UNITS, SQL):
        adopt_skill(PROJECT, name, "n1", home=home)
    adopt_skill(PROJECT, UNITS, "n2", home=home)
    merges = Merges()
    running, followed = _local_proxy(home, tmp_path, merges)
    with running as (url, _):
        replies = [_ask(url, ASK[UNITS if i % 2 == 0 else SQL]) for i in range(10)]
        assert replies[0::2] == [f"adapter {UNITS}/u2: please conve"] * 5
        assert replies[1::2] == [f"adapter {SQL}/s1: which orders"] * 5
        assert len(merges.folders) == followed.shelf.loads == 2  # each adapter merged once
        assert len(followed.shelf.keys()) == 2  # both resident at once
        assert _ask(url, "hello there") == "base: hello there"  # no skill: the project's (none)
        rollback_skill(PROJECT, UNITS, 1, home=home)
        assert _ask(url, ASK[UNITS]) == f"adapter {UNITS}/u1: please conve"
        assert _ask(url, ASK[SQL]) == f"adapter {SQL}/s1: which orders"
        assert followed.shelf.loads == 3  # version 1's adapter: merged when first asked for
    assert merges.folders[-1] == version_adapter(home, UNITS, 1)


def test_past_max_adapters_the_least_recently_used_copy_is_merged_again(tmp_path):
    home = tmp_path / "home"
    stage(home, "n1", {UNITS: ("UNITS RULE", b"u1"), SQL: ("SQL RULE", b"s1")})
    for name in (UNITS, SQL):
        adopt_skill(PROJECT, name, home=home)
    merges = Merges()
    running, followed = _local_proxy(home, tmp_path, merges, max_adapters=1)
    with running as (url, _):
        for i in range(4):
            _ask(url, ASK[UNITS if i % 2 == 0 else SQL])
        assert followed.shelf.loads == 4 and len(followed.shelf.keys()) == 1


def test_a_skills_adapter_takes_the_place_of_the_projects(tmp_path):
    """The project's own adopted adapter serves the requests of no skill and of a skill with
    no adapter of its own; a skill's adapter serves that skill's."""
    from tests.test_sleep_adapters import stage_night

    home = tmp_path / "home"
    stage_night(home, "p1", skill="", adapter=fake_adapter(tmp_path / "shared", b"shared"))
    staging.adopt(PROJECT, "p1", home=home)
    stage(home, "n1", {UNITS: ("UNITS RULE", b"u1"), SQL: ("SQL RULE", None)})
    for name in (UNITS, SQL):
        adopt_skill(PROJECT, name, "n1", home=home)
    merges = Merges()
    running, followed = _local_proxy(home, tmp_path, merges)
    with running as (url, _):
        assert _ask(url, ASK[UNITS]) == f"adapter {UNITS}/u1: please conve"
        assert _ask(url, ASK[SQL]) == "adapter demo/shared: which orders"
        assert _ask(url, "hello there") == "adapter demo/shared: hello there"
        assert followed.shelf.loads == 2


# ---- serving: vLLM with --lora ------------------------------------------------------------------


def test_a_vllm_upstream_loads_each_skills_adapter_once_under_its_own_name(tmp_path):
    from selftaught.sleep.intake.proxy import ProxyConfig, proxy_in_background
    from tests.fake_upstream import FakeUpstream

    home = tmp_path / "home"
    stage(home, "n1", {UNITS: ("UNITS RULE", b"u1"), SQL: ("SQL RULE", b"s1")})
    for name in (UNITS, SQL):
        adopt_skill(PROJECT, name, home=home)
    with FakeUpstream() as upstream:
        config = ProxyConfig(upstream=f"{upstream.base_url}#base-model", project=PROJECT, port=0,
                             log_path=tmp_path / "log.db", home=home, lora=True)  # fmt: skip
        with proxy_in_background(config) as (url, _):
            for i in range(6):
                _ask(url, ASK[UNITS if i % 2 == 0 else SQL])
            _ask(url, "hello there")
    models = [r["model"] for r in upstream.requests]
    names = [f"{PROJECT}-{UNITS}-v1", f"{PROJECT}-{SQL}-v1"]
    assert models == [*names * 3, "base-model"]
    assert upstream.lora_loads == [
        {"lora_name": names[0], "lora_path": str(version_adapter(home, UNITS, 1))},
        {"lora_name": names[1], "lora_path": str(version_adapter(home, SQL, 1))},
    ]


# ---- probation per skill, adapters included -----------------------------------------------------


def test_probation_rolls_back_one_skills_adapter_on_its_own_traffic_only(tmp_path, log_at):
    """Skill unit-conversion's version 2 (a new adapter) does worse on the requests routed to
    it than version 1 did; sql-queries' rows all fail but were never its: the watch rolls back
    unit-conversion alone, and its requests are served by version 1's adapter again."""
    from selftaught.sleep.intake.log import TaskLog
    from selftaught.sleep.intake.probation import ProbationConfig
    from selftaught.sleep.intake.watch import ProbationWatch
    from tests.test_sleep_skills import routed_row

    home = tmp_path / "home"
    stage(home, "n1", {UNITS: ("UNITS ONE", b"u1"), SQL: ("SQL ONE", b"s1")})
    stage(home, "n2", {UNITS: ("UNITS TWO", b"u2")}, bases={UNITS: 1})
    adopt_skill(PROJECT, UNITS, "n1", home=home)
    adopt_skill(PROJECT, SQL, "n1", home=home)
    adopt_skill(PROJECT, UNITS, "n2", home=home)
    rows = [routed_row(ASK[UNITS], UNITS, 1, "up") for _ in range(25)]
    rows += [routed_row(ASK[UNITS], UNITS, 2, "down") for _ in range(25)]
    rows += [routed_row(ASK[SQL], SQL, 1, "down") for _ in range(25)]
    rows += [routed_row(ASK[SQL], None, 0, "down") for _ in range(25)]
    with TaskLog(log_at) as log:
        log.add_many(rows)
    watch = ProbationWatch(PROJECT, log_at, home, ProbationConfig(min_outcomes=20),
                           auto_rollback=True, every=1)  # fmt: skip
    try:
        watch.poke()
        assert watch.wait_idle(60)
    finally:
        watch.close()
    assert [(r["skill"], r["from"], r["to"]) for r in watch.rollbacks] == [(UNITS, 2, 1)]
    assert read_adopted(Unit(PROJECT, UNITS), home).adapter == version_adapter(home, UNITS, 1)
    assert read_adopted(Unit(PROJECT, SQL), home).adapter == version_adapter(home, SQL, 1)
    merges = Merges()
    running, _ = _local_proxy(home, tmp_path, merges)
    with running as (url, _):
        assert _ask(url, ASK[UNITS]) == f"adapter {UNITS}/u1: please conve"


def test_the_staged_adapter_folder_must_hold_an_adapter(tmp_path):
    folder = stage(tmp_path, "n1", {UNITS: ("UNITS ONE", b"u1")})
    shutil.rmtree(skill_adapter_dir(folder, UNITS))
    with pytest.raises(staging.StagingError, match="adapter_config.json missing"):
        adopt_skill(PROJECT, UNITS, home=tmp_path)
    assert staging.current_version(Unit(PROJECT, UNITS), tmp_path) == 0


def test_forget_everywhere_keeps_a_staged_skills_adapter_and_names_it(tmp_path):
    """A night that read a forgotten row: its phase runs go, a staged skill's adapter stays
    adoptable (weights cannot be edited) and is named among what the forget could not take."""
    from selftaught.runs import write_jsonl
    from selftaught.sleep.night.forget import Doomed, Provenance, _rewrite_night

    night = stage(tmp_path, "n1", {UNITS: ("UNITS ONE", b"u1")})
    write_jsonl(night / "tasks.jsonl", [{"id": "t1", "split": "train", "sources": ["row-1"]}])
    runs = night / "skills" / UNITS / "weights" / "sft"
    runs.mkdir(parents=True)
    (runs / "val_cache.json").write_text("{}")
    done = _rewrite_night(night, tmp_path, Doomed(forgotten=frozenset({"row-1"})), Provenance())
    assert done.adapters == (f"night n1 skill {UNITS}",)
    assert not (night / "skills" / UNITS / "weights").exists()
    assert (skill_adapter_dir(night, UNITS) / "adapter_config.json").is_file()
    assert adopt_skill(PROJECT, UNITS, home=tmp_path).version == 1


# ---- a many-skills night that trains adapters and memory -----------------------------------------

_NEEDS = re.compile(r"\[needs (\w+)\] What is (\d+) \+ (\d+)\?")


class KindTrainer:
    """An adapter trainer whose adapter knows the rules of the requests it was trained on (it
    answers those right, whatever the prompt; the others as the scripted target would)."""

    def __init__(self) -> None:
        self.calls: list[WeightData] = []

    def __call__(self, method: str, data: WeightData, out_dir: Path) -> TrainedAdapter:
        self.calls.append(data)
        learned = {_NEEDS.findall(user_of(s.messages))[-1][0] for s in data.sft}

        def answer(messages: list[dict]) -> str:
            rule, a, b = _NEEDS.findall(user_of(messages))[-1]
            return f"Answer: {int(a) + int(b)}" if rule in learned else rule_answer(messages)

        fake_adapter(out_dir, ",".join(sorted(learned)).encode())
        trained = TrainedRecord(steps=2).only("steps")
        return TrainedAdapter(method, out_dir, ScriptedModel(answer, "adapter"), trained)


def _night(home: Path, log_at, analyst, trainer: KindTrainer | None = None, **kw):
    from selftaught.sleep.night.cycle import (
        NightConfig,
        NightModels,
        night_training_defaults,
        run_night,
    )
    from tests.test_sleep_skills import fill_two_intents

    fill_two_intents(home, log_at)
    models = NightModels(ScriptedModel(rule_answer, "scripted-target"), "scripted-target",
                         analyst, "scripted-analyst")  # fmt: skip
    models.adapter_trainer = trainer
    cfg = NightConfig(home=home, log_path=log_at, training=night_training_defaults(),
                      many_skills=True, **kw)  # fmt: skip
    (night,) = run_night(cfg, models=models)
    return night


def _tasks(night) -> dict[str, dict]:
    rows = [json.loads(x) for x in (night.night_dir / "tasks.jsonl").read_text().splitlines()]
    return {r["id"]: r for r in rows}


def _rule(text: str) -> str:
    return _NEEDS.findall(text)[-1][0]


def test_a_many_skills_night_trains_one_adapter_per_kind_on_its_own_train_tasks(tmp_path, log_at):
    """Two kinds, no text to learn (the analyst proposes nothing), an adapter that learns what
    it is trained on: each kind's adapter is trained on its own train tasks only, wins its own
    gate, and is staged with its skill; adopted, each skill's unit serves its own adapter."""
    home = tmp_path / "home"
    trainer = KindTrainer()
    night = _night(home, log_at, canned_analyst(), trainer, documents=("skill",), weights="sft")
    assert night.status == "staged", night.reason
    tasks = _tasks(night)
    assert len(trainer.calls) == 2
    for data in trainer.calls:  # one kind each, its train tasks only
        items = data.train_items()
        assert {tasks[i]["split"] for i in items} == {"train"}
        assert len({tasks[i]["kind"] for i in items}) == 1
    skills = {s.name: s for s in night.skills}
    assert len(skills) == 2
    for name, entry in skills.items():
        assert entry.status == "staged" and entry.candidate == "sft", entry.reason
        assert entry.adapter is not None and entry.weights.winner == "sft"
        assert entry.own_val.after == 1.0 > entry.own_val.before
        assert set(entry.weights.train_items) == {
            i for i, t in tasks.items() if t["kind"] == name and t["split"] == "train"
        }
        folder = skill_adapter_dir(night.night_dir, name)
        assert (folder / "adapter_config.json").is_file()
        assert not (night.night_dir / "skills" / name / "weights" / "sft" / "adapter").exists()
    assert night.proposal is None and not (night.night_dir / "adapter").exists()
    for name in skills:
        adopt_skill(PROJECT, name, home=home)
        adapter = read_adopted(Unit(PROJECT, name), home).adapter
        assert adapter is not None and (adapter / "adapter_model.safetensors").is_file()
    assert staging.current_version(PROJECT, home) == 0
    kinds = {k.id: k for k in night.kinds}
    assert all(kinds[n].skill_status == "staged" and kinds[n].val.after == 1.0 for n in skills)
    md = (night.night_dir / "report.md").read_text()
    assert all(f"| {name}: staged (sft) |" in md for name in skills)


def test_a_shared_adapter_is_trained_on_every_kind_and_staged_for_the_project(tmp_path, log_at):
    home = tmp_path / "home"
    trainer = KindTrainer()
    night = _night(home, log_at, canned_analyst(), trainer, documents=("skill",), weights="sft",
                   skill_adapters="shared")  # fmt: skip
    assert night.status == "staged", night.reason
    (data,) = trainer.calls
    tasks = _tasks(night)
    assert len({tasks[i]["kind"] for i in data.train_items()}) == 2
    assert {tasks[i]["split"] for i in data.train_items()} == {"train"}
    assert night.weights.winner == "sft" and night.proposal.adapter is not None
    assert night.weights.gates["sft"].decision == "accept_new_best"
    # the kinds' data added up, its keys as report.json always had them: no replays' filter
    written = night.report_dict()["weights"]
    assert list(written["data"]) == ["corrections", "elite", "sft_samples", "preference_pairs"]
    assert written["data"]["sft_samples"] == len(data.sft) and data.replays is None
    assert list(written["trained"]["sft"]) == ["steps", "seconds"]
    assert all(s.status == "rejected" and s.adapter is None for s in night.skills)
    assert "shared adapter was staged" in night.reason
    staging.adopt(PROJECT, night.night_dir.name, home=home)
    assert read_adopted(PROJECT, home).adapter is not None


def test_the_shared_adapters_gate_vetoes_a_kind_it_breaks():
    """A shared adapter that fixes six items of one kind and breaks four of another: a net gain
    of two, refused by the per-kind veto (four losses and no win: p = 0.0625 <= 0.1)."""
    from selftaught.models.usage import UsageLedger
    from selftaught.sleep.night.cycle import night_training_defaults
    from selftaught.sleep.night.evidence import EvidenceLog
    from selftaught.sleep.night.mine import MinedTask
    from selftaught.sleep.night.split import NightTask
    from selftaught.sleep.night.weight_night import ServedKind, choose_shared
    from selftaught.sleep.paths import Adopted

    def kind(name: str, n: int) -> ServedKind:
        val = []
        for i in range(n):
            text = f"[needs {name}] What is {i} + 1?"
            task = MinedTask(f"{name}{i}", [{"role": "user", "content": text}], str(i + 1),
                             state=TaskChecks(scorer="numeric"), kind=name)  # fmt: skip
            val.append(task)
        return ServedKind(name, NightTask(PROJECT, {"val": val}), (), Adopted("rule beta", ""))

    def base(messages):  # beta's rule is in its text; alpha is wrong
        return rule_answer(messages)

    def adapter(messages):  # alpha right, beta broken
        rule, a, b = _NEEDS.findall(user_of(messages))[-1]
        return f"Answer: {int(a) + int(b) + (0 if rule == 'alpha' else 5)}"

    import tempfile

    run = Path(tempfile.mkdtemp())
    found = {"sft": TrainedAdapter("sft", run / "a", ScriptedModel(adapter, "a"))}
    winner, summaries, gates, _ = choose_shared(
        night_training_defaults(), [kind("alpha", 6), kind("beta", 4)],
        ScriptedModel(base, "base"), found, run, EvidenceLog(run / "e.jsonl"), UsageLedger(),
    )  # fmt: skip
    assert summaries["sft"].score.hard > summaries["current"].score.hard  # a net gain
    assert winner == "current" and "per-tag veto" in gates["sft"].reason
    assert "kind:beta" in gates["sft"].reason
    (loss,) = gates["sft"].tag_losses  # the veto's find, typed
    assert loss.tag == "kind:beta" and loss.net < 0


def test_a_many_skills_night_trains_each_kinds_memory_and_the_proxy_injects_it(tmp_path, log_at):
    """The analyst writes rules into a memory only: each kind's memory learns its own rule,
    gated on its own val, staged and adopted in its skill's unit, and injected after that
    skill when a request routes to it."""
    from tests.fake_upstream import fake_proxy

    def failure(messages):
        text = user_of(messages)
        if "You improve a MEMORY" not in text:
            return edits_json()
        return edits_json(append(f"rule {_rule(text)}"))

    home = tmp_path / "home"
    night = _night(home, log_at, canned_analyst(failure=failure))
    assert night.status == "staged", night.reason
    for entry in night.skills:
        assert entry.status == "staged" and entry.memory_changed, entry.reason
        proposal = night.night_dir / "skills" / entry.name / "proposal"
        memory = (proposal / "memory.md").read_text()
        rule = _rule(entry.tasks[0])
        assert f"rule {rule}" in memory and "rule alpha rule beta" not in memory
        assert memory.count("rule ") == 1  # its own rule only
        adopt_skill(PROJECT, entry.name, home=home)
        assert read_adopted(Unit(PROJECT, entry.name), home).memory == memory
    by_rule = {_rule(e.tasks[0]): e for e in night.skills}
    deadline = time.monotonic() + 10  # a Postgres log's skill list is read again every second
    while len(adopted_skills(PROJECT, home)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    with fake_proxy(home, log_at) as (url, _app, upstream):
        _ask(url, by_rule["alpha"].tasks[0])
        system = upstream.requests[-1]["messages"][0]["content"]
    assert f"<!-- selftaught:memory name={by_rule['alpha'].name} version=1 -->" in system
    assert "rule alpha" in system and "rule beta" not in system


def test_many_skills_with_weights_is_accepted_and_a_bad_mode_refused(tmp_path):
    from selftaught.errors import ConfigError
    from selftaught.sleep.night.cycle import NightConfig

    assert NightConfig(home=tmp_path, many_skills=True, weights="sft").skill_adapters == "per-skill"
    with pytest.raises(ConfigError, match="skill_adapters must be one of per-skill, shared"):
        NightConfig(home=tmp_path, many_skills=True, weights="sft", skill_adapters="both")
    with pytest.raises(ConfigError, match="documents must hold skill"):
        NightConfig(home=tmp_path, many_skills=True, weights="sft", documents=())


# ---- the embedded model, end to end -----------------------------------------------------------

from tests.test_sleep_weights import one_thread  # noqa: E402, F401 - the fixture, used below

KM = "A runner ran {a} km in the morning and {b} km in the evening (day {i}). How far in all?"
KG = "A crate on the shelf weighs {a} kg and a sack beside it {b} kg (order {i}). Total weight?"


@pytest.mark.slow  # two kinds' adapters trained on the embedded model (~12 steps each)
@pytest.mark.usefixtures("one_thread")
def test_a_two_kind_night_trains_an_adapter_per_kind_and_the_proxy_serves_each(tmp_path):
    """Two kinds of request (distances, weights), each corrected to the house style "N unit";
    a many-skills night on the embedded model with weights "sft": a real peft adapter per
    kind, trained on that kind's train tasks within a 12-step cap and gated on its own val.
    Each adapter the gate chose is staged with its skill and adopted in its unit; the proxy's
    local upstream then answers each request as the adapter of the skill it routes to does
    (each merged once): a kind whose adapter won, by its own adapter."""
    pytest.importorskip("trl")
    from selftaught.models import load_model
    from selftaught.models.adapters import with_adapter
    from selftaught.models.base import GenerationParams
    from selftaught.models.embedded import EmbeddedModelMissing, embedded_model_dir
    from selftaught.serve import create_app
    from selftaught.skill.config import SkillOptConfig
    from selftaught.sleep.adoption.serving import FollowAdopted
    from selftaught.sleep.adoption.skill_units import route_request
    from selftaught.sleep.intake.log import Feedback, Interaction, TaskLog
    from selftaught.sleep.intake.proxy import ProxyConfig, Upstream, proxy_in_background
    from selftaught.sleep.night.cycle import NightConfig, NightModels, run_night
    from selftaught.sleep.night.weight_night import WeightNightConfig

    try:
        embedded_model_dir()
    except EmbeddedModelMissing as err:
        pytest.skip(f"embedded model unavailable: {err}")
    home = tmp_path / "home"
    with TaskLog(tmp_path / "log.db") as log:
        for i in range(16):
            a, b = i % 5 + 1, (3 * i) % 4 + 1
            for template, unit in ((KM, "km"), (KG, "kg")):
                log.add(Interaction(
                    messages=[{"role": "user", "content": template.format(a=a, b=b, i=i + 1)}],
                    reply=f"That makes {a + b} in total.", project=PROJECT, source="proxy",
                    feedback=Feedback(thumb="down", reference=f"{a + b} {unit}")))  # fmt: skip
    target = load_model("local")
    caps = WeightNightConfig(
        adapter_max_steps=12, adapter_max_minutes=2, max_length=256, samples_per_prompt=0
    )
    config = NightConfig(
        home=home,
        log_path=tmp_path / "log.db",
        documents=("skill",),
        training=SkillOptConfig(epochs=1, batch_size=8, max_tokens=24, concurrency=4, demos_max=0),
        weights="sft",
        weight_training=caps,
        many_skills=True,
    )
    (night,) = run_night(config, models=NightModels(target, "local", canned_analyst(), "local"))
    assert len(night.skills) == 2, night.reason
    tasks = _tasks(night)
    won = []
    for entry in night.skills:
        w = entry.weights
        assert w is not None and set(w.candidates) == {"current", "sft"}, entry.reason
        assert 1 <= w.trained["sft"].steps <= 12
        own = {i for i, t in tasks.items() if t["kind"] == entry.name}
        assert set(w.train_items) <= {i for i in own if tasks[i]["split"] == "train"}
        assert all(c.score.n == len(entry.val_ids) for c in w.candidates.values())
        if entry.status == "staged":
            assert entry.candidate == "sft" and entry.adapter is not None
            adopt_skill(PROJECT, entry.name, home=home)
            won.append(entry)
        else:
            assert "no candidate passed the gate" in entry.reason
    if not won:
        pytest.skip("the gate chose neither kind's adapter tonight (both refused, as reported)")
    params = GenerationParams(max_tokens=24, temperature=0)
    asks = {e.name: [{"role": "user", "content": e.tasks[0]}] for e in night.skills}
    expected = {}
    for name, messages in asks.items():  # as routed: an adopted skill's adapter, else the base
        routed, _ = route_request(PROJECT, home, messages)
        assert routed is not None or name not in {e.name for e in won}
        if name in {e.name for e in won}:
            assert routed.name == name and routed.adapter is not None
        adapter = routed.adapter if routed is not None else None
        served = with_adapter(target, adapter) if adapter is not None else target
        expected[name] = served.chat(messages, params).text
    followed = FollowAdopted(target, PROJECT, home)
    app = httpx.ASGITransport(app=create_app(followed, "m"))
    client = httpx.AsyncClient(transport=app, timeout=300)  # a merge and a reply on busy cores
    upstream = Upstream(client, "http://localhost/v1", "m", True, None, False, local=followed)
    proxy = ProxyConfig(upstream="local", project=PROJECT, port=0, log_path=tmp_path / "p.db",
                        home=home)  # fmt: skip
    with proxy_in_background(proxy, upstream=upstream) as (url, _):
        for _ in range(2):
            for name, messages in asks.items():
                body = {"messages": messages, "max_tokens": 24, "temperature": 0}
                resp = loopback.post(f"{url}/chat/completions", json=body, timeout=300)
                assert resp.status_code == 200, resp.text
                assert resp.json()["choices"][0]["message"]["content"] == expected[name]
    assert followed.shelf.loads == len(won)  # each kind's adapter merged once
