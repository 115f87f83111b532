"""Kinds of request (`sleep/night/kinds.py`): found from the traffic, kept across nights; recall
shares its cap among them; a quiet kind's skill is left alone (many skills) and its recalled val
tasks veto a regression (one skill); the report and `sleep status` show each kind."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from selftaught import cli
from selftaught.skill.clustering import intent_tokens
from selftaught.sleep.adoption import staging
from selftaught.sleep.intake.log import Feedback, Interaction, TaskLog
from selftaught.sleep.kinds_file import Kind, load_kinds, save_kinds
from selftaught.sleep.night import recall
from selftaught.sleep.night.cycle import NightConfig, night_training_defaults, run_night
from selftaught.sleep.night.kinds import KindConfig, find_kinds
from selftaught.sleep.night.mine import MinedTask
from selftaught.sleep.paths import Unit, read_adopted
from selftaught.sleep.result import NightResult
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


def test_a_quoted_text_is_the_instance_not_the_intent():
    ask = 'How many times does the letter "e" appear in the text: "{}"?'
    words = intent_tokens(ask.format("seven green geese"))
    assert {"letter", "appear", "text"} <= set(words) and not {"seven", "geese"} & set(words)
    assert intent_tokens('"reverse these words"') == ["reverse", "words"]  # all quoted: kept
    texts = ["blue whales swim far", "old maps of rome", "jazz on a rainy night", "tax forms"]
    tasks = [_task(ask.format(t), f"c{i}") for i, t in enumerate(texts)]
    tasks += [_task(f"Convert {i} miles to km, please.", f"m{i}") for i in range(4)]
    found = find_kinds(tasks, (), KindConfig(), "n1")
    assert len(found.kinds) == 2 and len({t.kind for t in tasks[:4]}) == 1


def test_a_rare_request_like_no_kind_waits_with_none_instead_of_joining_the_largest():
    tasks = [_task(f"Convert {i} miles to km, please.", f"m{i}") for i in range(6)]
    tasks.append(_task("Write a haiku about autumn leaves.", "h0"))  # one of its kind
    found = find_kinds(tasks, (), KindConfig(), "n1")
    assert tasks[-1].kind is None and {t.kind for t in tasks[:6]} == {found.kinds[0].id}
    assert len(found.kinds) == 1  # no kind founded or moved on the haiku's words
    # the next night, a second one like it: the two found their kind (recall kept it kindless)
    again = [tasks[-1], _task("Write a haiku about winter snow.", "h1")]
    two = find_kinds(again, found.kinds, KindConfig(), "n2", not_traffic={"h0"})
    (haiku,) = two.new
    assert {t.kind for t in again} == {haiku}


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
    cfg = NightConfig(home=home, log_path=log_at, auto_adopt=True, many_skills=True,
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
    cfg = NightConfig(home=home, log_path=log_at, auto_adopt=True, training=training)
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
    assert winner == "none" and "tag 'kind:b' lost 4 of 4" in gates["static"].reason


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
    from selftaught.sleep.intake.log import LogFilter
    from selftaught.sleep.night.forget import drop_forgotten
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


# ---- routing a request by its kind ------------------------------------------------------------

HEADS = {  # two kinds of request, each in three wordings
    "fruit": (
        "Fruit stall, apples and pears: what is {a} + {b}?",
        "Apples and pears at the fruit stall: what is {a} + {b}?",
        "At the fruit stall, pears then apples: what is {a} + {b}?",
    ),
    "invoice": (
        "Invoice ledger totals: what is {a} + {b}?",
        "Ledger of invoice totals: what is {a} + {b}?",
        "Totals in the invoice ledger: what is {a} + {b}?",
    ),
}
PARAPHRASES = {  # wordings no night saw
    "fruit": (
        "How much do apples and pears cost at the fruit stall, 4 and 9?",
        "Pears plus apples from the fruit stall: 3 and 8, total?",
        "The fruit stall sold apples for 5 and pears for 7; the sum?",
        "fruit stall: apples 2, pears 3. add them",
    ),
    "invoice": (
        "What is the invoice ledger total of 3 and 4?",
        "Invoice ledger: what are the totals of 40 and 12?",
        "Sum the invoice totals in the ledger: 10, 7.",
        "Two invoice totals from the ledger, 5 and 9: add them up",
    ),
}
UNSEEN = "What is the weather in Paris today?"  # of a kind no night saw; shares "what"


def _two_kinds(home) -> dict[str, str]:
    """A night's kinds of the fruit and the invoice requests, saved as kinds.json: each
    intent's kind id."""
    tasks = [
        _task(head.format(a=3 * i + 1, b=5 * i + 2), f"{name}-{i}-{j}")
        for name, heads in HEADS.items()
        for i in range(4)
        for j, head in enumerate(heads)
    ]
    found = find_kinds(tasks, (), KindConfig(), "n1")
    save_kinds(PROJECT, home, found.kinds)
    ids = {name: {t.kind for t in tasks if t.id.startswith(name)} for name in HEADS}
    assert len(found.kinds) == 2 and all(len(kinds) == 1 for kinds in ids.values())
    return {name: kinds.pop() for name, kinds in ids.items()}


def _adopt_kind_skill(home, kind: str, intent: str, adapter: bytes | None = None) -> None:
    """Adopt kind `kind`'s skill (its train tasks on its card, as a night stages it), with an
    adapter when `adapter` (its weights' bytes)."""
    from selftaught.runs import atomic_write_json
    from selftaught.sleep.adoption.skill_units import (
        adopt_skill,
        skill_adapter_dir,
        write_skill_proposal,
    )
    from selftaught.sleep.records import AdapterRecord, SkillRecord
    from tests.test_sleep_skill_adapters import fake_adapter

    folder = staging.nights_dir(PROJECT, home) / f"n-{kind}"
    record = None
    if adapter is not None:
        fake_adapter(skill_adapter_dir(folder, kind), adapter)
        record = AdapterRecord(dir="adapter", method="sft", base_model="local")
    tasks = tuple(head.format(a=1, b=2) for head in HEADS[intent])
    entry = SkillRecord(name=kind, description=f"Answer the {intent} questions.",
                        status="staged", reason="accepted", tasks=tasks, adapter=record,
                        dir=f"skills/{kind}")  # fmt: skip
    write_skill_proposal(folder, PROJECT, entry, f"RULE {intent}", home)
    report = {"kind": staging.NIGHT_KIND, "night": folder.name, "project": PROJECT,
              "status": "staged", "skills": [entry.to_dict()]}  # fmt: skip
    atomic_write_json(folder / "report.json", report)
    adopt_skill(PROJECT, kind, home=home)


def _route(home, text: str):
    from selftaught.sleep.adoption.skill_units import route_request

    return route_request(PROJECT, home, [{"role": "user", "content": text}])


def test_a_request_of_a_kind_with_no_skill_is_not_served_another_kinds_skill(tmp_path):
    """Only the fruit kind has a skill: an invoice request, and one of a kind no night saw,
    share "what" with the fruit skill's card (the card router alone sends them there) but are
    of no fruit kind: they get no skill (the project's, or the base); a fruit request gets
    the fruit skill."""
    from selftaught.skill.routing import SkillRouter
    from selftaught.sleep.adoption.skill_units import adopted_skills

    kinds = _two_kinds(tmp_path)
    _adopt_kind_skill(tmp_path, kinds["fruit"], "fruit")
    cards = SkillRouter([s.card for s in adopted_skills(PROJECT, tmp_path)])
    invoice = PARAPHRASES["invoice"][0]
    assert cards.route(invoice).skill == cards.route(UNSEEN).skill == kinds["fruit"]
    routed, decision = _route(tmp_path, invoice)
    assert routed is None and decision is not None
    assert (decision.route.skill, decision.route.kind, decision.version) == (
        None,
        kinds["invoice"],
        0,
    )
    routed, decision = _route(tmp_path, UNSEEN)
    assert routed is None and decision is not None and decision.route.kind is None
    routed, decision = _route(tmp_path, PARAPHRASES["fruit"][0])
    assert routed is not None and decision is not None
    assert (routed.name, routed.skill, decision.route.kind) == (
        kinds["fruit"],
        "RULE fruit",
        kinds["fruit"],
    )


def test_with_both_kinds_adopted_each_paraphrase_routes_to_its_own_kinds_skill(tmp_path):
    kinds = _two_kinds(tmp_path)
    for intent, kind in kinds.items():
        _adopt_kind_skill(tmp_path, kind, intent)
    for intent, texts in PARAPHRASES.items():
        for text in texts:
            routed, decision = _route(tmp_path, text)
            assert routed is not None and decision is not None, text
            assert (routed.name, decision.route.kind) == (kinds[intent], kinds[intent]), text
            assert decision.route.score >= KindConfig().similarity
    assert _route(tmp_path, UNSEEN)[0] is None


def test_the_local_upstream_answers_a_kind_with_no_skill_with_the_projects_adapter(tmp_path):
    """Through the proxy: the fruit kind's skill has its adapter, the project has a shared
    one; an invoice request, or one of an unseen kind, is answered by the shared adapter,
    never the fruit kind's."""
    from tests.test_sleep_adapters import stage_night
    from tests.test_sleep_skill_adapters import Merges, _ask, _local_proxy, fake_adapter

    home = tmp_path / "home"
    kinds = _two_kinds(home)
    stage_night(home, "p1", skill="", adapter=fake_adapter(tmp_path / "shared", b"shared"))
    staging.adopt(PROJECT, "p1", home=home)
    _adopt_kind_skill(home, kinds["fruit"], "fruit", adapter=b"f1")
    running, _ = _local_proxy(home, tmp_path, Merges())
    with running as (url, _):
        fruit = PARAPHRASES["fruit"][1]
        assert _ask(url, fruit) == f"adapter {kinds['fruit']}/f1: {fruit[:12]}"
        invoice = PARAPHRASES["invoice"][0]
        assert _ask(url, invoice) == f"adapter demo/shared: {invoice[:12]}"
        assert _ask(url, UNSEEN) == f"adapter demo/shared: {UNSEEN[:12]}"


def test_routing_reads_and_indexes_the_kinds_once_until_kinds_json_changes(tmp_path, monkeypatch):
    """Routing costs the request's words, not a rebuild: 40 requests read kinds.json, index
    its centroids and build the router once; a night that writes kinds.json again (a new
    kind) is read once more, and its new kind routes."""
    from selftaught.skill.routing import KindIndex, SkillRouter
    from selftaught.sleep import kinds_file

    kinds = _two_kinds(tmp_path)
    for intent, kind in kinds.items():
        _adopt_kind_skill(tmp_path, kind, intent)
    weather = [_task(f"Weather in {city}: rain or sun tomorrow?", f"w{i}")
               for i, city in enumerate(("Paris", "Oslo", "Rome", "Lima"))]  # fmt: skip
    later = find_kinds(weather, load_kinds(PROJECT, tmp_path), KindConfig(), "n2")  # next night's
    calls: dict[str, int] = {"read": 0, "index": 0, "router": 0}

    def counted(name, real):
        def wrapper(*args, **kw):
            calls[name] += 1
            return real(*args, **kw)

        return wrapper

    monkeypatch.setattr(kinds_file, "read_kinds", counted("read", kinds_file.read_kinds))
    monkeypatch.setattr(KindIndex, "__post_init__", counted("index", KindIndex.__post_init__))
    monkeypatch.setattr(SkillRouter, "__init__", counted("router", SkillRouter.__init__))
    texts = [*PARAPHRASES["fruit"], *PARAPHRASES["invoice"]] * 5
    routes = [_route(tmp_path, text)[1] for text in texts]
    assert [r.route.kind for r in routes if r is not None] == [
        kinds["fruit" if text in PARAPHRASES["fruit"] else "invoice"] for text in texts
    ]
    rain = "Rain or sun in Berlin tomorrow? The weather, please."
    assert _route(tmp_path, rain)[1] == _route(tmp_path, UNSEEN)[1]  # of no kind yet
    assert calls == {"read": 1, "index": 1, "router": 1}
    save_kinds(PROJECT, tmp_path, later.kinds)
    (new,) = later.new
    for _ in range(10):
        _, decision = _route(tmp_path, rain)
        assert decision is not None and (decision.route.kind, decision.route.skill) == (new, None)
    assert calls == {"read": 2, "index": 2, "router": 2}


def test_a_starting_skills_card_takes_only_the_requests_of_no_known_kind(tmp_path):
    """The night asks each request the proxy's question: a user's SKILL.md whose description
    shares words with a known kind's requests does not take them (they are of that kind); it
    takes the requests of no kind that its card routes."""
    from selftaught.skill.routing import SkillCard

    kinds = _two_kinds(tmp_path)
    user = SkillCard("stall-weather", "Weather at the fruit stall: rain or sun at the market")
    tonight = [_task(text, f"p{i}") for i, text in enumerate(PARAPHRASES["fruit"])]
    market = "Will rain or sun come to the market on day {}?"
    tonight += [_task(market.format(i), f"m{i}") for i in range(4)]
    found = find_kinds(tonight, load_kinds(PROJECT, tmp_path), KindConfig(), "n2", seeds=[user])
    assert [t.kind for t in tonight] == [kinds["fruit"]] * 4 + ["stall-weather"] * 4
    assert found.new == ("stall-weather",)
