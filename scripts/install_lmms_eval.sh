#!/usr/bin/env bash
# Create the lmms-eval environment that `mmfragile export lmms-eval` folders are run in (docs/harnesses.md).
#
# lmms-eval gets its own venv: $MMFRAGILE_LMMS_EVAL_VENV, default $MMFRAGILE_CACHE/lmms-eval-venv
# (~/.cache/mmfragile/lmms-eval-venv) - the place mmfragile.paths.lmms_eval_venv() and the round-trip test look.
# Contents (pinned):
#   * torch 2.14.1 + torchvision 0.29.1 (the project's pair) and transformers 5.24.0 (what mmfragile runs on, so
#     both tools tokenize and generate with the same code);
#   * lmms-eval 0.7.3 from PyPI, plus decord and filelock<4 that its llava_hf / task loading need at import;
#   * mmfragile itself (editable, --no-deps): the exported utils.py scores with mmfragile's own functions.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${MMFRAGILE_CACHE:-$HOME/.cache/mmfragile}"
VENV="${MMFRAGILE_LMMS_EVAL_VENV:-$CACHE/lmms-eval-venv}"
PY="${PYTHON:-python3.11}"
STAMP="$VENV/.mmfragile-lmms-eval"
want="lmms-eval==0.7.3 torch==2.14.1 torchvision==0.29.1 transformers==5.24.0 decord filelock<4"

if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$want" ]; then
    echo "install_lmms_eval.sh: creating $VENV ($want)"
    "$PY" -m venv --clear "$VENV"
    pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
    "${pip[@]}" torch==2.14.1 torchvision==0.29.1
    "${pip[@]}" lmms-eval==0.7.3 torch==2.14.1 torchvision==0.29.1 transformers==5.24.0 decord "filelock<4"
    echo "$want" > "$STAMP"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps -e .
# smoke: lmms-eval's CLI and llava_hf import beside mmfragile's scoring
"$VENV/bin/python" -c "import lmms_eval.models.simple.llava_hf, mmfragile.harness.common" \
    || { echo "install_lmms_eval.sh: $VENV does not import lmms_eval's llava_hf + mmfragile" >&2; exit 1; }
echo "install_lmms_eval.sh: $VENV ready"
