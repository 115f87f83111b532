#!/usr/bin/env bash
# CI: the wheel installs and works on its own. `python -m build` makes the sdist and, from it,
# the wheel; the wheel (never the source tree, never `-e`) goes into a fresh venv, which runs
# `selftaught doctor` and a 5-item eval on the embedded model from a temporary folder, where
# src/ is not importable.
#
# Offline and fast: `--no-isolation` builds with the setuptools already installed (isolation
# would fetch one from the package index), and the venv sees the system's site-packages
# (`--system-site-packages`), so the dependencies installed for the tests are reused; pip
# still resolves the wheel's own requirements against them (`--no-index`: nothing is
# downloaded, a requirement they miss fails). The doctor runs without its 10-40 s decode
# timing (`--no-measure`).
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1
work=$(mktemp -d /tmp/selftaught-wheel.XXXXXX)
trap 'rm -rf "$work"' EXIT
if ! python -m build --no-isolation --outdir "$work/dist" . >"$work/build.log" 2>&1; then
    cat "$work/build.log" >&2
    exit 1
fi
wheel=$(ls "$work"/dist/selftaught-*.whl)
python -m venv --without-pip --system-site-packages "$work/venv"
python -m pip --python "$work/venv/bin/python" install --quiet --no-index "$wheel"
cd "$work"  # away from the checkout: only the installed wheel can be imported
venv/bin/python - <<'PY'
import sys
import selftaught

assert selftaught.__file__.startswith(sys.prefix), f"imported from {selftaught.__file__}"
PY
venv/bin/selftaught doctor --no-measure >doctor.txt
venv/bin/selftaught eval --task "gym:basic_arithmetic?max_terms=2&max_digits=1" --model local \
    --limit 5 --max-tokens 16 --output eval.jsonl >eval.txt 2>&1 || { cat eval.txt >&2; exit 1; }
[ "$(wc -l <eval.jsonl)" -eq 5 ] || { echo "the eval scored $(wc -l <eval.jsonl) items, not 5" >&2; exit 1; }
echo "wheel: $(basename "$wheel") installed in a fresh venv; selftaught doctor and a 5-item eval ran from it"
