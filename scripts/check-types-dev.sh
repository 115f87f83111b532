#!/usr/bin/env bash
# CI: `mypy --strict` passes with the `dev` extra alone. A fresh venv (not the system's
# site-packages) gets `pip install -e ".[dev]"`: the core dependencies and the dev tools, none
# of the optional extras (torch, transformers, peft, trl, anthropic, google-genai, mcp,
# psycopg, trackio, mlflow: `Any` to the checker when absent, pyproject.toml's [tool.mypy]).
# Cheap: the wheels come from pip's cache, which the main install has just filled, and a
# cold mypy without torch takes about 30 s.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
work=$(mktemp -d /tmp/selftaught-types.XXXXXX)
trap 'rm -rf "$work"' EXIT
python -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet -e ".[dev]"
# the check means something only while no optional extra arrives through another package
"$work/venv/bin/python" - <<'PY'
import importlib.util

optional = ["torch", "transformers", "peft", "trl", "anthropic", "google.genai", "mcp",
            "psycopg", "psycopg_pool", "trackio", "mlflow", "bm25s", "wandb", "datasets"]
present = []
for name in optional:
    try:
        if importlib.util.find_spec(name) is not None:
            present.append(name)
    except ModuleNotFoundError:  # google.genai: its namespace `google` is absent too
        pass
assert not present, f"the dev extra pulls in optional packages: {present}"
PY
"$work/venv/bin/python" -m mypy --cache-dir "$work/mypy_cache"
echo "mypy --strict: clean with the dev extra alone (no optional extra installed)"
