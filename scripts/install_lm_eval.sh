#!/usr/bin/env bash
# Create the lm-evaluation-harness environment that `mmfragile export lm-eval` folders are run in
# (docs/harnesses.md).
#
# lm-eval gets its own venv: $MMFRAGILE_LM_EVAL_VENV, default $MMFRAGILE_CACHE/lm-eval-venv
# (~/.cache/mmfragile/lm-eval-venv) - the place mmfragile.paths.lm_eval_venv() and the round-trip test look.
# Contents (pinned):
#   * torch 2.14.1 + torchvision 0.29.1 (the project's pair) and transformers 5.24.0 (what mmfragile runs on, so
#     both tools tokenize and generate with the same code);
#   * lm-eval[hf] 0.4.13 from PyPI (its `hf` model class: transformers + accelerate + peft);
#   * mmfragile itself (editable, --no-deps): the exported utils.py scores with mmfragile's own functions.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${MMFRAGILE_CACHE:-$HOME/.cache/mmfragile}"
VENV="${MMFRAGILE_LM_EVAL_VENV:-$CACHE/lm-eval-venv}"
PY="${PYTHON:-python3.11}"
STAMP="$VENV/.mmfragile-lm-eval"
want="lm-eval[hf]==0.4.13 torch==2.14.1 torchvision==0.29.1 transformers==5.24.0"

if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$want" ]; then
    echo "install_lm_eval.sh: creating $VENV ($want)"
    "$PY" -m venv --clear "$VENV"
    pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
    "${pip[@]}" torch==2.14.1 torchvision==0.29.1
    "${pip[@]}" "lm-eval[hf]==0.4.13" torch==2.14.1 torchvision==0.29.1 transformers==5.24.0
    echo "$want" > "$STAMP"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps -e .
# smoke: lm-eval's CLI and its hf model class import beside mmfragile's scoring
"$VENV/bin/python" -c "import lm_eval.models.huggingface, mmfragile.harness.common" \
    || { echo "install_lm_eval.sh: $VENV does not import lm_eval's hf model + mmfragile" >&2; exit 1; }
echo "install_lm_eval.sh: $VENV ready"
