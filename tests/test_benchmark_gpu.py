"""The GPU benchmark's code path runs on CPU (``--tiny``): it is meant to be run as one command on a GPU machine
that this project rarely has, so its every step - real processors, trained tokenizer, engine, batched generate,
cost model, report - is exercised here on tiny shapes of the same architectures."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_gpu_benchmark_runs_its_code_path_on_cpu(tmp_path):
    out = tmp_path / "gpu.json"
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "benchmark_gpu.py"), "--tiny", "--device", "cpu",
                        "--datasets", "MMBench-dev", "--questions", "1", "--generate-prompts", "4", "--threads", "2",
                        "--budget-s", "300", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    results = json.loads(out.read_text())
    assert {r["model"] for r in results} == {"llava-1.5-7b", "qwen2.5-vl-7b"}
    for r in results:
        assert r["engine"]["prompts"] == 196 and r["generate"]["prompts"] == 4
        assert r["generate"]["same_answers"] == 4  # float32 on CPU: batched generate answers as the engine does
        # realistic token counts: LLaVA-1.5's 576 image tokens, Qwen's 18 x 14 merged patches of a 512 x 384 image;
        # a format's tail (options + instruction) is tens of tokens, not the hundreds a byte vocabulary gives
        assert r["image_tokens"] == {"llava-1.5-7b": 576, "qwen2.5-vl-7b": 252}[r["model"]]
        assert 40 < r["tail_tokens"] < 120
    assert "MMBench-dev grid" in p.stdout and "| engine |" in p.stdout and "| generate |" in p.stdout
