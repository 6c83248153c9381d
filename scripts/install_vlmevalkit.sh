#!/usr/bin/env bash
# Create the VLMEvalKit environment that `mmfragile export vlmevalkit` folders are run in (docs/harnesses.md).
#
# VLMEvalKit gets its own venv: $MMFRAGILE_VLMEVALKIT_VENV, default $MMFRAGILE_CACHE/vlmevalkit-venv
# (~/.cache/mmfragile/vlmevalkit-venv) - the place the round-trip test looks.
# Contents (pinned):
#   * torch 2.14.1 + torchvision 0.29.1 (the project's pair) and transformers 5.24.0 (what mmfragile runs on);
#   * ms-vlmeval 0.0.20 from PyPI (VLMEvalKit's package: `vlmeval`, its run.py as the `vlmutil`/`run.py` entry);
#   * mmfragile itself (editable, --no-deps): not needed by VLMEvalKit, but the round-trip test imports from the venv.
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
