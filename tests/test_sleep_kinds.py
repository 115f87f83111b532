"""Kinds of request (`sleep/night/kinds.py`): found from the traffic, kept across nights; recall
shares its cap among them; a quiet kind's skill is left alone (many skills) and its recalled val
tasks veto a regression (one skill); the report and `sleep status` show each kind."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from selftaught import cli
from selftaught.sleep.adoption import staging
from selftaught.sleep.intake.log import Feedback, Interaction, TaskLog
from selftaught.sleep.night import recall
from selftaught.sleep.night.cycle import SleepConfig, night_training_defaults, run_night
from selftaught.sleep.night.kinds import Kind, KindConfig, find_kinds, load_kinds, save_kinds
from selftaught.sleep.night.mine import MinedTask
from selftaught.sleep.night.result import NightResult
from selftaught.sleep.paths import Unit, read_adopted
from tests.test_sleep_skills import INTENTS, PROJECT, two_rule_models, unit_files


def _task(text: str, tid: str, **kw) -> MinedTask:
    return MinedTask(tid, [{"role": "user", "content": text}], **kw)


def _question(rule: str, i: int, head: str | None = None) -> str:
    a, b = i + 1, 7 * i + (3 if rule == "alpha" else 5)
    return f"{head if head is not None else INTENTS[rule]} [needs {rule}] What is {a} + {b}?"


def test_a_kind_keeps_its_id_as_its_traffic_drifts_and_a_new_intent_founds_its_own(tmp_path):
    first = [_task(_question(r, i), f"{r}{i}") for i in range(12) for r in ("alpha", "beta")]
    one = find_kinds(first, (), KindConfig(), "n1")
    ids = {t.id[:4]: t.kind for t in first}
    assert len(one.kinds) == 2 and set(one.new) == {ids["alph"], ids["beta"]}
    assert all(t.kind == ids[t.id[:4]] for t in first)
    fruit = next(k for k in one.kinds if k.id == ids["alph"])
    assert {"fruit", "apples"} <= set(fruit.terms) and fruit.nights == 1
    save_kinds(PROJECT, tmp_path, one.kinds)
    known = load_kinds(PROJECT, tmp_path)
    assert known == one.kinds
    # night 2: fewer fruit requests, their wording drifted; a new intent; no invoice traffic
    drift = "Fruit stall plums apples pears today:"
    second = [_task(_question("alpha", i, drift), f"d{i}") for i in range(100, 103)]
    second += [_task(f"Weather forecast for Paris, day {i}?", f"w{i}") for i in range(5)]
    two = find_kinds(second, known, KindConfig(), "n2")
    assert {t.kind for t in second[:3]} == {ids["alph"]}  # the same id, though it drifted
    (weather,) = two.new
    assert {t.kind for t in second[3:]} == {weather} and weather not in ids.values()
    after = {k.id: k for k in two.kinds}
    assert after[ids["beta"]] == next(k for k in known if k.id == ids["beta"])  # quiet: as it was
    assert after[ids["alph"]].nights == 2 and after[ids["alph"]].last_night == "n2"
    assert "plums" in after[ids["alph"]].centroid  # its centroid follows its traffic
    assert two.quiet(ids["beta"]) and not two.quiet(ids["alph"])


def test_recall_shares_its_cap_among_kinds_so_a_heavy_kind_cannot_crowd_out_a_rare_one(tmp_path):
    rare = [
        _task(
            _question("beta", i),
            f"b{i}",
            split="val" if i % 2 else "train",
            kind="beta",
            created_at=100.0 + i,
        )  # fmt: skip
        for i in range(6)
    ]
    heavy = [
        _task(_question("alpha", i), f"a{i}", split="train", kind="alpha", created_at=1000.0 + i)
        for i in range(30)
    ]
    kept = recall.remember(PROJECT, tmp_path, "n2", heavy, [recall.Recalled(t, "n1") for t in rare],
                           set(), 20)  # fmt: skip
    pool = recall.load(PROJECT, tmp_path)
    assert kept == len(pool) == 20
    rare_kept = {r.task.id: r.task.split for r in pool if r.task.kind == "beta"}
    assert rare_kept == {t.id: t.split for t in rare}  # every rare task, with its split
    heavy_kept = [r.task.id for r in pool if r.task.kind == "alpha"]
    assert heavy_kept == [f"a{i}" for i in range(29, 15, -1)]  # the heavy kind's newest 14
    # a task asked again takes its recalled kind with its split
    again = _task(_question("beta", 1), "b1-again")
    tasks, _, _ = recall.combine([again], pool, threshold=0.8, private_ok=True)
    assert (again.split, again.kind) == ("val", "beta") and len(tasks) == 20


# ---- many skills: a kind that goes quiet ------------------------------------------------------


def fill(log_at, rules: tuple[str, ...], n: int, start: int = 0) -> None:
    """`n` requests of each of `rules` (numbered from `start`), each corrected by the operator."""
    log = TaskLog(log_at)
    for i in range(start, start + n):
        for rule in rules:
            text = _question(rule, i)
            a, b = i + 1, 7 * i + (3 if rule == "alpha" else 5)
            log.add(Interaction(messages=[{"role": "user", "content": text}],
                                reply=f"Answer: {a + b + 1}", project=PROJECT, source="proxy",
                                feedback=Feedback(thumb="down", reference=str(a + b))))  # fmt: skip
    log.close()


def _kinds(night: NightResult) -> dict:
    return {k.id: k for k in night.kinds}


def test_a_quiet_kind_keeps_its_skill_byte_for_byte_and_is_not_gated_again(tmp_path):
    home, log_at = tmp_path, tmp_path / "log.db"
    cfg = SleepConfig(home=home, log_path=log_at, auto_adopt=True, many_skills=True,
                      training=night_training_defaults())  # fmt: skip
    fill(log_at, ("alpha", "beta"), 12)
    (one,) = run_night(cfg, models=two_rule_models())
    assert one.status == "adopted", one.reason
    kind_of = {t.prompt_head.split("[needs ")[1][:4]: t.kind for t in one.tasks()}
    fruit, invoice = kind_of["alph"], kind_of["beta"]
    assert staging.current_version(Unit(PROJECT, invoice), home) == 1  # its skill: its name
    invoice_files = unit_files(home, invoice)

    fill(log_at, ("alpha",), 12, start=100)  # night 2: fruit traffic only
    (two,) = run_night(cfg, models=two_rule_models())
    assert unit_files(home, invoice) == invoice_files  # not dropped, not overwritten
    assert invoice not in {s.name for s in two.skills}  # neither trained nor gated again
    assert not (two.night_dir / "skillset" / "skills" / invoice).exists()
    quiet = _kinds(two)[invoice]
    assert quiet.quiet and quiet.skill == invoice and quiet.skill_status == "kept"
    assert quiet.recalled.get("val", 0) > 0  # its recalled val still guards it
    assert quiet.recalled_val is not None and quiet.recalled_val.after == 1.0  # retained
    assert _kinds(two)[fruit].mined == 12 and fruit in {s.name for s in two.skills}

    fill(log_at, ("beta",), 12, start=200)  # night 3: the invoices come back
    (three,) = run_night(cfg, models=two_rule_models())
    back = _kinds(three)[invoice]  # the same kind, the same id
    assert back.mined == 12 and back.recalled.get("train", 0) > 0 and not back.new
    (entry,) = [s for s in three.skills if s.name == invoice]  # trained again, on its recall
    old_train = {t.id for t in one.tasks() if t.kind == invoice and t.split == "train"}
    assert old_train & set(entry.train_ids)
    saved = {k.id: k for k in load_kinds(PROJECT, home)}
    assert saved[invoice].nights == 2 and saved[invoice].last_night == three.night
    assert saved[fruit].nights == 2 and set(saved) == {fruit, invoice}

    # the report: kinds[] reads back key for key; report.md and `sleep status` show each kind
    report = staging.read_report(three.night_dir)
    assert NightResult.from_report(PROJECT, three.night_dir, report).report_dict() == report
    text = (two.night_dir / "report.md").read_text()
    assert "## Kinds of request" in text and f"| {invoice} |" in text and "quiet tonight" in text
    status = CliRunner().invoke(cli.app, ["sleep", "status", "--project", PROJECT],
                                env={"SELFTAUGHT_HOME": str(home)})  # fmt: skip
    assert status.exit_code == 0, status.output
    line = next(x for x in status.output.splitlines() if x.strip().startswith(f"kind {invoice}"))
    assert f"skill {invoice} version" in line
    assert f"{two.night} 1.00→1.00 (quiet)" in line and f"{one.night} 0.00→1.00" in line


# ---- one skill: a quiet kind's recalled val vetoes a regression --------------------------------


def _swap_models(swap: bool):
    """Night one's analyst writes the invoices' rule; night two's (`swap`) only swaps the
    fruit rule in for it: a candidate that wins the fruit requests and loses every invoice."""
    from selftaught.sleep.night.cycle import NightModels
    from tests.scripted import append, canned_analyst, edits_json, rule_target

    def failure(messages):
        if swap:
            return edits_json({"op": "replace", "target": "rule beta", "content": "rule alpha",
                               "rationale": "scripted"})  # fmt: skip
        return edits_json(append("rule beta"))

    return NightModels(rule_target(), "scripted-target", canned_analyst(failure=failure),
                       "scripted-analyst")  # fmt: skip


@pytest.mark.parametrize("veto", [True, False])
def test_with_one_skill_a_quiet_kinds_recalled_val_vetoes_a_regression(tmp_path, veto):
    home, log_at = tmp_path, tmp_path / "log.db"
    training = night_training_defaults()
    if not veto:
        from dataclasses import replace

        training = replace(training, gate=replace(training.gate, tag_alpha=None))
    cfg = SleepConfig(home=home, log_path=log_at, auto_adopt=True, training=training)
    fill(log_at, ("beta",), 20)
    (one,) = run_night(cfg, models=_swap_models(False))
    assert one.status == "adopted" and "rule beta" in read_adopted(PROJECT, home).skill
    fill(log_at, ("alpha",), 50, start=100)  # the invoices go quiet
    (two,) = run_night(cfg, models=_swap_models(True))
    (invoice,) = [k for k in two.kinds if k.quiet]
    assert invoice.recalled["val"] >= 4  # enough for its sign test to reach p <= 0.1
    assert two.gate is not None
    if veto:  # the default: the total rose, the invoices' recalled val vetoed it
        assert two.gate.tag_alpha == 0.1
        assert two.status == "no_proposal", two.reason
        assert f"tag 'kind:{invoice.id}' lost" in two.reason and "beats best by" in two.reason
        assert "rule beta" in read_adopted(PROJECT, home).skill
        assert invoice.recalled_val is not None and invoice.recalled_val.after == 1.0
    else:  # without it the night ships the regression: what the veto is for
        assert two.status == "adopted", two.reason
        assert "rule beta" not in read_adopted(PROJECT, home).skill
        assert invoice.recalled_val is not None and invoice.recalled_val.after == 0.0


def test_sleep_run_vetoes_per_kind_by_default_and_0_turns_it_off():
    from selftaught.cli.sleep import _night_gate

    assert night_training_defaults().gate.tag_alpha == 0.1
    assert _night_gate("on", None, 1.0, None, 0.1, None).tag_alpha == 0.1
    assert _night_gate("on", None, 1.0, None, 0.0, None).tag_alpha is None
    text = CliRunner().invoke(cli.app, ["sleep", "run", "--help"], terminal_width=300).output
    assert "0: off" in " ".join(text.split())


def test_the_demo_mode_choice_is_vetoed_per_kind_too():
    from selftaught.sleep.night.demo_modes import decide_mode

    tags = {f"a{i}": ["kind:a"] for i in range(8)} | {f"b{i}": ["kind:b"] for i in range(4)}
    none = {f"a{i}": 0.0 for i in range(8)} | {f"b{i}": 1.0 for i in range(4)}
    static = {f"a{i}": 1.0 for i in range(8)} | {f"b{i}": 0.0 for i in range(4)}  # +8, -4
    training = night_training_defaults()
    metrics = {"none": none, "static": static}
    assert decide_mode(metrics, "none", training)[0] == "static"  # the total alone: +4
    winner, gates = decide_mode(metrics, "none", training, tags)
    assert winner == "none" and "tag 'kind:b' lost 4 of 4" in gates["static"]["reason"]


def test_past_max_skills_the_kinds_with_the_fewest_train_tasks_are_held():
    from selftaught.sleep.night.kinds import NightKinds
    from selftaught.sleep.night.skills import kind_clusters
    from selftaught.sleep.night.split import NightTask

    sizes = {"big": 9, "mid": 6, "small": 5}
    tasks = [
        _task(f"{name} request {i}", f"{name}{i}", split="train", kind=name)
        for name, n in sizes.items()
        for i in range(n)
    ]
    kinds = NightKinds(tuple(Kind(k) for k in sizes), (), tuple(tasks))
    task = NightTask(PROJECT, {"train": tasks, "val": [], "test": []})
    clusters = {c.name: c for c in kind_clusters(kinds, task, (), max_skills=2)}
    assert [clusters[k].hold is None for k in sizes] == [True, True, False]
    assert "over --max-skills 2" in str(clusters["small"].hold)


def test_a_forget_takes_a_forgotten_rows_words_out_of_the_kinds(tmp_path):
    from selftaught.sleep.forget import drop_forgotten
    from selftaught.sleep.intake.log import LogFilter
    from tests.test_sleep_cycle import config, fill_log, models
    from tests.test_sleep_forget import BOB, MARKER, bobs_rows

    fill_log(tmp_path, ["alpha"] * 12)
    bobs_rows(tmp_path / "log.db")  # his own words, in four requests of his: a kind of theirs
    run_night(config(tmp_path), models=models())
    words = MARKER.lower().split("-")[:-1]  # qzx, bobs, own, words (his number-word too)
    kinds_file = (tmp_path / "projects" / PROJECT / "kinds.json").read_text()
    assert all(w in kinds_file for w in words)
    log = TaskLog(tmp_path / "log.db")
    log.forget(LogFilter(client=BOB))
    assert drop_forgotten(PROJECT, tmp_path, log).kinds == 2
    log.close()
    kinds_file = (tmp_path / "projects" / PROJECT / "kinds.json").read_text()
    assert not any(w in kinds_file for w in words)
    (left,) = load_kinds(PROJECT, tmp_path)  # his kind went, id and all; the other's rebuilt
    assert left.centroid and "alpha" in left.terms
