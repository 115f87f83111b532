"""The docs say what the code does: the generated pages are fresh (`python -m
selftaught.cli.reference`), every environment variable the source reads is listed, every
`--flag` the docs name exists, the error messages the troubleshooting page quotes are the
code's, and the mismatches once found stay fixed."""

from __future__ import annotations

import ast
import functools
import inspect
import re
from pathlib import Path

import pytest

import selftaught.api
from selftaught.cli import reference
from selftaught.errors import EXIT_CODES

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "selftaught"
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]

# Flags of other programs the docs show beside selftaught's own.
OTHER_FLAGS = {
    "--allowed", "--ask", "--check", "--color", "--enable-lora", "--flag", "--help",
    "--index-url", "--judge-check", "--log-from", "--max-lora-rank", "--no-deps", "--num",
    "--no-session-persistence", "--out", "--output-format", "--password", "--permission-mode",
    "--prefix", "--print", "--retry", "--retry-connrefused", "--retry-delay", "--sandbox",
    "--served-model-name", "--settings", "--skip-git-repo-check", "--strict", "--verbose",
    "--version", "--budget-", "--with-api-key", "--max-model-len",
    # other programs' flags in the operations and development pages (pip, venv, build, docker,
    # pg_dump / pg_restore, tar, useradd, systemctl)
    "--no-index", "--no-isolation", "--system-site-packages", "--upgrade", "--build-arg",
    "--entrypoint", "--rm", "--stop-timeout", "--format", "--file", "--clean", "--dbname",
    "--exclude", "--system", "--home-dir", "--shell", "--now",
}  # fmt: skip


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


# ---- generated pages -------------------------------------------------------------------------


def test_the_generated_pages_are_fresh():
    stale = [p for p, text in reference.pages().items() if _text(p) != text]
    assert not stale, f"stale: {stale}; run python -m selftaught.cli.reference"


def test_the_check_notices_a_stale_page(monkeypatch, tmp_path):
    page = tmp_path / "cli-reference.md"
    rendered = reference.render()  # the fresh page (test_the_generated_pages_are_fresh)
    monkeypatch.setattr(reference, "render", lambda: rendered)  # not rendered twice more
    page.write_text(rendered.replace("--epochs", "--epochz"))
    home = tmp_path / "sleep-home.md"
    home.write_text(_text(DOCS / "sleep-home.md"))
    monkeypatch.setattr(reference, "PAGE", page)
    monkeypatch.setattr(reference, "DOCS", tmp_path)
    assert reference.main(["--check"]) == 1
    assert reference.main([]) == 0 and "--epochz" not in page.read_text()


def test_the_reference_lists_every_command_and_option():
    page = _text(DOCS / "cli-reference.md")
    for path, cmd in reference.commands():
        assert f"## `selftaught {path}`".replace("selftaught `", "selftaught`") in page, path
        for p in cmd.params:
            for opt in getattr(p, "opts", []):
                if opt.startswith("--"):
                    assert f"`{opt}`" in page, (path, opt)


def test_every_direct_exit_of_the_cli_is_described():
    assert reference.direct_exits() == set(reference.DIRECT_EXITS)


@functools.cache
def error_classes() -> dict[str, int]:
    """`reference.error_classes()` (it parses the package), once a session: two tests read it."""
    return reference.error_classes()


def test_exit_codes_read_from_the_source_match_the_classes():
    from selftaught.errors import BudgetTooSmall, MissingDependency
    from selftaught.models.agents.base import AgentNotInstalled
    from selftaught.sleep.store import LogUnavailable
    from selftaught.tasks.sandbox import SandboxError
    from selftaught.tracking import TrackingError

    found = error_classes()
    for cls in (AgentNotInstalled, TrackingError, SandboxError, BudgetTooSmall, LogUnavailable):
        assert found[cls.__name__] == cls.exit_code, cls
    # the corrections: a missing agent CLI 1, tracking extra and bubblewrap 2
    assert (found["AgentNotInstalled"], found["TrackingError"], found["SandboxError"]) == (1, 2, 2)
    assert found["BudgetTooSmall"] == 5 and found["LogUnavailable"] == 1
    assert found["MissingDependency"] == MissingDependency.exit_code == 6
    assert set(found.values()) <= set(EXIT_CODES)


def test_the_commands_page_names_the_right_class_for_each_code():
    page = _text(DOCS / "commands.md")
    table = page[page.index("## Exit codes") :]
    found = error_classes()
    for code, kinds in re.findall(r"^\| `(\d+)` \| ([^|]*) \|", table, re.M):
        for name in re.findall(r"`(\w+)`", kinds):
            assert found[name] == int(code), (code, name)
    assert re.search(r"^\| `5` \| `BudgetTooSmall` \|", table, re.M)


# ---- environment variables -------------------------------------------------------------------

_ENV_READ = re.compile(r"(?:environ(?:\.get)?\(|environ\[|getenv\()\s*[\"']([A-Z][A-Z0-9_]+)")


def env_vars_in_source() -> set[str]:
    """SELFTAUGHT_* names, names read with os.environ / getenv, and providers' key and URL
    variables, anywhere in src/."""
    found: set[str] = set()
    for file in SRC.rglob("*.py"):
        text = _text(file)
        found |= set(re.findall(r"\bSELFTAUGHT_[A-Z0-9_]*[A-Z0-9]\b", text))
        found |= set(_ENV_READ.findall(text))
        found |= set(re.findall(r"[\"']([A-Z][A-Z0-9_]*_(?:API_KEY|BASE_URL))[\"']", text))
    return found


def test_every_environment_variable_is_documented():
    page = _text(DOCS / "environment.md")
    missing = sorted(v for v in env_vars_in_source() if f"`{v}`" not in page)
    assert not missing, f"read in src/ but not in docs/environment.md: {missing}"


def test_the_environment_check_sees_a_new_variable(tmp_path):
    assert {"SELFTAUGHT_HOME", "OPENAI_API_KEY", "CODEX_HOME"} <= env_vars_in_source()
    assert "SELFTAUGHT_NEW" in _ENV_READ.findall('os.environ.get("SELFTAUGHT_NEW")')


# ---- flags, signatures, paths ----------------------------------------------------------------


def known_flags() -> set[str]:
    """selftaught's options, and the benchmark scripts' own (`add_argument("--...")`)."""
    benchmarks = {
        flag
        for script in (ROOT / "benchmarks").glob("*.py")
        for flag in re.findall(r"add_argument\(\s*\"(--[a-z0-9-]+)\"", _text(script))
    }
    return benchmarks | {
        o
        for _, cmd in reference.commands()
        for p in cmd.params
        for o in [*getattr(p, "opts", []), *getattr(p, "secondary_opts", [])]
    }


def test_every_flag_the_docs_name_exists():
    known = known_flags() | OTHER_FLAGS
    unknown = {
        (page.name, flag)
        for page in PAGES
        for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", _text(page))
        if flag not in known
    }
    assert not unknown, f"flags no command has: {sorted(unknown)}"
    assert "--samples" not in known and "--redact-pattern" not in known


def test_python_calls_in_prose_use_real_keywords():
    """`selftaught.NAME(..., kw=...)` in the README and docs: each keyword is a parameter."""
    bad = []
    for page in PAGES:
        for name, args in re.findall(r"`selftaught\.(\w+)\(([^`]*)\)`", _text(page)):
            fn = getattr(selftaught.api, name, None)
            if fn is None:
                bad.append((page.name, name, "no such function"))
                continue
            params = inspect.signature(fn).parameters
            bad += [(page.name, name, kw) for kw in re.findall(r"(\w+)=", args) if kw not in params]
    assert not bad
    readme = _text(ROOT / "README.md")
    assert "take the same arguments" not in readme


def test_the_report_page_names_the_main_commands_run_folder():
    from selftaught.runs import slug

    readme = _text(ROOT / "README.md")
    main = r'selftaught optimize --task "([^"]+)" --model local --proposals 0'
    (task,) = re.findall(main, readme)
    folder = f"runs/optimize/{slug(task)}"
    report = _text(DOCS / "report.md")
    assert f"selftaught report {folder} " in report and f"selftaught watch {folder} " in report


def test_the_help_says_what_the_options_do():
    page = _text(DOCS / "cli-reference.md")
    proxy = page[page.index("## `selftaught proxy`") :]
    proxy = proxy[: proxy.index("\n## ")]
    assert "ANTHROPIC_API_KEY for --upstream anthropic" in proxy
    optimize = page[page.index("## `selftaught optimize`") :]
    strict = next(line for line in optimize.splitlines() if line.startswith("| `--strict-gate`"))
    assert "no paired test" in strict
    report = page[page.index("## `selftaught report`") :]
    assert "night's folder" in report[: report.index("\n## ")]


def test_the_jsonl_keys_and_scorers_are_in_the_tasks_page():
    from selftaught.tasks.jsonl import _RESERVED_KEYS
    from selftaught.tasks.scorers import SCORER_NAMES

    page = _text(DOCS / "tasks.md")
    assert not [k for k in _RESERVED_KEYS if f"`{k}`" not in page]
    assert not [s for s in SCORER_NAMES if f"`{s}`" not in page]


def test_memory_training_is_described_where_it_is_reachable():
    page = _text(DOCS / "python-api.md")
    assert 'document="memory"' in page
    sentence = page[page.index('document="memory"') - 200 : page.index('document="memory"') + 300]
    assert "SkillTrainer" in sentence
    assert "document" not in inspect.signature(selftaught.api.optimize).parameters


# ---- the Python API's types -----------------------------------------------------------------


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _subclasses(cls: type) -> list[type]:
    return [s for sub in cls.__subclasses__() for s in (sub, *_subclasses(sub))]


def api_types() -> dict[str, list[type]]:
    """Every result kind (the modules `load_result` imports), every trainer a config builds
    (with a `config_type` of its own), and every config: the trainers', the entry points'
    (`evaluate`'s `RolloutConfig`, `optimize_skills`' `SkillSetConfig`, `TaskOptions`) and
    the dataclasses they nest."""
    import dataclasses
    import importlib
    import typing

    from selftaught.results import RunResult
    from selftaught.rollout import RolloutConfig
    from selftaught.skill.config import SkillOptConfig
    from selftaught.skill.skillset import SkillSetConfig
    from selftaught.tasks.options import TaskOptions
    from selftaught.trainer_base import BaseTrainer
    from selftaught.trainers import trainer_for

    kinds = inspect.getsource(selftaught.api.load_result)
    for module in re.findall(r"import (selftaught[\w.]+)", kinds):
        importlib.import_module(module)
    trainer_for(SkillOptConfig())
    results = sorted(set(_subclasses(RunResult)), key=_qualname)
    trainers = sorted(
        {t for t in _subclasses(BaseTrainer) if "config_type" in vars(t)}, key=_qualname
    )
    configs: dict[str, type] = {}

    def walk(t: object) -> None:
        if not (isinstance(t, type) and dataclasses.is_dataclass(t)) or _qualname(t) in configs:
            return
        configs[_qualname(t)] = t
        hints = typing.get_type_hints(t)
        for f in dataclasses.fields(t):
            for inner in (hints[f.name], *typing.get_args(hints[f.name])):
                walk(inner)

    for t in [*(t.config_type for t in trainers), RolloutConfig, SkillSetConfig, TaskOptions]:
        walk(t)
    return {"results": results, "trainers": trainers, "configs": list(configs.values())}


def test_the_api_reference_lists_every_config_trainer_and_result():
    page = _text(DOCS / "api-reference.md")
    rendered = set(re.findall(r"^::: ([\w.]+)$", page, re.M))
    types = api_types()
    assert {t.__name__ for t in types["trainers"]} >= {"NightTrainer", "DPOTrainer"}
    missing = [
        _qualname(t)
        for kind in types.values()
        for t in kind
        if _qualname(t) not in rendered and t.__module__ not in rendered
    ]
    assert not missing, f"not in docs/api-reference.md (add `::: module.Name`): {missing}"


def test_the_python_api_page_names_every_entry_point_trainer_and_result():
    page = _text(DOCS / "python-api.md")
    intro = page[: page.index("```")]
    names = selftaught.__all__
    assert all(f"`selftaught.{name}`" in intro for name in names), intro
    count = ["no", "one", "two", "three", "four", "five", "six", "seven"][len(names)]
    assert intro.split("\n\n")[1].lower().startswith(f"{count} entry points"), intro
    contract = page[page.index("## One trainer contract") : page.index("## Typed results")]
    types = api_types()
    for trainer in types["trainers"]:
        pair = f"`{trainer.config_type.__name__}"
        assert pair in contract and f"`{trainer.__name__}`" in contract, trainer.__name__
    table = page[page.index("| result | adds |") : page.index("A skill run's `summary.json`")]
    rows = re.findall(r"^\| `(\w+)`", table, re.M)
    assert sorted(rows) == sorted(t.__name__ for t in types["results"])
    tracking = page[page.index("## Tracking") :]
    tracking = tracking[: tracking.index("sends a run to")]
    with_report_to = [t.__name__ for t in types["configs"] if "report_to" in t.__dataclass_fields__]
    assert len(with_report_to) >= 5
    assert not [name for name in with_report_to if f"`{name}`" not in tracking], tracking


def test_the_docs_name_the_night_by_its_names():
    old = {"SleepConfig": "NightConfig", "ProjectNight": "NightResult"}
    found = [(page.name, name) for page in PAGES for name in old if name in _text(page)]
    assert not found, f"older names in the docs (write {old}): {found}"


# ---- troubleshooting quotes ------------------------------------------------------------------


@functools.cache
def source_strings() -> tuple[str, ...]:
    """Every string literal in src/ (an f-string's fields as NUL), implicit joins joined; read
    once a session (three tests search them)."""
    out = []
    for file in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(_text(file))):
            if isinstance(node, ast.JoinedStr):
                out.append(
                    "".join(v.value if isinstance(v, ast.Constant) else "\0" for v in node.values)
                )
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                out.append(node.value)
    return tuple(out)


def quoted(text: str, strings: tuple[str, ...]) -> bool:
    """`text` (`...` for what varies) is one of the source's strings, in order."""
    parts = [p for p in text.split("...") if p]
    for s in strings:
        at = 0
        for part in parts:
            at = s.find(part, at)
            if at < 0:
                break
            at += len(part)
        else:
            return True
    return False


QUOTE = re.compile(r"^> `error: (.+)` \(exit (\d)\)$", re.M)


def test_the_troubleshooting_quotes_are_the_codes_messages():
    page = _text(DOCS / "troubleshooting.md")
    quotes = QUOTE.findall(page)
    assert len(quotes) >= 10
    strings = source_strings()
    wrong = []
    for text, code in quotes:
        # a BackendError prints `BACKEND: cause`: the backend's name comes from elsewhere
        bare = re.sub(r"^(\.\.\.|[\w-]+): ", "", text)
        if not (quoted(text, strings) or quoted(bare, strings)) or int(code) not in EXIT_CODES:
            wrong.append(text)
    assert not wrong, f"not the code's messages: {wrong}"


@pytest.mark.parametrize("text", ["error: no such message anywhere in the code", "budget-usd!"])
def test_a_made_up_quote_is_caught(text):
    assert not quoted(text, source_strings())
