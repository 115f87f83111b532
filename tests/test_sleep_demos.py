"""Sleep learns from what users did: corrected replies become demonstrations, the adopted
demos reach the deployed agent (injected as the policy renders them, stripped from the log),
retrieval of the most similar demos per request, and the night's three-way demo gate."""

from __future__ import annotations

import json
import re
import sys

import pytest

from selftaught.demos import Demo, join_skill, split_skill
from selftaught.policy import Policy
from selftaught.retrieval import DemoRetriever, RetrievalUnavailable
from selftaught.sleep.adoption import staging
from selftaught.sleep.adoption.inject import inject_adopted, strip_injected, strip_injected_messages
from selftaught.sleep.adoption.staging import write_live_file
from selftaught.sleep.intake.log import Feedback, Interaction, TaskLog
from selftaught.sleep.night.cycle import mine, run_night
from selftaught.sleep.night.demo_modes import DemoModeConfig
from selftaught.sleep.night.mine import MineConfig
from selftaught.sleep.night.split import SplitConfig
from selftaught.sleep.paths import Adopted
from selftaught.tasks.base import Example
from tests.scripted import ScriptedModel, canned_analyst
from tests.test_sleep_cycle import config, fill_log, models

_Q = re.compile(r"What is (\d+) \+ (\d+)\?")


def few_shot(messages: list[dict]) -> str:
    """Right only when the prompt holds a worked example (a prior assistant turn)."""
    a, b = map(int, _Q.search(messages[-1]["content"]).groups())
    shots = any(m["role"] == "assistant" for m in messages[:-1])
    return f"{a + b}" if shots else f"{a + b + 1}"


def test_a_corrected_reply_is_mined_as_a_correction_demo_source():
    fixed = Interaction(
        messages=[{"role": "user", "content": "What is 2 + 2?"}],
        reply="5",
        feedback=Feedback(reference="4"),
    )
    logged = Interaction(
        messages=[{"role": "user", "content": "What is 3 + 3?"}], reply="6", reference="6"
    )
    (a, b), _ = mine([fixed, logged], MineConfig())
    assert a.state.demo_source == "correction"
    assert not b.state.has("demo_source")  # a logged reference is not the user's correction


def test_a_night_turns_corrected_train_replies_into_demonstrations(tmp_path):
    fill_log(tmp_path, ["alpha"] * 12)  # each reply corrected by the user (feedback reference)
    (night,) = run_night(config(tmp_path), models=models(ScriptedModel(few_shot), canned_analyst()))
    assert night.status == "staged", night.reason
    parts = split_skill((night.night_dir / "proposal" / "skill.md").read_text())
    assert parts.demos and {d.source for d in parts.demos} == {"correction"}
    train = {
        r["id"]
        for r in map(json.loads, (night.night_dir / "tasks.jsonl").read_text().splitlines())
        if r["split"] == "train"
    }
    assert {d.id for d in parts.demos} <= train  # only train tasks feed demos
    assert night.proposal.val_after.score.hard == 1.0


# ---- injection: rendered as the policy renders it, stripped again ---------------------------

DEMOS = [
    Demo("d1", "What is the capital of France?", "Paris", "correction"),
    Demo("d2", "How many legs has a spider?", "Eight", "bootstrap"),
    Demo("d3", "What is the capital of Peru?", "Lima", "correction"),
]
_MARK = re.compile(r"<!-- /?selftaught:[^>]*-->\n?")


class _Chat:
    name, kind, instructions = "chat", "agent", ""


def policy_messages(skill: str, messages: list[dict]) -> list[dict]:
    return Policy(skill=skill).messages(_Chat(), Example("request", messages))


@pytest.mark.parametrize("placement", ["turns", "system"])
@pytest.mark.parametrize("client_system", [True, False])
def test_injection_renders_the_demos_as_the_policy_does_and_strips_them(placement, client_system):
    skill = join_skill("Answer in one word.", DEMOS[:2], placement)
    msgs = [{"role": "user", "content": "What is the capital of Spain?"}]
    if client_system:
        msgs.insert(0, {"role": "system", "content": "You are terse."})
    sent = inject_adopted(msgs, Adopted(skill, "", "3"))
    want = policy_messages(skill, msgs)
    assert '{"id"' not in json.dumps(sent)  # no raw demos block reaches the model
    assert _MARK.sub("", sent[0]["content"]).strip() == want[0]["content"]  # markers aside
    assert sent[1:] == want[1:]  # the same turns (or none), then the client's conversation
    assert strip_injected_messages(sent) == msgs and msgs[-1]["content"].endswith("Spain?")


def test_a_retrieval_pool_injects_the_most_similar_demos_per_request():
    pytest.importorskip("bm25s")  # the [retrieval] extra
    skill = join_skill("Be brief.", DEMOS, "turns", retrieve=2)
    sent = inject_adopted([{"role": "user", "content": "The capital of Chile?"}], Adopted(skill))
    shown = [m["content"] for m in sent if m["role"] == "user"][:-1]
    assert shown == ["What is the capital of France?", "What is the capital of Peru?"]
    assert "turns=4" in sent[0]["content"]
    assert strip_injected_messages(sent) == [{"role": "user", "content": "The capital of Chile?"}]


def test_a_live_file_gets_the_demos_as_a_worked_examples_section(tmp_path):
    path = tmp_path / "AGENTS.md"
    path.write_text("# My agent\n")
    write_live_file(path, Adopted(join_skill("Be brief.", DEMOS[:1]), "", "2"))
    text = path.read_text()
    assert "## Worked examples" in text and "Reply: Paris" in text and '{"id"' not in text
    assert strip_injected(text).strip() == "# My agent"


# ---- retrieval ------------------------------------------------------------------------------


def test_bm25_picks_the_most_similar_demo_never_the_item_itself_nor_an_unrelated_one():
    pytest.importorskip("bm25s")  # the [retrieval] extra
    r = DemoRetriever(DEMOS)
    assert [d.id for d in r.pick("capital of Peru, please", 1)] == ["d3"]
    assert [d.id for d in r.pick("spider legs?", 3)] == ["d2"]  # no shared token: not shown
    assert r.pick("What is the capital of Peru?", 3, exclude={"d3"})[0].id == "d1"
    pool = join_skill("", DEMOS, "turns", retrieve=1)
    ex = Example("d3", "What is the capital of Peru?")  # a val item equal to a pool id
    assert [d.id for d in Policy(skill=pool).demos_for(ex)] == ["d1"]


def test_retrieval_without_bm25s_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "bm25s", None)
    skill = join_skill("", [Demo("x9", "What is 9 + 9?", "18")], "turns", retrieve=1)
    with pytest.raises(RetrievalUnavailable, match=r"selftaught\[retrieval\]"):
        Policy(skill=skill).messages(_Chat(), Example("e", "What is 9 + 8?"))
    with pytest.raises(RetrievalUnavailable, match="bm25s"):
        DemoModeConfig(retrieval="on")


# ---- the night's three-way demo gate --------------------------------------------------------

_TAG = re.compile(r"\[needs (\w+)\]")
TAGS = ["alpha", "beta", "gamma", "delta"]


class TagTarget(ScriptedModel):
    """Right only when the first worked example shown has the request's tag (so one static
    block helps a quarter of the tasks, retrieval all of them); records the demos it saw."""

    def __init__(self) -> None:
        super().__init__(self.answer, "tag-target")
        self.seen: list[str] = []

    def answer(self, messages: list[dict]) -> str:
        ask = messages[-1]["content"]
        a, b = map(int, _Q.search(ask).groups())
        shown = [m["content"] for m in messages[:-1] if m["role"] == "user"]
        self.seen += shown
        ok = shown and _TAG.search(shown[0]).group(1) == _TAG.search(ask).group(1)
        return f"{a + b}" if ok else f"{a + b + 1}"


def fill_tagged(home, n: int, start: int = 0) -> None:
    """Corrected requests, four tags in turn; no number is shared by two requests, so the
    tag is the only word BM25 can match them on."""
    log = TaskLog(home / "log.db")
    for i in range(start, start + n):
        a, b = 100 + i, 500 + i
        log.add(
            Interaction(
                messages=[{"role": "user", "content": f"[needs {TAGS[i % 4]}] What is {a} + {b}?"}],
                reply=str(a + b + 1),
                project="demo",
                source="proxy",
                feedback=Feedback(thumb="down", reference=str(a + b)),
            )
        )
    log.close()


def night_rows(night) -> dict[str, dict]:
    rows = map(json.loads, (night.night_dir / "tasks.jsonl").read_text().splitlines())
    return {r["id"]: r for r in rows}


def test_retrieved_demos_win_the_three_way_gate_and_never_show_a_held_out_task(tmp_path):
    pytest.importorskip("bm25s")  # the [retrieval] extra
    fill_tagged(tmp_path, 32)
    target = TagTarget()
    cfg = config(tmp_path, split=SplitConfig(val_fraction=0.4))
    (night,) = run_night(cfg, models=models(target, canned_analyst()))
    assert night.status == "staged", night.reason
    modes = night.phases["skill"].demo_modes
    assert set(modes.candidates) >= {"none", "static", "retrieved"}
    assert modes.winner == "retrieved" and modes.incumbent != "retrieved"
    assert modes.candidates["retrieved"].score.hard == 1.0
    assert modes.gates["retrieved"].decision == "accept_new_best"
    assert modes.candidates["static"].score.hard < 0.5
    parts = split_skill((night.night_dir / "proposal" / "skill.md").read_text())
    assert parts.retrieve == 4 and {d.source for d in parts.demos} == {"correction"}
    rows = night_rows(night)
    train = {r["prompt_head"] for r in rows.values() if r["split"] == "train"}
    assert {d.input_text() for d in parts.demos} <= train  # the pool: train tasks only
    assert set(target.seen) <= train  # no val task was ever shown as a demo, to any candidate
    md = (night.night_dir / "report.md").read_text()
    assert "Winner: **retrieved**" in md and "| retrieved | 1.000" in md and "95% CI" in md
    assert "smallest gain the gate could accept" in md

    staging.adopt("demo", night.night, home=tmp_path)  # the next night starts there
    fill_tagged(tmp_path, 4, start=100)
    (second,) = run_night(cfg, models=models(target, canned_analyst()))
    assert not second.failed, second.reason
    assert any("retrieves from a pool" in n for n in second.notes)
    again = second.phases["skill"].demo_modes  # the adopted pool still retrieves
    assert again.candidates["adopted"].score.hard == 1.0 and again.winner == "adopted"
    assert second.status == "no_proposal" and "demos: kept the adopted skill" in second.reason


def test_with_the_gate_off_the_best_val_mean_wins_and_ties_keep_the_incumbent():
    from selftaught.gate import GateConfig
    from selftaught.skill.config import SkillOptConfig
    from selftaught.sleep.night.demo_modes import decide_mode

    off = SkillOptConfig(gate=GateConfig(accept_all=True))
    on = SkillOptConfig(gate=GateConfig())
    metrics = {
        "static": {"a": 1.0, "b": 0.0, "c": 0.0},
        "none": {"a": 1.0, "b": 1.0, "c": 0.0},  # +1 item: more than static, not > margin 1
        "retrieved": {"a": 1.0, "b": 0.0, "c": 0.0},
    }
    assert decide_mode(metrics, "static", off)[0] == "none"
    assert decide_mode(metrics, "static", on)[0] == "static"
    tie = {"static": {"a": 1.0}, "retrieved": {"a": 1.0}}
    assert decide_mode(tie, "static", off)[0] == "static"
