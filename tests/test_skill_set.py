"""Many skills from one task (`skill/skillset.py`, `optimize --skills DIR`) with scripted
models: clustering by intent, val routed and never clustered, the whole-val check, an existing
SKILL.md as the start, a file changed since read, resume after a kill mid-set."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from selftaught.gate import GateConfig
from selftaught.skill import SkillOptConfig
from selftaught.skill.routing import check_name
from selftaught.skill.skill_md import parse_skill_md
from selftaught.skill.skillset import (
    SkillSetConfig,
    SkillSetResult,
    TaskCluster,
    cluster_tasks,
    train_skill_set,
)
from selftaught.tasks.base import Example, Score
from tests.scripted import ScriptedModel, append, canned_analyst, edits_json, system_of, user_of

pytest.importorskip("bm25s")

ADD = "Add the number {a} to {b}, then report their sum."
SPELL = "Spell the number {n} backwards in capital letters."


def add_example(i: int, split: str) -> Example:
    a, b = 10 * i + 1, 3 * i + 2
    return Example(f"{split}-add-{i}", ADD.format(a=a, b=b), str(a + b), {"intent": "add"})


def spell_example(i: int, split: str) -> Example:
    n = 100 + 7 * i
    return Example(f"{split}-spell-{i}", SPELL.format(n=n), str(n)[::-1], {"intent": "spell"})


class TwoIntents:
    """Two clearly different intents: adding (needs 'rule alpha') and spelling ('rule beta')."""

    kind = "agent"
    instructions = ""

    def __init__(self, train: int = 6, val: int = 4, test: int = 2, extra_val: tuple = ()):
        self.name = "two-intents"
        self.splits = {}
        for split, n, base in (("train", train, 0), ("val", val, 50), ("test", test, 90)):
            exs = [add_example(base + i, split) for i in range(n)]
            exs += [spell_example(base + i, split) for i in range(n)]
            self.splits[split] = exs
        self.splits["val"] += list(extra_val)

    def examples(self, split: str) -> list[Example]:
        return list(self.splits[split])

    def score(self, output: str, example: Example) -> Score:
        ok = output.strip() == example.reference
        return Score(float(ok), float(ok), "correct" if ok else "wrong: the skill lacks a rule")


def answer(messages, *, alpha_hurts_spelling: bool = False) -> str:
    """Right iff the system prompt holds the intent's rule; with `alpha_hurts_spelling`,
    spelling is right without a rule and wrong when 'rule alpha' is served to it."""
    text, system = user_of(messages), system_of(messages)
    if m := re.search(r"Add the number (\d+) to (\d+)", text):
        return str(int(m[1]) + int(m[2])) if "rule alpha" in system else "0"
    if m := re.search(r"Spell the number (\d+)", text):
        if alpha_hurts_spelling:
            return "WRONG" if "rule alpha" in system else m[1][::-1]
        return m[1][::-1] if "rule beta" in system else "WRONG"
    return "I do not know."


def reflect(messages) -> str:
    text = user_of(messages)
    failed = text.split("## Failed attempts", 1)[1]
    rule = "rule alpha" if "Add the number" in failed else "rule beta"
    return edits_json(append(rule))


def analyst(names: bool = True, on_call=None) -> ScriptedModel:
    inner = canned_analyst(failure=reflect)

    def fn(messages):
        if on_call is not None:
            on_call(messages)
        text = user_of(messages)
        if "You name one skill" in text:
            if not names:
                return "no idea"
            if "Add the number" in text:
                return json.dumps({"name": "Adding Numbers", "description": "Add numbers, sum."})
            return json.dumps({"name": "spelling", "description": "Spell a word backwards."})
        return inner.fn(messages)

    return ScriptedModel(fn, "scripted-analyst")


def config(**kw) -> SkillOptConfig:
    base = dict(epochs=1, batch_size=6, concurrency=2, gate=GateConfig(), demos_max=0, pool=False)
    return SkillOptConfig(**{**base, **kw})


SET = SkillSetConfig(min_tasks=4)


def train_set(tmp: Path, target=None, an=None, task=None, **kw) -> SkillSetResult:
    return train_skill_set(
        task or TwoIntents(),
        target or ScriptedModel(answer, "scripted-target"),
        an or analyst(),
        output_dir=tmp / "run",
        config=config(),
        set_config=SET,
        progress=False,
        **kw,
    )


# ---- clustering -------------------------------------------------------------------------------


def test_two_intents_make_two_clusters_with_valid_unique_names():
    task = TwoIntents()
    clusters = cluster_tasks(task.examples("train"), task.examples("val"), SET)
    assert len(clusters) == 2
    intents = [{i.split("-")[1] for i in c.train_ids} for c in clusters]
    assert sorted(map(sorted, intents)) == [["add"], ["spell"]]
    names = [c.name for c in clusters]
    assert len(set(names)) == 2 and all(check_name(n) == n for n in names)
    # without an analyst the top words name them
    assert any("spell" in n or "backwards" in n for n in names)


def test_the_analyst_names_clusters_and_an_unusable_reply_falls_back():
    from selftaught.skill.skillset import analyst_namer

    task = TwoIntents()
    named = cluster_tasks(task.examples("train"), [], SET, namer=analyst_namer(analyst(names=True)))
    assert sorted(c.name for c in named) == ["adding-numbers", "spelling"]
    a = analyst(names=False)
    fell_back = cluster_tasks(task.examples("train"), [], SET, namer=analyst_namer(a))
    assert len(a.calls) == 2
    assert all("val-" not in user_of(m) for m in a.calls)  # train inputs only
    assert {c.name for c in fell_back} == {
        c.name for c in cluster_tasks(task.examples("train"), [], SET)
    }


def test_val_is_routed_never_clustered():
    stray = Example("val-stray", "Zebra quokka wombat?", "x")
    task = TwoIntents(extra_val=(stray,))
    train, val = task.examples("train"), task.examples("val")
    with_val = cluster_tasks(train, val, SET)
    without = cluster_tasks(train, [], SET)
    assert [(c.card, c.train_ids) for c in with_val] == [(c.card, c.train_ids) for c in without]
    for c in with_val:
        intent = c.train_ids[0].split("-")[1]
        assert c.val_ids and all(v.split("-")[1] == intent for v in c.val_ids)
    routed = {v for c in with_val for v in c.val_ids}
    assert "val-stray" not in routed and len(routed) == 8


def test_a_small_cluster_below_min_tasks_trains_no_skill():
    task = TwoIntents(train=6)
    train = [e for e in task.examples("train") if "add" in e.id] + task.examples("train")[6:8]
    clusters = cluster_tasks(train, task.examples("val"), SkillSetConfig(min_tasks=4))
    # two spelling tasks share no weighted word with adding: they stay unrouted
    assert len(clusters) == 1 and all("add" in i for i in clusters[0].train_ids)


def test_task_cluster_round_trips():
    task = TwoIntents()
    for c in cluster_tasks(task.examples("train"), task.examples("val"), SET):
        assert TaskCluster.from_dict(json.loads(json.dumps(c.to_dict()))) == c


# ---- training ---------------------------------------------------------------------------------


def test_each_cluster_gets_its_own_skill_and_both_are_accepted(tmp_path):
    result = train_set(tmp_path)
    assert [o.name for o in result.outcomes] == ["adding-numbers", "spelling"]
    assert all(o.accepted and o.own_accepted for o in result.outcomes)
    bodies = {o.name: o.trained_body for o in result.outcomes}
    assert "rule alpha" in bodies["adding-numbers"] and "rule beta" not in bodies["adding-numbers"]
    assert "rule beta" in bodies["spelling"]
    assert result.base_score.hard == 0.0 and result.shipped_score.hard == 1.0
    back = SkillSetResult.from_dict(json.loads((tmp_path / "run" / "result.json").read_text()))
    assert back.to_dict() == result.to_dict()
    from selftaught.api import load_result

    assert isinstance(load_result(result.to_dict()), SkillSetResult)
    for o in result.outcomes:  # each cluster is a normal resumable run directory
        assert (Path(o.run_dir) / "summary.json").exists()


def test_a_skill_that_hurts_another_cluster_is_rejected_by_the_whole_val_check(tmp_path):
    target = ScriptedModel(lambda m: answer(m, alpha_hurts_spelling=True), "scripted-target")
    result = train_set(tmp_path, target=target)
    adding = result.outcomes[0]
    assert adding.own_accepted and adding.own_after.hard == 1.0  # it helps its own cluster
    assert not adding.accepted and adding.whole_val is not None
    (loss,) = adding.whole_val.losses
    assert loss.tag == "spelling" and loss.losses == 4
    assert "cluster 'spelling' lost 4" in adding.reason
    # the shipped set keeps spelling as it was: nothing served to it
    assert result.shipped_score.hard == result.base_score.hard


# ---- optimize --skills DIR ------------------------------------------------------------------

USER_SKILL = """---
name: adding
description: "Add numbers, report their sum"
license: MIT
metadata:
  owner: me
---
# Adding
Be careful.
"""


def optimize_skills(tmp: Path, target=None, an=None, **kw):
    from selftaught.api import optimize_skills

    return optimize_skills(
        TwoIntents(),
        target or ScriptedModel(answer, "scripted-target"),
        optimizer_model=an or analyst(),
        skills_dir=tmp / "skills",
        config=config(),
        set_config=SET,
        output_dir=tmp / "run",
        progress=False,
        **kw,
    )


def test_an_existing_skill_is_the_start_for_its_tasks_and_keeps_its_front_matter(tmp_path):
    path = tmp_path / "skills" / "adding" / "SKILL.md"
    path.parent.mkdir(parents=True)
    path.write_text(USER_SKILL)
    result = optimize_skills(tmp_path)
    adding, spelling = result.outcomes
    assert adding.cluster.start is not None and adding.start_body == "# Adding\nBe careful."
    assert sorted(i.split("-")[1] for i in adding.cluster.train_ids) == ["add"] * 6
    assert adding.accepted and spelling.accepted
    written = path.read_text()
    assert written.startswith("---\nname: adding\n")
    assert "license: MIT\nmetadata:\n  owner: me\n---\n# Adding\nBe careful.\n" in written
    assert "rule alpha" in written
    new = parse_skill_md((tmp_path / "skills" / spelling.name / "SKILL.md").read_text(), "x")
    assert new.extra == () and "rule beta" in new.body  # name and description only
    assert sorted(result.written) == sorted(
        [str(path), str(tmp_path / "skills" / spelling.name / "SKILL.md")]
    )


def test_a_file_changed_since_it_was_read_is_not_overwritten(tmp_path):
    path = tmp_path / "skills" / "adding" / "SKILL.md"
    path.parent.mkdir(parents=True)
    path.write_text(USER_SKILL)
    edited = USER_SKILL + "My own new line.\n"

    def user_edits(messages):
        if path.read_text() != edited:
            path.write_text(edited)  # the user edits the file while the run goes on

    result = optimize_skills(tmp_path, an=analyst(on_call=user_edits))
    assert result.outcomes[0].accepted
    assert path.read_text() == edited
    (refused,) = result.refused
    assert refused.path == str(path) and "changed on disk since it was read" in refused.reason
    assert len(result.written) == 1  # the other skill is still written


def test_a_killed_set_resumes_the_unfinished_cluster_and_keeps_the_finished(tmp_path):
    first = tmp_path / "run" / "outcomes" / "adding-numbers.json"

    def killed(messages):
        if first.exists() and "Spell the number" in user_of(messages):
            raise RuntimeError("killed")
        return answer(messages)

    with pytest.raises(RuntimeError, match="killed"):
        train_set(tmp_path, target=ScriptedModel(killed, "scripted-target"))
    kept = first.read_text()
    assert not (tmp_path / "run" / "outcomes" / "spelling.json").exists()
    target = ScriptedModel(answer, "scripted-target")
    result = train_set(tmp_path, target=target)
    assert first.read_text() == kept
    # the finished cluster is neither trained nor scored again (its scores are cached)
    assert target.calls and not any("Add the number" in user_of(m) for m in target.calls)
    assert all(o.accepted for o in result.outcomes)
    fresh = train_set(tmp_path / "fresh")
    assert [o.trained_body for o in result.outcomes] == [o.trained_body for o in fresh.outcomes]


def test_a_set_saved_before_a_setting_existed_resumes_at_its_default(tmp_path):
    from selftaught.errors import ConfigError

    train_set(tmp_path)
    config = tmp_path / "run" / "config.json"
    saved = json.loads(config.read_text())
    del saved["curriculum"], saved["skill_set"]["name_input_chars"]  # settings added later
    config.write_text(json.dumps(saved))
    train_set(tmp_path)  # read as their defaults: the same settings, resumed
    saved["batch_size"] += 1  # a setting that differs is still refused, named
    config.write_text(json.dumps(saved))
    with pytest.raises(ConfigError, match="batch_size"):
        train_set(tmp_path)


# ---- the command ----------------------------------------------------------------------------

TASK = f"{Path(__file__).resolve()}:TwoIntents"


def test_optimize_skills_command_prints_each_skill_and_writes_its_file(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import selftaught.models
    from selftaught.cli import app

    models = {"target": ScriptedModel(answer, "target"), "analyst": analyst()}
    monkeypatch.setattr(selftaught.models, "load_model", lambda spec, **_: models[spec])
    path = tmp_path / "skills" / "adding" / "SKILL.md"
    path.parent.mkdir(parents=True)
    path.write_text(USER_SKILL)
    args = ["optimize", "--task", TASK, "--model", "target", "--optimizer-model", "analyst"]
    args += ["--skills", str(tmp_path / "skills"), "--output", str(tmp_path / "run")]
    args += ["--min-tasks", "4", "--epochs", "1", "--batch-size", "6", "--demos-max", "0"]
    args += ["--no-pool", "--gate-margin", "1", "--gate-confidence", "0"]
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    out = " ".join(done.output.split())
    for name in ("adding (existing)", "spelling", "own val", "whole val", "accepted"):
        assert name in out, name
    assert f"written: {path}" in done.output.replace("\n", "")
    assert "rule alpha" in path.read_text() and "license: MIT" in path.read_text()
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["kind"] == "skill_set" and len(result["written"]) == 2


def test_report_on_a_skill_set_shows_each_skill_and_writes_each_run_page(tmp_path):
    from typer.testing import CliRunner

    from selftaught.cli import app

    result = train_set(tmp_path)
    done = CliRunner().invoke(app, ["report", str(tmp_path / "run")])
    assert done.exit_code == 0, done.output
    assert "skills: two-intents" in done.output and "accepted" in done.output
    for o in result.outcomes:
        assert (Path(o.run_dir) / "report.html").is_file()


# ---- the embedded model ---------------------------------------------------------------------


@pytest.mark.local
@pytest.mark.slow
def test_many_skills_end_to_end_on_the_embedded_model(tmp_path):
    """The real embedded model (SmolLM2-135M) as target and analyst, tiny: whatever it learns,
    two clusters get valid unique names, each is trained and gated, the result is complete,
    and only accepted skills are written (the user's front matter kept)."""
    from selftaught.api import optimize_skills

    path = tmp_path / "skills" / "adding" / "SKILL.md"
    path.parent.mkdir(parents=True)
    path.write_text(USER_SKILL)
    cfg = config(batch_size=4, max_tokens=16, analyst_max_tokens=128, evaluate_test=False)
    result = optimize_skills(
        TwoIntents(train=4, val=2, test=0),
        "local",
        skills_dir=tmp_path / "skills",
        config=cfg,
        set_config=SET,
        output_dir=tmp_path / "run",
        progress=False,
    )
    names = [o.name for o in result.outcomes]
    assert names[0] == "adding" and len(names) == 2 and len(set(names)) == 2
    assert all(check_name(n) == n for n in names)
    assert all(o.trained and o.own_before is not None for o in result.outcomes)
    assert result.base_score is not None and result.base_score.n == 4
    stored = json.loads((tmp_path / "run" / "result.json").read_text())
    assert SkillSetResult.from_dict(stored).to_dict() == result.to_dict()
    accepted = {o.name for o in result.accepted}
    assert len(result.written) == len(accepted) and not result.refused
    assert ("license: MIT" in path.read_text()) and (
        ("adding" in accepted) == (path.read_text() != USER_SKILL)
    )
