#!/usr/bin/env bash
# Install the pinned coding-agent CLIs the tests drive (Claude Code, Codex) into a cache folder,
# never globally: $SELFTAUGHT_AGENT_CLIS (default ~/.cache/selftaught/agent-clis), binaries in
# its node_modules/.bin. Idempotent: versions already installed are kept. Needs node + npm.
set -euo pipefail
CLAUDE_CODE_VERSION=2.1.328
CODEX_VERSION=0.169.0
DIR="${SELFTAUGHT_AGENT_CLIS:-$HOME/.cache/selftaught/agent-clis}"
if ! command -v npm >/dev/null 2>&1; then
    echo "install-agent-clis: npm is not installed (install node.js first)" >&2
    exit 1
fi
have() { [ -x "$DIR/node_modules/.bin/$1" ] && "$DIR/node_modules/.bin/$1" --version 2>/dev/null | grep -q "$2"; }
if have claude "$CLAUDE_CODE_VERSION" && have codex "$CODEX_VERSION"; then
    echo "install-agent-clis: claude $CLAUDE_CODE_VERSION and codex $CODEX_VERSION already in $DIR"
    exit 0
fi
mkdir -p "$DIR"
npm install --prefix "$DIR" --no-audit --no-fund --loglevel=error \
    "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" "@openai/codex@$CODEX_VERSION"
"$DIR/node_modules/.bin/claude" --version
"$DIR/node_modules/.bin/codex" --version
