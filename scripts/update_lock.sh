#!/usr/bin/env bash
# Regenerate requirements.lock: the newest versions pyproject.toml's ranges (with the [dev], [structured], [frameworks] and [mcp] extras) and
# requirements.in allow today, resolved by pip-tools' pip-compile in a throw-away venv (.venv-lock).
# Then `make install` installs exactly that, and `make test` tests it. Usage:
#   bash scripts/update_lock.sh                 # re-resolve everything to the newest allowed versions
#   bash scripts/update_lock.sh -P wandb        # move one package only (pip-compile --upgrade-package)
set -euo pipefail
cd "$(dirname "$0")/.."
test -x .venv-lock/bin/pip-compile || {
  python3 -m venv .venv-lock
  .venv-lock/bin/python -m pip install -q pip==26.3 pip-tools==7.6.2
}
args=(--upgrade)
[[ $# -gt 0 ]] && args=("$@")
# --allow-unsafe: pin setuptools and pip too (setuptools builds our editable install without isolation).
CUSTOM_COMPILE_COMMAND="bash scripts/update_lock.sh" .venv-lock/bin/pip-compile -q --extra dev --extra structured --extra frameworks --extra mcp --strip-extras --allow-unsafe --no-emit-index-url \
  --no-emit-find-links "${args[@]}" -o requirements.lock pyproject.toml requirements.in
echo "requirements.lock: $(grep -c '==' requirements.lock) pins; now run: make test"
