"""Run `mmfragile export vlmevalkit` datasets with VLMEvalKit's own run.py on a local Hugging Face image-text
checkpoint on CPU (run it with the python of scripts/install_vlmevalkit.sh's venv; docs/harnesses.md).

Why a model class of its own: VLMEvalKit's transformers classes for the zoo's kinds of checkpoint put the model on a
GPU in their constructors (Gemma3: ``device_map="cuda"`` + flash_attention_2; SmolVLM: ``device_map="cuda"``;
LLaVA_Next: ``.cuda()``) and load one architecture each (the zoo's checkpoints are ``LlavaForConditionalGeneration``).
This class is VLMEvalKit's documented extension point (a ``BaseModel`` with ``generate_inner``, docs/en/
Development.md), written as its Gemma3 class's transformers path (``processor.apply_chat_template`` over the
message, ``generate``, decode of the new tokens without special tokens) on CPU, in float32, without the Gemma3
class's system prompt, greedy, at most ``--max-new-tokens``. It is registered in ``vlmeval.config.supported_VLM``
under ``--name`` and run.py runs as it does for any model: dataset building (``LMUData``), ``build_prompt``,
image decoding, inference loop, prediction file.

    LMUData=EXPORT $VENV/bin/python scripts/vlmevalkit_cpu_run.py --model-path CKPT --name ZooGemma3CPU \\
        --max-new-tokens 1 -- --data NAME --mode infer --work-dir RUN_DIR
"""
from __future__ import annotations

import argparse
import sys
from functools import partial

import torch
from PIL import Image
from vlmeval.vlm.base import BaseModel


class HFImageTextCPU(BaseModel):
    INSTALL_REQ = False
    INTERLEAVE = True

    def __init__(self, model_path: str, max_new_tokens: int = 1, **kwargs):
        from transformers import AutoModelForImageTextToText, AutoProcessor

        self.processor = AutoProcessor.from_pretrained(model_path)
        self.model = AutoModelForImageTextToText.from_pretrained(model_path, dtype=torch.float32).eval()
        self.kwargs = dict(do_sample=False, num_beams=1, max_new_tokens=max_new_tokens, **kwargs)

    def generate_inner(self, message, dataset=None):
        # images opened with PIL as VLMEvalKit's LLaVA classes do (transformers' own path loading decodes PNGs with
        # torchvision, whose decode_png fails here: "decode_png.cpp:62, Internal error")
        content = [dict(type="image", image=Image.open(m["value"]).convert("RGB")) if m["type"] == "image"
                   else dict(type="text", text=m["value"]) for m in message]
        inputs = self.processor.apply_chat_template([dict(role="user", content=content)], add_generation_prompt=True,
                                                    tokenize=True, return_dict=True, return_tensors="pt")
        with torch.inference_mode():
            out = self.model.generate(**inputs, **self.kwargs)
        return self.processor.decode(out[0][inputs["input_ids"].shape[-1]:], skip_special_tokens=True)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", required=True, help="local checkpoint folder")
    ap.add_argument("--name", default="HFImageTextCPU", help="VLMEvalKit's model name (prediction file prefix)")
    ap.add_argument("--max-new-tokens", type=int, default=1, help="the exported dataset's answer budget")
    ap.add_argument("run_args", nargs=argparse.REMAINDER, help="-- then run.py's arguments (--data NAME ...)")
    a = ap.parse_args(argv)
    import vlmeval.config
    from vlmeval import run  # the package's copy of VLMEvalKit's run.py

    vlmeval.config.supported_VLM[a.name] = partial(HFImageTextCPU, model_path=a.model_path,
                                                   max_new_tokens=a.max_new_tokens)
    rest = a.run_args[1:] if a.run_args[:1] == ["--"] else a.run_args
    sys.argv = ["run.py", "--model", a.name, *rest]
    run.main()


if __name__ == "__main__":
    main(sys.argv[1:])
