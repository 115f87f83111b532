"""The stream benchmark (benchmarks/bench_stream.py, issue 62): its drift schedule, each kind's
check, the users' phrasings (each read by the follow-up reader as meant), held-out items apart
from the stream and the same for a single-kind stream, the retention statistic, each
configuration's night, the report seeds' guard, and a quick run end to end on a scripted
upstream behind the proxy (resumed after a lost night), rendered by tables.py."""

from __future__ import annotations

import json
import re
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_stream as bs  # noqa: E402
import tables  # noqa: E402

from selftaught.errors import ConfigError  # noqa: E402
from selftaught.sleep.night.followup import read_followup  # noqa: E402
from selftaught.tasks.tools.calculator import calculate  # noqa: E402
from tests.fake_upstream import FakeUpstream  # noqa: E402


def small_args(*extra: str) -> Any:
    return bs.parse_args(["--requests-per-night", "8", "--heldout", "3", *extra])


def test_the_drift_schedule_is_what_the_issue_asks() -> None:
    table = [bs.night_counts(w, 16) for w in bs.SCHEDULE]
    assert table == list(bs.SCHEDULE) and len(table) >= 5
    assert len({json.dumps(n, sort_keys=True) for n in table}) == len(table)  # each mix differs
    arithmetic = [n["arithmetic"] for n in table]  # heavy early, rare later
    assert arithmetic[0] == max(table[0].values()) and arithmetic[-1] <= 1
    assert arithmetic == sorted(arithmetic, reverse=True)
    assert [n["text"] > 0 for n in table] == [True, False, False, True, True]  # gone, then back
    assert [n["tool"] > 0 for n in table] == [False, False, False, True, True]  # only late
    for per_night in (5, 8, 10, 24):
        for weights in bs.SCHEDULE:
            counts = bs.night_counts(weights, per_night)
            assert sum(counts.values()) == per_night
            assert all(counts[k] == 0 for k, w in weights.items() if w == 0)


def test_each_kind_is_checked_by_its_own_rule() -> None:
    stream = bs.make_stream(small_args())
    first = {r.kind: r for night in stream.nights for r in night[::-1]}
    right = {"arithmetic": first["arithmetic"].reference, "text": first["text"].reference,
             "rule": '{"answer": 3}', "tool": f"Answer: {first['tool'].reference}"}  # fmt: skip
    wrong = {"arithmetic": first["arithmetic"].reference.split()[0],  # the number, no unit
             "text": first["text"].reference.split(", ")[0], "rule": "3",
             "tool": "Answer: 1"}  # fmt: skip
    for kind, r in first.items():
        assert r.passes(right[kind]), kind
        assert not r.passes(wrong[kind]), kind
    assert bs.json_answer('Sure: {"answer": "4"}') and not bs.json_answer('{"count": 4}')


def test_the_users_words_are_read_as_meant() -> None:
    stream = bs.make_stream(small_args())
    by_kind = {r.kind: r for night in stream.nights for r in night}
    for kind, r in by_kind.items():
        for i, template in enumerate(bs.KINDS[kind].feedback):
            said = template.format(ref=r.reference)
            read = read_followup(said, "1")
            assert read is not None, said
            if kind == "rule":
                assert read.kind == "rule" and [x.kind for x in read.rules] == ["json"], said
            else:
                assert (read.kind, read.reference) == ("correction", r.reference), said
            if i % bs.REASK_EVERY != bs.REASK_EVERY - 1:
                assert bs.followup(replace(r, index=i), "1") == said
    for thanks in bs.THANKS:
        assert read_followup(thanks, "7 km").kind == "acceptance"  # type: ignore[union-attr]
    r = by_kind["arithmetic"]
    assert bs.followup(replace(r, index=bs.REASK_EVERY - 1), "1") is None  # a re-ask
    assert bs.followup(r, r.reference) in bs.THANKS


def test_heldout_items_stay_apart_and_are_the_same_for_a_single_kind_stream() -> None:
    mixed = bs.make_stream(small_args())
    single = bs.make_stream(small_args("--single-kind", "text"))
    assert mixed.heldout == single.heldout
    assert sorted({r.kind for r in mixed.heldout}) == sorted(bs.KIND_NAMES)
    assert all(sum(r.kind == k for r in mixed.heldout) == 3 for k in bs.KIND_NAMES)
    asked = {r.question for night in (*mixed.nights, *single.nights) for r in night}
    assert not asked & {r.question for r in mixed.heldout}
    assert [dict(n) for n in mixed.counts] == [bs.night_counts(w, 8) for w in bs.SCHEDULE]
    for night, counts in zip(mixed.nights, mixed.counts, strict=True):
        assert {k: sum(r.kind == k for r in night) for k in bs.KIND_NAMES} == counts
    assert {r.kind for night in single.nights for r in night} == {"text"}
    indexes = [r.index for night in mixed.nights for r in night]
    assert indexes == list(range(len(indexes)))


def test_retention_pairs_the_last_night_with_the_best_earlier_one() -> None:
    ids = [f"h{i}" for i in range(10)]
    start = dict.fromkeys(ids, 0.0)
    best = {i: 1.0 if n < 8 else 0.0 for n, i in enumerate(ids)}  # 8 of 10
    tie = {i: 1.0 if n >= 2 else 0.0 for n, i in enumerate(ids)}  # 8 of 10, later
    final = {i: 1.0 if n < 2 else 0.0 for n, i in enumerate(ids)}  # lost 6 of best's items
    r = bs.retention([start, best, tie, final])
    assert r is not None
    assert (r["best_night"], r["best"], r["final"]) == (1, 0.8, 0.2)
    assert (r["wins"], r["losses"]) == (0, 6)
    assert r["p_two_sided"] == pytest.approx(2 * 0.5**6) and r["forgot"]
    five = {i: 1.0 if n < 3 else 0.0 for n, i in enumerate(ids)}  # 5 losses: p 0.0625
    assert not bs.retention([start, best, five])["forgot"]  # type: ignore[index]
    assert bs.retention([start]) is None


def test_each_configuration_builds_its_night(tmp_path: Path) -> None:
    args = small_args()
    cfg = {name: bs.night_settings(name, args, tmp_path) for name in bs.CONFIGS[1:]}
    assert cfg["default"].recall_max > 0 and not cfg["default"].many_skills
    assert cfg["skills"].many_skills and cfg["skills"].recall_max > 0
    gepa = cfg["gepa-style"]
    assert gepa.recall_max == 0 and not gepa.many_skills and not gepa.training.gate.tag_veto
    assert not gepa.training.gate.accept_all
    ace = cfg["ace-style"]
    assert ace.recall_max == 0 and ace.training.gate.accept_all
    assert ace.training.edit_ops == ("append",) and ace.training.demos_max == 0
    assert all(c.auto_adopt and c.project == bs.common.PROJECT for c in cfg.values())
    weights = bs.parse_args(["--weights", "sft"])
    assert bs.night_settings("default", weights, tmp_path).weights == "sft"
    assert bs.night_settings("gepa-style", weights, tmp_path).weights == "off"
    # the two ways a many-skills night trains adapters, measured side by side (--configs)
    for name, mode in (("skills-per-skill", "per-skill"), ("skills-shared", "shared")):
        night = bs.night_settings(name, args, tmp_path)
        assert night.many_skills and night.weights == "sft" and night.skill_adapters == mode
        assert bs.night_settings(name, bs.parse_args(["--weights", "auto"]), tmp_path).weights == (
            "auto"
        )
    assert set(bs.ADAPTER_CONFIGS).isdisjoint(args.configs.split(","))  # not in a default run
    assert bs.parse_args(["--configs", "none,skills-shared"]).configs == "none,skills-shared"


def test_a_configuration_the_code_cannot_build_is_recorded_as_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(name: str, args: Any, home: Path) -> Any:
        raise ConfigError("many_skills trains text skills only")

    monkeypatch.setattr(bs, "night_settings", refuse)
    run = bs.Run(small_args(), bs.make_stream(small_args()), bs.DEPLOYMENTS["person"], None,
                 tmp_path)  # fmt: skip
    results: dict[str, Any] = {"configs": {}}
    assert bs.start_config("skills", run, results) is None
    assert results["configs"]["skills"]["unavailable"] == (
        "needs what the code lacks: many_skills trains text skills only"
    )
    assert bs.start_config("skills", run, results) is None  # and stays so on resume


def test_report_seeds_run_only_as_reported_runs_from_frozen_settings() -> None:
    frozen = json.loads(bs.SETTINGS_FILE.read_text())
    seed = str(frozen["report_seeds"][0])
    assert not set(frozen["dev_seeds"]) & set(frozen["report_seeds"])
    assert frozen["recommended"] in bs.CONFIGS
    assert all(set(r["configs"]) <= set(bs.CONFIGS) for r in frozen["runs"])
    with pytest.raises(SystemExit):  # a dev run on a report seed (argparse: exit 2)
        bs.parse_args(["--seed", seed])
    if not frozen["frozen"]["date"]:
        with pytest.raises(SystemExit, match="not frozen yet"):
            bs.parse_args(["--report", seed])


# ---- a quick run end to end -----------------------------------------------------------------


def scripted_reply(body: dict[str, Any], headers: dict[str, str]) -> Any:
    """A deployed agent that calls the calculator and reports its result, gives a word list
    back unreversed, counts one letter, answers arithmetic without the unit unless a
    demonstration shows it, and repeats a correction's number."""
    msgs = body["messages"]
    last, text = msgs[-1], str(msgs[-1].get("content") or "")
    shown = " ".join(str(m.get("content")) for m in msgs[:-1])
    if last.get("role") == "tool":
        return f"Answer: {last['content']}"
    if last.get("role") == "user" and re.match(r"(No|Wrong|That's)", text):
        return "Answer: " + re.findall(r"[-\d.]+", text)[-1]
    if body.get("tools"):
        found = re.search(r"What is (.*)\?", text)
        expr = found.group(1) if found else " * ".join(re.findall(r"\d+", text)[:2])
        call = {"name": "calculator", "arguments": json.dumps({"expression": expr})}
        return {"content": "", "tool_calls": [{"id": "c1", "type": "function", "function": call}]}
    if "distances in km" in text:
        value = calculate(text.split("Calculate ")[1].split(". The numbers")[0])
        return f"{value} km" if " km" in shown else value
    if "Reverse this list of words:" in text:
        return text.split("words:")[1].strip()
    return "1" if "How many times" in text else "ok"


def test_a_quick_run_end_to_end_resumes_and_renders(tmp_path: Path) -> None:
    out = tmp_path / "results" / "stream_report_fake_app_seed620.json"
    with FakeUpstream(chat_reply=scripted_reply) as up:
        argv = ["--quick", "--target", f"{up.base_url}#fake-model", "--configs", "none,default",
                "--deployment", "app", "--output", str(out)]  # fmt: skip
        bs.main(argv)
        saved = json.loads(out.read_text())
        assert saved["complete"] and list(saved["configs"]) == ["none", "default"]
        assert [s["requests"] for s in saved["schedule"]] == [
            bs.night_counts(bs.SCHEDULE[n - 1], 8) for n in bs.QUICK_NIGHTS
        ]
        for config in saved["configs"].values():
            assert [n["night"] for n in config["nights"]] == [0, 1, 2]
            for night in config["nights"]:
                assert {k: a["n"] for k, a in night["heldout"]["kinds"].items()} == dict.fromkeys(
                    bs.KIND_NAMES, 2
                )
            assert set(config["summary"]["kinds"]) == set(bs.KIND_NAMES)
        nights = saved["configs"]["default"]["nights"][1:]
        assert sum(n["traffic"]["requests_by_kind"]["tool"] for n in nights) > 0
        for night in nights:
            assert night["calls"]["traffic"] >= 2 * 8 and night["calls"]["heldout"] >= 8
            if night["traffic"]["requests_by_kind"]["tool"] and night["mined"] is not None:
                got = night["mined"]["tool"]  # episodes the user thanked: their answer checks
                assert got["train"] + got["val"] + got["test"] - got["recalled"] > 0
            if night["mined"] is not None:  # a kind with traffic and no task is said so
                for kind, sent in night["traffic"]["requests_by_kind"].items():
                    got = night["mined"][kind]
                    new = got["train"] + got["val"] + got["test"] - got["recalled"]
                    assert (sent > 0 and new == 0) == any(
                        n.startswith(f"{kind}:") for n in night["notes"]
                    )
        home = out.with_suffix(".state") / "default"
        listed = (home / "projects/bench/nights").glob("*/tasks.jsonl")
        rows = [json.loads(row) for f in listed for row in f.read_text().splitlines()]
        clients = {c for row in rows for c in row["clients"]}
        assert clients and clients <= set(bs.DEPLOYMENTS["app"].keys())  # end users, keyed

        # a run killed during night 2: its row is lost, its traffic and night left behind
        lost = saved["configs"]["default"]["nights"].pop()
        out.write_text(json.dumps(saved))
        bs.main(argv)
        again = json.loads(out.read_text())
    redone = again["configs"]["default"]["nights"][-1]
    assert again["configs"]["default"]["nights"][:2] == saved["configs"]["default"]["nights"]
    for key in ("status", "mining", "mined", "notes"):
        assert redone[key] == lost[key], key
    assert redone["traffic"]["requests"] == lost["traffic"]["requests"]
    assert redone["heldout"]["items"] == lost["heldout"]["items"]

    # the README's table, from the results folder
    results = out.parent
    shutil.copy(out, results / "stream_report_fake_app_single-text_seed620.json")
    table = tables.stream_report(results)
    assert "| default | tool |" in table and "| none | arithmetic |" in table
    assert "`default`: mixed stream mean gain" in table and "single-kind streams text" in table
    assert tables.stream_report(tmp_path).startswith("Not measured yet")
