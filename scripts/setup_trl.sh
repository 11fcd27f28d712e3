#!/usr/bin/env bash
# Create .venv-trl: a separate virtual environment holding Hugging Face TRL 1.16 beside this project, for
# benchmarks/vs_trl.py (TRL's GRPOTrainer against agent-rl on the same job). Separate so that TRL's
# dependencies (accelerate, datasets, ...) never enter the main environment.
#
#   bash scripts/setup_trl.sh            # ~2 min
#   .venv/bin/python benchmarks/vs_trl.py --quick
#
# torch must be exactly 2.13.0 (the CPU wheel), installed in the SAME pip command as trl: a bare `torch`,
# or a package that asks for a newer one, pulls a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${TRL_VENV:-.venv-trl}"
PY="${PYTHON:-python3}"
TRL_SPEC="${TRL_SPEC:-trl==1.16.0}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/pip" install -q --upgrade pip wheel
"$VENV/bin/pip" install -q "torch==2.13.0" -e '.[dev]' "$TRL_SPEC"
"$VENV/bin/python" - <<'PY'
import torch, transformers, trl
assert "+cu" not in torch.__version__, f"a CUDA torch was installed ({torch.__version__}): reinstall torch==2.13.0"
print("trl", trl.__version__, "transformers", transformers.__version__, "torch", torch.__version__)
PY
touch "$VENV/.installed"
