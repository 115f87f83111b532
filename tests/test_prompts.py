"""`--prompts DIR`: the user's prompt templates replace the packaged ones by file name; an
unknown name or a template without a required placeholder is refused; a run records each
override's digest, so a resumed run whose prompts changed is refused."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from selftaught import prompts
from selftaught.cli import app
from selftaught.errors import ConfigError
from selftaught.gate import GateConfig
from selftaught.models.base import AsyncChatModel, GenerationParams
from selftaught.prompts import PromptSet, packaged, using
from selftaught.skill import SkillOptConfig, SkillTrainer
from selftaught.tasks.base import Example
from selftaught.tasks.scorers import LlmJudge
from tests.scripted import ScriptedModel, ToyTask, canned_analyst, rule_target, user_of

MARK = "HOUSE TEMPLATE 7731"


def own_prompt(folder, name: str, extra: str = MARK) -> str:
    folder.mkdir(exist_ok=True)
    text = f"{extra}\n{packaged(name)}"
    (folder / f"{name}.md").write_text(text)
    return text


def test_an_unknown_name_is_refused_listing_the_valid_ones(tmp_path):
    (tmp_path / "reflect_failure.md").write_text("{{examples}}")
    with pytest.raises(ConfigError, match=r"reflect_failure\.md is no prompt's name") as err:
        PromptSet.read(tmp_path)
    assert "reflect_failures.md" in str(err.value) and "miner.md" in str(err.value)


def test_a_template_without_a_required_placeholder_is_refused_naming_it(tmp_path):
    text = packaged("reflect_failures").replace("{{examples}}", "")
    (tmp_path / "reflect_failures.md").write_text(text)
    with pytest.raises(ConfigError, match=r"reflect_failures\.md lacks \{\{examples\}\}"):
        PromptSet.read(tmp_path)
    # the document's name and the counts may be left out
    text = packaged("reflect_failures").replace("{{max_edits}}", "a few").replace("{{DOC}}", "")
    (tmp_path / "reflect_failures.md").write_text(text)
    assert PromptSet.read(tmp_path).overrides["reflect_failures"] == text


def test_a_missing_folder_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="is not a folder"):
        PromptSet.read(tmp_path / "nope")


def test_the_judge_reads_the_override_in_effect(tmp_path):
    own_prompt(tmp_path, "llm_judge")
    seen: list[str] = []

    def judge(messages):
        seen.append(user_of(messages))
        return '{"score": 9, "reason": "ok"}'

    scorer = LlmJudge(ScriptedModel(judge), params=GenerationParams(max_tokens=32))
    ex = Example(id="a", input="What is 2 + 2?", reference="4")
    scorer("4", ex)
    with using(PromptSet.read(tmp_path)):
        scorer("4", ex)
    scorer("4", ex)
    assert [MARK in s for s in seen] == [False, True, False]
    assert prompts.active() == PromptSet()


def trainer(tmp_path, run, folder, analyst=None):
    config = SkillOptConfig(
        epochs=1, batch_size=4, gate=GateConfig(), demos_max=0, pool=False, prompts=folder
    )
    return SkillTrainer(
        config,
        ToyTask(),
        rule_target(),
        analyst or canned_analyst(),
        "# Skill\n",
        output_dir=run,
        progress=False,
    )


def test_the_analyst_is_asked_through_the_users_template_and_the_run_records_it(tmp_path):
    folder = tmp_path / "prompts"
    text = own_prompt(folder, "reflect_failures")
    analyst = canned_analyst()
    trainer(tmp_path, tmp_path / "run", str(folder), analyst).train()
    failures = [user_of(m) for m in analyst.calls if "## Failed attempts" in user_of(m)]
    assert failures and all(f.startswith(MARK) for f in failures)
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["prompts"] == {"reflect_failures": prompts.digest(text)}
    assert prompts.active() == PromptSet()  # the run's set is left behind it


def test_a_resumed_run_whose_prompts_changed_is_refused(tmp_path):
    folder = tmp_path / "prompts"
    own_prompt(folder, "merge")
    run = tmp_path / "run"
    trainer(tmp_path, run, str(folder)).train()
    trainer(tmp_path, run, str(folder)).train()  # the same prompts: it resumes (done)
    own_prompt(folder, "merge", extra="ANOTHER HOUSE TEMPLATE")
    with pytest.raises(ConfigError, match=r"different config \(prompts\)"):
        trainer(tmp_path, run, str(folder)).train()
    with pytest.raises(ConfigError, match=r"different config \(prompts\)"):
        trainer(tmp_path, run, None).train()  # nor one without them


def test_optimize_refuses_a_bad_prompts_folder_in_one_sentence(tmp_path):
    (tmp_path / "judge.md").write_text("{{reply}}")
    result = CliRunner().invoke(
        app, ["optimize", "--task", "gym:basic_arithmetic", "--prompts", str(tmp_path)]
    )
    assert result.exit_code == 2, result.output
    assert "judge.md is no prompt's name" in result.output
    assert "Traceback" not in result.output


class Recording(AsyncChatModel):
    """A model that answers as `inner` does and keeps every prompt it was sent."""

    def __init__(self, inner):
        self.inner, self.name, self.prompts = inner, inner.name, []

    async def achat(self, messages, params):
        self.prompts.append(user_of(messages))
        return await self.inner.achat(messages, params)


@pytest.mark.local
@pytest.mark.slow
def test_optimize_with_the_users_prompts_on_the_embedded_model(tmp_path):
    """The embedded model as target and analyst, the user's reflection templates: the run
    finishes, each reflection call was sent the user's template, the run records it."""
    import selftaught
    from selftaught.models.resolve import resolve_model

    folder = tmp_path / "prompts"
    text = own_prompt(folder, "reflect_failures")
    own_prompt(folder, "reflect_successes")
    target = resolve_model("local")
    analyst = Recording(target)
    config = SkillOptConfig(
        epochs=1,
        batch_size=4,
        max_tokens=24,
        analyst_max_tokens=64,
        demos_max=0,
        evaluate_test=False,
        prompts=str(folder),
    )
    sizes = {"seed": 0, "train_size": 4, "val_size": 4, "test_size": 2}
    run = tmp_path / "run"
    selftaught.optimize(
        "gym:basic_arithmetic?max_terms=2&max_digits=1",
        target,
        optimizer_model=analyst,
        config=config,
        output_dir=run,
        task_options=sizes,
        progress=False,
    )
    reflections = [p for p in analyst.prompts if "attempts" in p and "## Proposed" not in p]
    assert reflections and all(p.startswith(MARK) for p in reflections)
    saved = json.loads((run / "config.json").read_text())
    assert saved["prompts"]["reflect_failures"] == prompts.digest(text)
