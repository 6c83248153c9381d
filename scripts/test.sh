#!/usr/bin/env bash
# The test command: README's and CI's alike (.ci/run only calls this script), so a newcomer runs what CI runs.
# It installs everything the default test set needs, by name from the package registries:
#   * the project and its pins (scripts/install.sh);
#   * the vLLM backend's own environment (scripts/install_vllm.sh; first time ~6 min, then reused): the
#     vllm-marked tests run in it, and without it they would skip;
#   * Debian's chromium for the report's browser test (scripts/install_browser.sh).
# then runs the fast set (-m "not slow"); every skipped test is named with its reason in the summary.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -k store`).
set -euo pipefail
cd "$(dirname "$0")/.."
export MMFRAGILE_CACHE="${MMFRAGILE_CACHE:-$HOME/.cache/mmfragile}"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false MPLBACKEND=Agg
# the seed paper texts, where this machine keeps them beside the checkout (their extraction tests skip without)
if [ -d ../shared/seeds ]; then export MMFRAGILE_SEEDS="$PWD/../shared/seeds"; fi
bash scripts/install.sh
bash scripts/install_vllm.sh
if [ -f scripts/install_browser.sh ]; then bash scripts/install_browser.sh; fi
python -m pytest -m "not slow" -q -p no:cacheprovider -rs --no-fold-skipped "$@"
