"""Every code example in README.md and docs/ runs (an example that drifts from the code fails
here), and the docs site builds with `mkdocs build --strict`.

Which blocks run (docs/writing-docs.md says the same for authors):
- every fenced `python` block, in a fresh namespace, top-level `await` allowed;
- a fenced `bash` block right after a `<!-- run -->` comment, with `bash -e`.

Every example runs offline in a scratch folder (its cwd and the sleep home), with each model
spec answered by a scripted model (`DocModel`) and the embedded model's weights replaced by a
tiny random model, so a long example takes seconds. An `<!-- example: NAME -->` comment right
before a block names what else it needs (`ENVIRONMENTS`): a model in memory, a skill run's
`config` and `task`, or a live proxy behind `openai.OpenAI`."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from selftaught.models.base import AsyncChatModel, Completion, GenerationParams, Message

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w+-]*)[ \t]*$")
MARK = re.compile(r"^\s*<!--\s*(?:(?P<run>run)|example:\s*(?P<env>[\w-]+))\s*-->\s*$")


@dataclass(frozen=True)
class Example:
    page: Path
    line: int
    lang: str
    code: str
    env: str | None
    run: bool

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def parse_examples(page: Path) -> list[Example]:
    """The fenced blocks of a Markdown page, each with the marker comment right before it."""
    lines = page.read_text(encoding="utf-8").splitlines()
    out: list[Example] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None or not m["lang"]:
            i += 1
            continue
        start, indent = i, m["indent"]
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            i += 1
        body = "\n".join(line.removeprefix(indent) for line in lines[start + 1 : i])
        prev = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        mark = MARK.match(prev)
        env = mark["env"] if mark else None
        out.append(
            Example(
                page, start + 1, m["lang"], textwrap.dedent(body), env, bool(mark and mark["run"])
            )
        )
        i += 1
    return out


def runnable() -> list[Example]:
    found = [e for page in PAGES for e in parse_examples(page)]
    return [e for e in found if e.lang == "python" or (e.lang in ("bash", "sh") and e.run)]


# ---- what the examples run against ----------------------------------------------------------


class DocModel(AsyncChatModel):
    """Any model spec, answered offline: a judge's score, an analyst's edit, else a number."""

    def __init__(self, name: str):
        self.name = name

    async def achat(self, messages: list[Message], params: GenerationParams) -> Completion:
        text = "\n".join(str(m.get("content") or "") for m in messages)
        if "Score the reply below against the rubric" in text:
            reply = json.dumps({"score": 8, "reason": "scripted judge"})
        elif "<skill>" in text:  # the analyst
            edit = {"op": "append", "content": "Give the final answer only.", "rationale": "doc"}
            reply = json.dumps({"edits": [edit]})
        else:
            numbers = [int(n) for n in re.findall(r"-?\d+", text)[-2:]]
            reply = str(sum(numbers)) if numbers else "blue"
        return Completion(text=reply, prompt_tokens=len(text) // 4 + 1, completion_tokens=2)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    pytest.importorskip("trl")
    from tests.tiny_model import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny-model"))


def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_dir: Path) -> None:
    """A scratch folder, a scratch sleep home, scripted models, tiny local weights."""
    import selftaught.models
    import selftaught.models.embedded

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SELFTAUGHT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SELFTAUGHT_LOG", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(selftaught.models, "load_model", lambda spec, **_: DocModel(spec))
    monkeypatch.setattr(selftaught.models.embedded, "embedded_model_dir", lambda: tiny_dir)


def local_model(ns: dict[str, Any], tmp_path: Path, tiny_dir: Path) -> Iterator[None]:
    """`model` and `tokenizer` in memory, `messages`, `GenerationParams`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ns["model"] = AutoModelForCausalLM.from_pretrained(tiny_dir)
    ns["tokenizer"] = AutoTokenizer.from_pretrained(tiny_dir)
    ns["messages"] = [{"role": "user", "content": "Name a color."}]
    ns["GenerationParams"] = GenerationParams
    yield


def skill_run(ns: dict[str, Any], tmp_path: Path, tiny_dir: Path) -> Iterator[None]:
    """A skill run's `config` and `task`."""
    from selftaught.skill import SkillOptConfig
    from tests.scripted import ToyTask

    ns["config"] = SkillOptConfig(epochs=1, batch_size=4)
    ns["task"] = ToyTask()
    yield


def proxy(ns: dict[str, Any], tmp_path: Path, tiny_dir: Path) -> Iterator[None]:
    """`openai.OpenAI` reaching a selftaught proxy (in this process) at any base URL."""
    import openai
    from fastapi.testclient import TestClient

    from selftaught.sleep.intake.proxy import ProxyConfig, create_proxy_app, in_process_upstream

    upstream = in_process_upstream(DocModel("local:SmolLM2-135M-Instruct"))
    config = ProxyConfig(upstream="local", log_path=tmp_path / "log.db", home=tmp_path / "home")
    real = openai.OpenAI
    with TestClient(create_proxy_app(config, upstream=upstream)) as http:
        openai.OpenAI = lambda **kw: real(**kw, http_client=http)  # type: ignore[misc]
        try:
            yield
        finally:
            openai.OpenAI = real  # type: ignore[misc]


ENVIRONMENTS: dict[str, Callable[[dict[str, Any], Path, Path], Iterator[None]]] = {
    "local-model": local_model,
    "skill-run": skill_run,
    "proxy": proxy,
}


def run_python(code: str, ns: dict[str, Any], where: str) -> None:
    compiled = compile(code, where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    result = eval(compiled, ns)  # noqa: S307  # the project's own documentation
    if asyncio.iscoroutine(result):
        asyncio.run(result)


def run_bash(code: str, cwd: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "SELFTAUGHT_HOME": str(cwd / "home")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    done = subprocess.run(
        ["bash", "-e", "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("example", runnable(), ids=lambda e: e.id)
def test_the_example_runs(example: Example, tmp_path, monkeypatch, tiny_dir):
    if example.env is not None and example.env not in ENVIRONMENTS:
        pytest.fail(f"{example.id}: unknown example environment {example.env!r}")
    offline(monkeypatch, tmp_path, tiny_dir)
    if example.lang != "python":
        run_bash(example.code, tmp_path)
        return
    ns: dict[str, Any] = {"__name__": "__doc_example__"}
    setup = ENVIRONMENTS.get(example.env or "")
    steps = setup(ns, tmp_path, tiny_dir) if setup else iter([None])
    next(steps)
    try:
        run_python(example.code, ns, example.id)
    finally:
        next(steps, None)


# ---- the collector itself -------------------------------------------------------------------


def test_the_collector_finds_marked_blocks_and_only_runnable_bash(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "Text.\n\n```python\nx = 1\n```\n\n<!-- run -->\n```bash\necho hi\n```\n\n"
        "```bash\nrm -rf /\n```\n\n<!-- example: proxy -->\n  ```python\n  y = 2\n  ```\n"
    )
    blocks = parse_examples(page)
    assert [(b.lang, b.run, b.env, b.code) for b in blocks] == [
        ("python", False, None, "x = 1"),
        ("bash", True, None, "echo hi"),
        ("bash", False, None, "rm -rf /"),
        ("python", False, "proxy", "y = 2"),
    ]


def test_every_readme_python_block_is_collected():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    collected = [e for e in runnable() if e.page.name == "README.md" and e.lang == "python"]
    assert len(collected) == readme.count("```python") > 0


def test_the_readme_gives_the_test_command_ci_runs():
    """README.md and docs/development.md give exactly what `.ci/run` installs and runs."""
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    (command,) = [line for line in ci.splitlines() if "python -m pytest" in line]
    command = command.replace(" -q", "").strip()  # CI runs pip quietly
    packages = re.findall(r"apt-get install -y -qq ([\w.-]+)", ci)
    assert {"bubblewrap", "postgresql"} <= set(packages)
    clis = "bash scripts/install-agent-clis.sh"
    assert clis in ci
    for page in (ROOT / "README.md", ROOT / "docs" / "development.md"):
        text = page.read_text(encoding="utf-8")
        assert command in text and clis in text, page
        block = text[text.rfind("```bash", 0, text.index(command)) : text.index(command)]
        apt = next(line for line in block.splitlines() if line.startswith("apt-get update"))
        assert set(packages) <= set(apt.split()), (page, apt)  # in the command's own block


def test_a_drifted_example_fails(tmp_path, monkeypatch, tiny_dir):
    offline(monkeypatch, tmp_path, tiny_dir)
    with pytest.raises(AttributeError, match="hard_ci95"):
        run_python(
            "from selftaught.results import Score\nScore.from_summary({}).hard_ci95", {}, "x"
        )


# ---- the site -------------------------------------------------------------------------------


def test_the_docs_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "index.html").exists()
