#!/usr/bin/env bash
# Create the VLMEvalKit environment that `mmfragile export vlmevalkit` folders are run in (docs/harnesses.md).
#
# VLMEvalKit gets its own venv: $MMFRAGILE_VLMEVALKIT_VENV, default $MMFRAGILE_CACHE/vlmevalkit-venv
# (~/.cache/mmfragile/vlmevalkit-venv) - the place the round-trip test looks.
# Contents (pinned):
#   * torch 2.14.1 + torchvision 0.29.1 (the project's pair) and transformers 5.24.0 (what mmfragile runs on);
#   * ms-vlmeval 0.0.20 from PyPI (VLMEvalKit packaged: `vlmeval`, its run.py as `python -m vlmeval.run`), with
#     its ~60 dependencies (8 min here with the downloads cached; a first try over 25 min on a busy machine);
#   * mmfragile itself (editable, --no-deps): VLMEvalKit does not need it (mmfragile scores on import).
# Run the exported datasets with VLMEvalKit's run.py; on a machine without CUDA use scripts/vlmevalkit_cpu_run.py
# (VLMEvalKit's own transformers classes put the model on a GPU; docs/harnesses.md).
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${MMFRAGILE_CACHE:-$HOME/.cache/mmfragile}"
VENV="${MMFRAGILE_VLMEVALKIT_VENV:-$CACHE/vlmevalkit-venv}"
PY="${PYTHON:-python3.11}"
STAMP="$VENV/.mmfragile-vlmevalkit"
want="ms-vlmeval==0.0.20 torch==2.14.1 torchvision==0.29.1 transformers==5.24.0"

if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$want" ]; then
    echo "install_vlmevalkit.sh: creating $VENV ($want)"
    "$PY" -m venv --clear "$VENV"
    pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
    "${pip[@]}" torch==2.14.1 torchvision==0.29.1
    "${pip[@]}" $want
    echo "$want" > "$STAMP"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps -e .
# smoke: VLMEvalKit's dataset and model registries import
"$VENV/bin/python" -c "import vlmeval.config, vlmeval.dataset, mmfragile.harness.common" \
    || { echo "install_vlmevalkit.sh: $VENV does not import vlmeval" >&2; exit 1; }
echo "install_vlmevalkit.sh: $VENV ready"
