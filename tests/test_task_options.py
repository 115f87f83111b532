"""TaskOptions: one config for how a task spec is loaded, passed whole to `load_task`, its
fields generated as the task flags of eval / optimize / train. A task honours an option or
refuses it (ConfigError); it never ignores one (JSONL split sizes once were: 5/5/5 asked of
100 lines gave 64/23/13)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from selftaught.api import resolve_task
from selftaught.cli import app
from selftaught.errors import ConfigError
from selftaught.tasks import load_task
from selftaught.tasks.options import TaskOptions
from tests.fault_server import FaultServer
from tests.scripted import ToyTask, user_of

ROOT = Path(__file__).resolve().parents[1]


def jsonl(path: Path, n: int = 100) -> Path:
    lines = [{"id": f"q{i:03d}", "input": f"What is {i} + 1?", "reference": str(i + 1)}
             for i in range(n)]  # fmt: skip
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def ids(task, split: str) -> list[str]:
    return [ex.id for ex in task.examples(split)]


def test_jsonl_split_sizes_are_honoured_as_the_first_lines_of_each_split(tmp_path):
    path = jsonl(tmp_path / "qa.jsonl")
    whole = load_task(str(path))
    assert sum(len(whole.examples(s)) for s in ("train", "val", "test")) == 100
    sized = load_task(str(path), TaskOptions(train_size=5, val_size=5, test_size=5))
    for split in ("train", "val", "test"):
        assert ids(sized, split) == ids(whole, split)[:5]  # file order, stable
    # the same through keywords, a dict, and the API's resolver
    assert ids(load_task(str(path), test_size=3), "test") == ids(whole, "test")[:3]
    assert ids(resolve_task(str(path), {"val_size": 2}), "val") == ids(whole, "val")[:2]
    # only the splits asked for are cut
    assert len(load_task(str(path), val_size=1).examples("train")) == len(ids(whole, "train"))


def test_a_size_a_jsonl_split_cannot_fill_is_refused(tmp_path):
    path = jsonl(tmp_path / "qa.jsonl", n=20)
    test_lines = len(load_task(str(path)).examples("test"))
    with pytest.raises(ConfigError, match=rf"test_size 50 asked, but the test split holds "
                       rf"{test_lines} lines"):  # fmt: skip
        load_task(str(path), test_size=50)


def test_split_fractions_reach_a_jsonl_task(tmp_path):
    path = jsonl(tmp_path / "qa.jsonl")
    task = load_task(str(path), val_fraction=0.5, test_fraction=0.4)
    assert len(task.examples("train")) < 25 and len(task.examples("val")) > 35


@pytest.mark.parametrize(
    ("spec", "options", "named"),
    [
        ("gym:basic_arithmetic", {"scorer": "exact"}, "--scorer"),
        ("gym:chain_sum", {"val_fraction": 0.3}, "--val-fraction"),
        ("game:ctf", {"judge_model": "openai:gpt-4o-mini"}, "--judge-model"),
        ("tool:calculator", {"rubric": Path("r.md")}, "--rubric"),
        ("humaneval", {"scorer": "exact", "test_fraction": 0.1}, "--test-fraction, --scorer"),
    ],
)
def test_an_option_a_task_cannot_honour_is_refused(spec, options, named):
    with pytest.raises(ConfigError, match=f"cannot honour {named}"):
        load_task(spec, TaskOptions(**options))


def test_unsafe_exec_is_a_permission_no_task_refuses():
    task = load_task("gym:basic_arithmetic", unsafe_exec=True, test_size=2, val_size=1)
    assert len(task.examples("test")) == 2


def test_humaneval_honours_a_train_size_as_the_first_of_what_val_and_test_leave():
    whole = load_task("humaneval", val_size=4, test_size=4, unsafe_exec=True)
    small = load_task("humaneval", val_size=4, test_size=4, train_size=3, unsafe_exec=True)
    assert ids(small, "train") == ids(whole, "train")[:3]
    assert ids(small, "test") == ids(whole, "test")
    with pytest.raises(ConfigError, match="train_size must be in 0..156"):
        load_task("humaneval", val_size=4, test_size=4, train_size=157, unsafe_exec=True)


class SeedlessTask(ToyTask):
    def __init__(self, train_size: int = 8):  # takes a size, but no seed
        super().__init__(train={"alpha": train_size})


def test_a_plugin_gets_the_options_it_names_and_refuses_the_others():
    spec = f"{__name__}:SeedlessTask"
    assert len(load_task(spec, train_size=3).examples("train")) == 3
    with pytest.raises(ConfigError, match="SeedlessTask takes no seed="):
        load_task(spec, seed=7)
    with pytest.raises(ConfigError, match="task options .*seed.* apply to a task spec"):
        resolve_task(ToyTask(), TaskOptions(seed=3))


def test_task_options_validate_and_name_unknown_fields():
    with pytest.raises(ConfigError, match="train_size must be an integer >= 0"):
        TaskOptions(train_size=-1)
    with pytest.raises(ConfigError, match="unknown task option .*task options are: seed"):
        load_task("gym:basic_arithmetic", train_sise=3)
    assert TaskOptions(seed=0, test_size=4).given() == ["test_size"]


# ---- the flags: generated from TaskOptions, passed whole ---------------------------------


def judged(messages):
    """A target that answers the question, and a judge that likes every reply."""
    text = user_of(messages)
    if "Score the reply below against the rubric" in str(messages):
        return json.dumps({"score": 9, "reason": "it answers"})
    if "What is" in text:
        n = int(text.split("What is ")[1].split(" ")[0])
        return f"Answer: {n + 1}"
    return '{"edits": []}'  # the analyst proposes nothing


def test_optimize_scores_with_a_judge_model_whose_calls_are_charged_as_judge(tmp_path):
    path = jsonl(tmp_path / "qa.jsonl", n=40)
    with FaultServer(judged, models=("toy", "judge")) as server:
        args = ["optimize", "--task", str(path), "--model", f"{server.base_url}#toy",
                "--scorer", "llm_judge", "--judge-model", f"{server.base_url}#judge",
                "--train-size", "4", "--val-size", "3", "--test-size", "2", "--epochs", "1",
                "--batch-size", "4", "--output", str(tmp_path / "run"), "--api-key", "k",
                "--demos-max", "0"]  # fmt: skip
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        judge_requests = [r for r in server.requests if r["model"] == "judge"]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    usage = summary["usage"]
    # every judge request charged as `judge` (the final test's too: outside the budget)
    assert usage["judge"]["calls"] == len(judge_requests) > 0
    assert summary["llm_calls"] == sum(u["calls"] for u in usage.values())  # judge included
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["split_sizes"] == {"train": 4, "val": 3, "test": 2}


def test_eval_refuses_an_option_the_task_cannot_honour(tmp_path):
    result = CliRunner().invoke(
        app, ["eval", "--task", "gym:basic_arithmetic", "--scorer", "exact", "--limit", "1"]
    )
    assert result.exit_code == 2
    assert "cannot honour --scorer" in " ".join(result.output.split())


def test_a_budget_can_count_the_judges_calls_alone(tmp_path):
    path = jsonl(tmp_path / "qa.jsonl", n=40)
    with FaultServer(judged, models=("toy", "judge")) as server:
        args = ["optimize", "--task", str(path), "--model", f"{server.base_url}#toy",
                "--scorer", "llm_judge", "--judge-model", f"{server.base_url}#judge",
                "--train-size", "4", "--val-size", "3", "--test-size", "2", "--epochs", "1",
                "--batch-size", "4", "--output", str(tmp_path / "run"), "--api-key", "k",
                "--demos-max", "0", "--budget-calls", "5", "--budget-roles", "judge"]  # fmt: skip
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["budget"]["roles"] == ["judge"]
    # the baseline's 3 judge calls fit; step 1's 4 train replies do not
    assert summary["stopped_by"]["text"].startswith("budget (5 of 5 calls used) during step 1")
    assert summary["steps"] == 0 and summary["test"]["best"]["n"] == 2  # test: outside budget


def test_train_takes_the_generated_flags_on_a_tiny_model(tmp_path):
    """The train command's generated flags (-k, the task options, the gate, the budget) reach
    the run: a ReST round on a tiny random model, seconds."""
    pytest.importorskip("trl")
    from tests.tiny_model import save_tiny_model

    tiny = save_tiny_model(tmp_path / "tiny")
    run = tmp_path / "run"
    args = ["train", "--task", "gym:basic_arithmetic?max_terms=2&max_digits=1", "--model",
            f"local:{tiny}", "--rounds", "1", "-k", "2", "--min-score", "0", "--max-tokens", "4",
            "--epochs", "1", "--batch-size", "2", "--train-size", "3", "--val-size", "2",
            "--test-size", "2", "--seed", "5", "--gate-margin", "0", "--budget-calls", "500",
            "--output", str(run), "--quiet"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    config = json.loads((run / "config.json").read_text())
    assert config["rest"]["samples_per_prompt"] == 2 and config["rest"]["seed"] == 5
    assert config["rest"]["gate"]["margin"] == 0.0 and config["rest"]["budget"]["calls"] == 500
    samples = (run / "rounds" / "1" / "samples.jsonl").read_text().splitlines()
    assert len(samples) == 3 * 2  # 3 train prompts, k = 2
    res = json.loads((run / "result.json").read_text())
    assert res["base_test"]["n"] == 2 and res["method"] == "rest"
