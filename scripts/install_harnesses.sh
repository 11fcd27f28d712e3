#!/usr/bin/env bash
# The coding-agent harnesses the harness tests run unmodified (make test-harnesses; docs/guides/harnesses.md),
# at pinned versions, into the git-ignored .harnesses/ of this checkout: npm packages under .harnesses/node
# (their commands in .harnesses/node/node_modules/.bin), mini-swe-agent in a venv of its own (.harnesses/venv:
# it pulls litellm, datasets and pandas, which the project's venv does not need). OpenCode fetches its
# provider package from npm on first use; it is installed here too, pinned, so the tests need no registry.
# Needs npm (Node >= 20) and python3 with pip; run again to repair, it is a no-op once the stamp matches.
set -euo pipefail
cd "$(dirname "$0")/.."

CLAUDE_CODE=2.1.328
CODEX=0.171.0
OPENCODE=1.18.33
AI_SDK_OPENAI_COMPATIBLE=1.0.32
MINI_SWE_AGENT=2.4.6

dir=.harnesses
want="claude-code=$CLAUDE_CODE codex=$CODEX opencode=$OPENCODE ai-sdk=$AI_SDK_OPENAI_COMPATIBLE mini-swe-agent=$MINI_SWE_AGENT"
if [ -f "$dir/.installed" ] && [ "$(cat "$dir/.installed")" = "$want" ]; then
  exit 0
fi
command -v npm >/dev/null || { echo "install_harnesses.sh: npm not found; install Node.js >= 20 (apt-get install nodejs npm)" >&2; exit 1; }
mkdir -p "$dir/node"
[ -f "$dir/node/package.json" ] || echo '{"name": "agent-rl-harnesses", "private": true}' > "$dir/node/package.json"
npm install --prefix "$dir/node" --no-audit --no-fund --save-exact --loglevel=error \
  "@anthropic-ai/claude-code@$CLAUDE_CODE" "@openai/codex@$CODEX" "opencode-ai@$OPENCODE" \
  "@ai-sdk/openai-compatible@$AI_SDK_OPENAI_COMPATIBLE"
[ -x "$dir/venv/bin/python" ] || python3 -m venv "$dir/venv"
"$dir/venv/bin/python" -m pip install -q "mini-swe-agent==$MINI_SWE_AGENT"
echo "$want" > "$dir/.installed"
