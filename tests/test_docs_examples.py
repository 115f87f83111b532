"""Every fenced block of README.md and docs/ either runs here or says why it cannot (an example
that drifts from the code fails here), and the docs site builds with `mkdocs build --strict`.

Each block is one of (docs/writing-docs.md says the same for authors):
- run: a `python` block, in a fresh namespace, top-level `await` allowed; a `bash` block right
  after a `<!-- run -->` comment, with `bash -e`;
- parsed: a `json` block (one value, or one per line) or a `toml` block;
- marked: right after a `<!-- not run: WHY -->` comment (a hosted API key, a server of yours,
  an install, a program's output, ...).
A few that repeat what a default example or test runs are marked slow (`SLOW_EXAMPLES`, each
with its reason). A block that is none of them fails `test_every_block_runs_or_says_why_not`;
`python -m tests.test_docs_examples` prints the counts.

Every example runs offline in a scratch folder (its cwd and the sleep home), with each model
spec answered by a scripted model (`tests/doc_env.py`, also in the Python processes a bash
example starts, where a loopback URL reaches the server the example started) and the embedded
model's weights replaced by a tiny random model, so a long example takes seconds. Without an
optional extra (the [local] one: torch, transformers, trl, peft) the examples still run; one
that needs the missing extra skips, its reason naming the extra and the error, and the session
warns how many did. A server a
bash example leaves running is stopped when it ends. An `<!-- example: NAME -->` comment right
before a block names what else it needs (`ENVIRONMENTS`): a model in memory, a skill run's
`config` and `task`, or a live proxy behind `openai.OpenAI`."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from selftaught.errors import MissingDependency
from selftaught.models.base import GenerationParams
from tests.doc_env import SCRIPTED_ENV, TINY_MODEL_ENV, DocModel, scripted_loader

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w+-]*)[ \t]*$")
MARK = re.compile(
    r"^\s*<!--\s*(?:(?P<run>run)|example:\s*(?P<env>[\w-]+)|not run:\s*(?P<why>\S.*?))\s*-->\s*$"
)
PARSED = {"json": "json", "jsonl": "json", "toml": "toml"}
# the optional extras an example may use, by a module each installs
EXTRAS = {
    "local": ("torch", "transformers", "trl", "peft"),
    "retrieval": ("bm25s",),
    "mcp": ("mcp",),
    "anthropic": ("anthropic",),
    "gemini": ("google.genai",),
    "postgres": ("psycopg", "psycopg_pool"),
    "tracking": ("trackio", "mlflow"),
}


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # google.genai without google
        return False


def missing_extras() -> dict[str, list[str]]:
    """The extras not (fully) installed here, with the modules they lack."""
    absent = {extra: [m for m in mods if not _importable(m)] for extra, mods in EXTRAS.items()}
    return {extra: mods for extra, mods in absent.items() if mods}


@dataclass(frozen=True)
class Example:
    page: Path
    line: int
    lang: str
    code: str
    env: str | None
    run: bool
    why_not: str | None = None  # `<!-- not run: WHY -->`

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def status(self) -> str:
        """run | parsed | marked | neither."""
        if self.why_not:
            return "marked"
        bash_runs = self.run or self.env is not None  # `<!-- example: NAME -->` runs it too
        if self.lang == "python" or (self.lang in ("bash", "sh") and bash_runs):
            return "run"
        return "parsed" if self.lang in PARSED else "neither"


def parse_examples(page: Path) -> list[Example]:
    """The fenced blocks of a Markdown page (a fence without a language too), each with the
    marker comment right before it."""
    lines = page.read_text(encoding="utf-8").splitlines()
    out: list[Example] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
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
        run, why = bool(mark and mark["run"]), mark["why"] if mark else None
        out.append(Example(page, start + 1, m["lang"], textwrap.dedent(body), env, run, why))
        i += 1
    return out


def collected() -> list[Example]:
    return [e for page in PAGES for e in parse_examples(page)]


def runnable() -> list[Example]:
    return [e for e in collected() if e.status in ("run", "parsed")]


# The examples the default run (`-m "not slow"`, what .ci/run runs) leaves to `-m slow`: each
# repeats what an example or a test of the default run already runs (its reason says which), and
# costs CI's two cores seconds of program start-up. Named by page and the start of the block's
# code (a change above a block keeps its name); a name that matches no block, or several, fails
# `test_each_slow_example_names_one_block`.
SLOW_EXAMPLES: dict[tuple[str, str], str] = {
    (
        "docs/quickstart.md",
        'selftaught optimize --task "gym:basic_arithmetic?max_terms=2&max_digits=1" --model local',
    ): "the very command of README.md's quick start, which runs",
    (
        "docs/quickstart.md",
        "selftaught eval --task gym:basic_arithmetic --model local --limit 20",
    ): "the eval command on the embedded model, real: "
    "tests/test_eval_e2e.py::test_eval_local_prints_score_and_writes_jsonl",
    (
        "docs/writing-docs.md",
        "selftaught tasks",
    ): "docs/commands.md's first example runs `selftaught tasks`",
    (
        "docs/commands.md",
        "cat > eval.toml <<'TOML'",
    ): "each line's behaviour is tests/test_config_files.py's: a file's settings read and kept "
    "beside the output, a flag over the file, --print-config reading back, a night's file, an "
    "unknown key refused with exit 2",
    (
        "docs/agents-proxy.md",
        "selftaught serve --model local --port 8011 &",
    ): "the same two servers, started and waited for, as docs/operations.md's example, which "
    "runs (its proxy's /ready); the proxy's /health: tests/test_sleep_proxy.py",
    (
        "docs/local-engine-performance.md",
        "SELFTAUGHT_DTYPE=float32 selftaught doctor --no-measure",
    ): "the doctor command runs in the example above it (`threads: 1 (fixed`); these two lines "
    "of its report: tests/test_precision.py::test_doctor_prints_what_auto_gives_here",
    (
        "docs/optimize.md",
        "selftaught optimize --task gym:basic_arithmetic --model local --optimizer-model local",
    ): "the optimize command with the local model runs in README.md's quick start and in the "
    "--prompts example above it (its --output too); the budget flags are generated where a "
    "task is loaded (tests/test_cli_options.py)",
    (
        "docs/python-api.md",
        "import selftaught\nfrom selftaught.gate import GateConfig",
    ): "selftaught.optimize runs in README.md's Python example, selftaught.train in "
    "docs/train.md's and build_trainer's SFT in the next example here; selftaught.evaluate: "
    "tests/test_api.py",
}


def slow_reason(example: Example) -> str | None:
    """Why the default run leaves the example to `-m slow` (None: it runs by default)."""
    page = example.page.relative_to(ROOT).as_posix()
    for (named, start), why in SLOW_EXAMPLES.items():
        if named == page and example.code.startswith(start):
            return why
    return None


def runnable_params() -> list[Any]:
    """`runnable()` as test parameters, the slow examples marked so."""
    return [
        pytest.param(e, id=e.id, marks=pytest.mark.slow if slow_reason(e) else ())
        for e in runnable()
    ]


def census(blocks: list[Example]) -> dict[str, int]:
    """How many blocks run, are parsed, are marked not run, or are none of them."""
    counts = Counter(e.status for e in blocks)
    return {k: counts[k] for k in ("run", "parsed", "marked", "neither")}


# ---- what the examples run against ----------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path | None:
    """The tiny model's folder (torch and transformers make it); None without them (the
    examples that load weights then skip)."""
    if not all(_importable(m) for m in ("torch", "transformers")):
        return None
    from tests.tiny_model import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny-model"))


def no_weights() -> Path:
    raise MissingDependency("the embedded model's weights need the [local] extra")


def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_dir: Path | None) -> None:
    """A scratch folder, a scratch sleep home, scripted models, tiny local weights (where the
    [local] extra is installed)."""
    import selftaught.models
    import selftaught.models.embedded

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SELFTAUGHT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SELFTAUGHT_LOG", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    loader = scripted_loader(selftaught.models.load_model, loopback=False)
    monkeypatch.setattr(selftaught.models, "load_model", loader)
    weights = no_weights if tiny_dir is None else lambda: tiny_dir
    monkeypatch.setattr(selftaught.models.embedded, "embedded_model_dir", weights)
    monkeypatch.setenv(SCRIPTED_ENV, "1")  # the bash examples' processes
    if tiny_dir is None:
        monkeypatch.delenv(TINY_MODEL_ENV, raising=False)
    else:
        monkeypatch.setenv(TINY_MODEL_ENV, str(tiny_dir))


def local_model(ns: dict[str, Any], tmp_path: Path, tiny_dir: Path | None) -> Iterator[None]:
    """`model` and `tokenizer` in memory, `messages`, `GenerationParams`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert tiny_dir is not None  # transformers imported: the [local] extra is here
    ns["model"] = AutoModelForCausalLM.from_pretrained(tiny_dir)
    ns["tokenizer"] = AutoTokenizer.from_pretrained(tiny_dir)
    ns["messages"] = [{"role": "user", "content": "Name a color."}]
    ns["GenerationParams"] = GenerationParams
    yield


def skill_run(ns: dict[str, Any], tmp_path: Path, tiny_dir: Path | None) -> Iterator[None]:
    """A skill run's `config` and `task`."""
    from selftaught.skill import SkillOptConfig
    from tests.scripted import ToyTask

    ns["config"] = SkillOptConfig(epochs=1, batch_size=4)
    ns["task"] = ToyTask()
    yield


def proxy(ns: dict[str, Any], tmp_path: Path, tiny_dir: Path | None) -> Iterator[None]:
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


def local_extra(ns: dict[str, Any], tmp_path: Path, tiny_dir: Path | None) -> Iterator[None]:
    """Nothing: the mark says the example needs the [local] extra even where its failure
    would not say so (a `grep -q` of what torch lets `doctor` print)."""
    yield


ENVIRONMENTS: dict[str, Callable[[dict[str, Any], Path, Path | None], Iterator[None]]] = {
    "local-model": local_model,
    "skill-run": skill_run,
    "proxy": proxy,
    "local-extra": local_extra,
}


def run_python(code: str, ns: dict[str, Any], where: str) -> None:
    compiled = compile(code, where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    result = eval(compiled, ns)  # noqa: S307  # the project's own documentation
    if asyncio.iscoroutine(result):
        asyncio.run(result)


def free_ports(code: str) -> str:
    """The block with each port its servers listen on (`--port N`, and every `:N` / ` N` naming
    it) replaced by one free now, so that two test runs at once never meet on a port."""
    ports = sorted(set(re.findall(r"--port (\d+)", code)))
    sockets = [socket.socket() for _ in ports]
    try:
        for sock in sockets:  # all bound at once: distinct ports
            sock.bind(("127.0.0.1", 0))
        free = {port: str(sock.getsockname()[1]) for port, sock in zip(ports, sockets, strict=True)}
    finally:
        for sock in sockets:
            sock.close()
    return re.sub(r"(?<=[:\s])\d+\b", lambda m: free.get(m.group(), m.group()), code)


def run_bash(code: str, cwd: Path) -> None:
    """`bash -e` in its own session, scripted models in its Python processes
    (`tests/doc_site/sitecustomize.py`); whatever it leaves running (a server) is stopped."""
    path = os.pathsep.join(str(p) for p in (ROOT / "src", ROOT / "tests" / "doc_site", ROOT))
    env = {**os.environ, "PYTHONPATH": path, "SELFTAUGHT_HOME": str(cwd / "home")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    log, script = cwd / ".example-output", free_ports(code)
    with log.open("w") as sink:  # a file, not a pipe: a background server keeps a pipe open
        proc = subprocess.Popen(
            ["bash", "-e", "-c", script], cwd=cwd, env=env, stdout=sink, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            code_ = proc.wait(timeout=300)
        finally:
            with contextlib.suppress(ProcessLookupError):  # nothing left running
                os.killpg(proc.pid, signal.SIGTERM)
    assert code_ == 0, log.read_text(errors="replace")


def check_data(example: Example) -> None:
    """A `json` block is one JSON value or one per line (JSONL); a `toml` block parses."""
    if PARSED[example.lang] == "toml":
        tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")
        tomllib.loads(example.code)
        return
    try:
        json.loads(example.code)
    except json.JSONDecodeError:
        for n, line in enumerate(example.code.splitlines(), 1):
            if line.strip():
                try:
                    json.loads(line)
                except json.JSONDecodeError as err:
                    pytest.fail(f"{example.id}: line {n} is not JSON: {err}")


@pytest.mark.parametrize("example", runnable_params())
def test_the_example_runs(example: Example, tmp_path, monkeypatch, tiny_dir):
    if example.env is not None and example.env not in ENVIRONMENTS:
        pytest.fail(f"{example.id}: unknown example environment {example.env!r}")
    if example.status == "parsed":
        check_data(example)
        return
    if example.env == "local-extra" and "local" in missing_extras():
        skip_loudly(example, "the [local] extra is not installed", missing_extras())
    offline(monkeypatch, tmp_path, tiny_dir)
    with skipped_without_extras(example):
        if example.lang != "python":
            run_bash(example.code, tmp_path)
            return
        ns: dict[str, Any] = {"__name__": "__doc_example__"}
        setup = ENVIRONMENTS.get(example.env or "")
        steps = setup(ns, tmp_path, tiny_dir) if setup else iter([None])
        try:
            next(steps)
            run_python(example.code, ns, example.id)
        finally:
            next(steps, None)


SKIPPED: list[str] = []  # the examples an absent extra skipped, for the warning at the end


@contextlib.contextmanager
def skipped_without_extras(example: Example) -> Iterator[None]:
    """An example that fails for want of a module skips, loudly, where an optional extra is
    absent; where every extra is installed the failure stands."""
    try:
        yield
    except (ImportError, MissingDependency, AssertionError) as err:
        missing = missing_extras()
        text = str(err)
        wanted = isinstance(err, (ImportError, MissingDependency)) or any(
            words in text for words in ("MissingDependency", "ModuleNotFoundError", "pip install")
        )
        if not missing or not wanted:
            raise
        skip_loudly(example, text.strip().splitlines()[-1] if text.strip() else "", missing)


def skip_loudly(example: Example, why: str, missing: dict[str, list[str]]) -> None:
    extras = ", ".join(f"[{extra}] ({', '.join(mods)})" for extra, mods in missing.items())
    SKIPPED.append(example.id)
    pytest.skip(f"{example.id} needs an extra not installed here: {extras}: {why}")


@pytest.fixture(scope="session", autouse=True)
def warn_of_skipped_examples() -> Iterator[None]:
    yield
    if SKIPPED:
        import warnings

        warnings.warn(
            f"{len(SKIPPED)} documentation examples skipped: an optional extra is not installed "
            f"({', '.join(missing_extras())}; pip install -e '.[local,...]' to run them): "
            + ", ".join(SKIPPED),
            stacklevel=1,
        )


# ---- the collector itself -------------------------------------------------------------------


def test_every_block_runs_or_says_why_not(record_property):
    blocks = collected()
    counts = census(blocks)
    for name, n in counts.items():
        record_property(name, n)
    print(f"documentation blocks: {counts}")
    neither = [f"{e.id} ({e.lang or 'no language'})" for e in blocks if e.status == "neither"]
    assert not neither, (
        "blocks that neither run nor say why not (add `<!-- run -->` or "
        f"`<!-- not run: WHY -->` on the line before): {neither}"
    )


def test_each_slow_example_names_one_block():
    """Every example left to `-m slow` is one block that runs, with a reason; the default run
    keeps most of them."""
    blocks = runnable()
    for (page, start), why in SLOW_EXAMPLES.items():
        found = [e for e in blocks if e.page == ROOT / page and e.code.startswith(start)]
        assert len(found) == 1, f"{page}: {len(found)} blocks start with {start!r}"
        assert found[0].status == "run" and why
    ran = [e for e in blocks if e.status == "run"]
    assert len(SLOW_EXAMPLES) <= len(ran) // 5


def test_the_collector_finds_marked_blocks_and_only_runnable_bash(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "Text.\n\n```python\nx = 1\n```\n\n<!-- run -->\n```bash\necho hi\n```\n\n"
        "```bash\nrm -rf /\n```\n\n<!-- example: proxy -->\n  ```python\n  y = 2\n  ```\n"
        "\n<!-- not run: needs a hosted API key -->\n```bash\ncurl x\n```\n"
        '\n```json\n{"a": 1}\n```\n\n```\nplain\n```\n'
    )
    blocks = parse_examples(page)
    assert [(b.lang, b.run, b.env, b.code, b.status) for b in blocks] == [
        ("python", False, None, "x = 1", "run"),
        ("bash", True, None, "echo hi", "run"),
        ("bash", False, None, "rm -rf /", "neither"),
        ("python", False, "proxy", "y = 2", "run"),
        ("bash", False, None, "curl x", "marked"),
        ("json", False, None, '{"a": 1}', "parsed"),
        ("", False, None, "plain", "neither"),
    ]
    assert blocks[4].why_not == "needs a hosted API key"
    assert census(blocks) == {"run": 3, "parsed": 1, "marked": 1, "neither": 2}


def test_every_readme_python_block_is_collected():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    collected = [e for e in runnable() if e.page.name == "README.md" and e.lang == "python"]
    assert len(collected) == readme.count("```python") > 0


def test_the_readme_gives_the_test_command_ci_runs():
    """README.md and docs/development.md give exactly what `.ci/run` installs and runs."""
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    (command,) = [line for line in ci.splitlines() if 'python -m pytest -m "not slow"' in line]
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


def test_a_bash_examples_servers_get_free_ports_and_other_numbers_stay():
    code = "serve --port 8011 &\ncurl http://127.0.0.1:8011/health --retry 60\nproxy --port 8080"
    out = free_ports(code)
    first, second = re.findall(r"--port (\d+)", out)
    assert first != second and "8011" not in out and "8080" not in out
    assert f"127.0.0.1:{first}/health --retry 60" in out


def test_a_drifted_example_fails(tmp_path, monkeypatch, tiny_dir):
    offline(monkeypatch, tmp_path, tiny_dir)
    with pytest.raises(AttributeError, match="hard_ci95"):
        run_python(
            "from selftaught.results import SplitScore\nSplitScore.from_summary({}).hard_ci95",
            {},
            "x",
        )


# ---- the site -------------------------------------------------------------------------------


def test_the_docs_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    pytest.importorskip("mkdocstrings_handlers.python")  # the API reference
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "index.html").exists()


if __name__ == "__main__":  # python -m tests.test_docs_examples: the counts, and what is neither
    blocks = collected()
    print(" · ".join(f"{k} {v}" for k, v in census(blocks).items()))
    for e in blocks:
        if e.status == "neither":
            print(f"neither: {e.id} ({e.lang or 'no language'})")
