"""GPU benchmark: the prefix-sharing engine against batched ``generate`` on 7B-shaped VLMs, in one command.

Builds LLaVA-1.5-7B and Qwen2.5-VL-7B at their real shapes (configs below, from the published config.json files)
with random bf16 weights directly on the GPU - no download: the cost of a one-token answer does not depend on the
weight values - and their real image processors (LLaVA: 336 px CLIP crop, 576 image tokens; Qwen2.5-VL: min/max
pixels 3136 / 12845056, so a 4K image is ~10,500 tokens). The tokenizer is a byte-level BPE learnt from the prompts
themselves, which segments them as a real vocabulary does (on these prompts it gives SmolLM2's tokenizer's counts),
so prompts have realistic token counts. For each model and each dataset shape (MMBench-dev, A-OKVQA, HRBench-4K: a
typical image size, 4-option questions, 48 formats + standard x 4 circular shifts = 196 prompts per question) it
times the engine over whole questions and batched generate over a subset of the same prompts, and prints prompts/s,
tokens/s, model FLOP utilisation (MFU) against the H200's measured bf16 peak, peak GPU memory, and the GPU-minutes
each path extrapolates to for the whole 48-format grid of one model (Table 6's rows x 48 prompts per dataset).

    python scripts/benchmark_gpu.py                          # one H200: both models, all three datasets, < 8 min
    python scripts/benchmark_gpu.py --tiny --device cpu      # the same code path on tiny shapes (tests, no GPU)
    python scripts/benchmark_gpu.py --models qwen2.5-vl-7b --datasets HRBench-4K --budget-s 200

A time budget (``--budget-s``, default 450 s including model builds) bounds the run: every (model, dataset) cell
gets an equal share of what is left, measures at least one question and one generate batch, and stops adding more
when its share is spent. Runs with torch >= 2.11, its torchvision (transformers' image and video processors use it)
and transformers >= 5.17 (no API newer than those is used), and this repository's ``src`` (the script puts it on
the path).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

#: Table 6 of the format-bias paper: evaluations per format (the circular copies are rows of their own)
GRID_ROWS = {"MMBench-dev": 4876, "A-OKVQA": 4580, "HRBench-4K": 800}
FORMATS = 48
#: a typical image of each dataset: MMBench-dev images are mostly ~512 px, A-OKVQA's are COCO (640 x 480), HR-Bench
#: 4K's are 4K frames
IMAGE_SIZES = {"MMBench-dev": (512, 384), "A-OKVQA": (640, 480), "HRBench-4K": (3840, 2160)}
#: the dataset whose Table 5 standard format the questions get
STANDARD_OF = {"MMBench-dev": "MMBench", "A-OKVQA": "A-OKVQA", "HRBench-4K": "HRBench-4K"}
#: measured bf16 dense peak of one H200 (the issue's figure; the datasheet says 989 TFLOP/s)
PEAK_TFLOPS = 790.0
#: the 15-GPU-minute target for the MMBench-dev grid of a 7B model
TARGET_MINUTES = 15.0
#: prompt tokens per batched-generate forward at most (16 prompts of an MMBench question; 6 of a 4K Qwen prompt)
GENERATE_TOKENS_PER_BATCH = 65536

# ---------------------------------------------------------------------------------------------- the models
#: llava-hf/llava-1.5-7b-hf config.json
LLAVA_15_7B = dict(
    text=dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
              num_key_value_heads=32, vocab_size=32064, max_position_embeddings=4096, rms_norm_eps=1e-5),
    vision=dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16, image_size=336,
                patch_size=14, projection_dim=768, hidden_act="quick_gelu", layer_norm_eps=1e-5),
)
#: Qwen/Qwen2.5-VL-7B-Instruct config.json
QWEN25_VL_7B = dict(
    text=dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
              num_key_value_heads=4, vocab_size=152064, max_position_embeddings=128000, rms_norm_eps=1e-6,
              rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]}),
    vision=dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584, patch_size=14,
                spatial_merge_size=2, temporal_patch_size=2, window_size=112, fullatt_block_indexes=[7, 15, 23, 31],
                tokens_per_second=2, hidden_act="silu"),
)
#: --tiny: the same architectures, processors and prompts, narrow and shallow (for a CPU run of the code path)
TINY = {
    "llava-1.5-7b": dict(text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                                   num_key_value_heads=2),
                         vision=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                     projection_dim=32)),
    "qwen2.5-vl-7b": dict(text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                                    num_key_value_heads=1,
                                    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0,
                                                     "mrope_section": [4, 6, 6]}),
                          vision=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                                      fullatt_block_indexes=[1])),
}


def _merge(base: dict, tiny: dict | None) -> dict:
    return {k: {**v, **(tiny or {}).get(k, {})} for k, v in base.items()}


def build_llava(texts, device, dtype, tiny: bool):
    import transformers

    from mmfragile.models.hf import HFModel
    from mmfragile.models.tiny import chat_template, make_tokenizer

    shape = _merge(LLAVA_15_7B, TINY["llava-1.5-7b"] if tiny else None)
    tok = make_tokenizer("Qwen2Tokenizer", {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>",
                                            "unk_token": "<unk>"}, named={"image_token": "<image>"}, train_on=texts)
    cfg = transformers.LlavaConfig(
        vision_config=transformers.CLIPVisionConfig(**shape["vision"]),
        text_config=transformers.LlamaConfig(**shape["text"], pad_token_id=tok.pad_token_id,
                                             bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id),
        image_token_index=tok.image_token_id, projector_hidden_act="gelu", vision_feature_layer=-2,
        vision_feature_select_strategy="default", image_seq_length=576)
    # llava-hf/llava-1.5-7b-hf preprocessor_config.json: resize the short side to 336, centre-crop 336 x 336
    ip = transformers.CLIPImageProcessor(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336})
    proc = transformers.LlavaProcessor(image_processor=ip, tokenizer=tok, patch_size=14,
                                       vision_feature_select_strategy="default", num_additional_image_tokens=1,
                                       chat_template=chat_template("llava"))
    return HFModel(_instantiate(transformers.LlavaForConditionalGeneration, cfg, tok, device, dtype), proc,
                   name="llava-1.5-7b")


def build_qwen(texts, device, dtype, tiny: bool):
    import transformers

    from mmfragile.models.hf import HFModel
    from mmfragile.models.tiny import CHATML, QWEN_VL_TOKENS, chat_template, make_tokenizer

    shape = _merge(QWEN25_VL_7B, TINY["qwen2.5-vl-7b"] if tiny else None)
    tok = make_tokenizer("Qwen2Tokenizer", CHATML, extra=QWEN_VL_TOKENS, train_on=texts,
                         named={"image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
                                "vision_start_token": "<|vision_start|>", "vision_end_token": "<|vision_end|>"})
    ids = dict(image_token_id=tok.image_token_id, video_token_id=tok.video_token_id,
               vision_start_token_id=tok.vision_start_token_id, vision_end_token_id=tok.vision_end_token_id)
    cfg = transformers.Qwen2_5_VLConfig(
        text_config=transformers.Qwen2_5_VLTextConfig(**shape["text"], pad_token_id=tok.pad_token_id,
                                                      eos_token_id=tok.eos_token_id, tie_word_embeddings=False),
        vision_config=transformers.Qwen2_5_VLVisionConfig(**shape["vision"]), **ids)
    # Qwen/Qwen2.5-VL-7B-Instruct preprocessor_config.json
    ip = transformers.Qwen2VLImageProcessor(patch_size=14, merge_size=2, temporal_patch_size=2,
                                            size={"shortest_edge": 3136, "longest_edge": 12845056})
    proc = transformers.Qwen2_5_VLProcessor(image_processor=ip, tokenizer=tok,
                                            video_processor=transformers.Qwen2VLVideoProcessor(),
                                            chat_template=chat_template("qwen2_vl"))
    return HFModel(_instantiate(transformers.Qwen2_5_VLForConditionalGeneration, cfg, tok, device, dtype), proc,
                   name="qwen2.5-vl-7b")


def _instantiate(cls, cfg, tok, device, dtype):
    """Random weights allocated and initialised on ``device`` in ``dtype`` (a 7B model never touches the host)."""
    with torch.device(device):
        model = cls._from_config(cfg, dtype=dtype)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return model.eval()


MODELS = {"llava-1.5-7b": build_llava, "qwen2.5-vl-7b": build_qwen}


# ---------------------------------------------------------------------------------------------- work and its cost
def questions(dataset: str, n: int, folder: str):
    """``n`` 4-option questions on photo-sized JPEGs of the dataset's typical size (a different image each)."""
    from mmfragile.data.synthetic import benchmark_questions

    return benchmark_questions(folder, IMAGE_SIZES[dataset], n, dataset=STANDARD_OF[dataset], prefix=dataset)


def prompt_texts() -> list[str]:
    """Every prompt text of the grid, to learn the tokenizer's merges from (the formats' instructions included)."""
    import pandas as pd

    from mmfragile.data.synthetic import BENCHMARK_QUESTIONS
    from mmfragile.studies.format_bias.items import format_bias_items

    class _Lengths:  # format_bias_items asks the model for ID token lengths only
        def max_id_tokens(self, ids):
            return 1

    qs = pd.DataFrame([{"dataset": "MMBench", "question_id": str(i), "question": q, "options": o, "answer": 0,
                        "images": [], "category": "x", "modality": "text"}
                       for i, (q, o) in enumerate(BENCHMARK_QUESTIONS)])
    return [it.prompt.text for it in format_bias_items(_Lengths(), qs)]


class Cost:
    """Model FLOPs: 2 x (linear weights) per language-model token and per vision-tower patch, plus the language
    model's attention (4 x layers x width x context per token; the vision tower's attention is not counted, so MFU
    is a lower bound where a 4K image runs through Qwen's full-attention blocks)."""

    def __init__(self, model):
        lm = model.model.get_decoder() if hasattr(model.model, "get_decoder") else model.model
        text = model.model.config.get_text_config()
        self.lm_linear = sum(m.weight.numel() for m in lm.modules() if isinstance(m, torch.nn.Linear))
        vision = [m for n, m in model.model.named_modules() if n.endswith(("vision_tower", "visual"))]
        self.vis_linear = sum(p.numel() for v in vision[:1] for p in v.parameters() if p.dim() >= 2)
        self.attn = 4 * text.num_hidden_layers * text.num_attention_heads * (
            getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads)

    def lm(self, start: int, n: int) -> float:
        """FLOPs of ``n`` tokens at positions start .. start + n - 1 (causal attention over what precedes)."""
        return 2.0 * self.lm_linear * n + self.attn * (n * start + n * (n + 1) / 2)

    def vision(self, patches: int) -> float:
        return 2.0 * self.vis_linear * patches


def image_patches(enc: dict, model) -> int:
    """Patches the vision tower runs over for one encode (Qwen: the grid; CLIP: the crop's patches + CLS)."""
    if enc.get("image_grid_thw") is not None:
        return int(enc["image_grid_thw"].prod(-1).sum())
    v = model.model.config.vision_config
    return int(enc["pixel_values"].shape[0]) * ((v.image_size // v.patch_size) ** 2 + 1)


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def peak_memory(device, reset: bool = False) -> float | None:
    if torch.device(device).type != "cuda":
        return None
    if reset:
        torch.cuda.reset_peak_memory_stats()
    return torch.cuda.max_memory_allocated() / 2**30


def measure(model, dataset: str, n_questions: int, gen_prompts: int, batch_size: int, budget_s: float, device,
            folder: str) -> dict:
    """One (model, dataset) cell: the engine over whole questions, then batched generate over the first prompts of
    one question, within ``budget_s`` (at least one question and one batch)."""
    from mmfragile.engine import PrefixSharingEngine, _common_prefix_len
    from mmfragile.studies.format_bias.items import format_bias_items

    t0 = time.perf_counter()
    qs = questions(dataset, n_questions + 1, folder)  # + 1: the warm-up question
    groups = [format_bias_items(model, qs.iloc[[i]]) for i in range(len(qs))]
    engine, cost = PrefixSharingEngine(model), Cost(model)
    # shape of one question: shared prefix, each variant's length, image patches
    rows, enc0, _ = engine.group_rows([it.prompt for it in groups[1]])
    lengths = [len(r) for r in rows]
    plen = min(_common_prefix_len(rows), min(lengths) - 1)  # as the engine splits them
    patches = image_patches(enc0, model)
    image_tokens = int(torch.isin(rows[0], engine._media).sum())
    del enc0

    def run_engine(items):
        return engine.run_group([it.prompt for it in items], [it.option_ids for it in items],
                                [it.max_new_tokens for it in items])

    run_engine(groups[0])  # warm-up: kernels, allocator, the sampled splice check
    sync(device)
    peak_memory(device, reset=True)
    eng_s, eng_prompts, eng_flops, eng_tokens, answers = 0.0, 0, 0.0, 0, {}
    for items in groups[1:]:
        stats = dict(engine.stats)
        t = time.perf_counter()
        outs = run_engine(items)
        sync(device)
        eng_s += time.perf_counter() - t
        prefix, tails = (engine.stats[k] - stats[k] for k in ("prefix_tokens", "tail_tokens"))
        eng_prompts += len(items)
        eng_tokens += prefix + tails
        eng_flops += cost.lm(0, prefix) + cost.vision(patches) + len(items) * cost.lm(prefix, tails / len(items))
        if items is groups[1]:  # generate below answers this question's first prompts
            answers = {it.key["variant"]: o.text for it, o in zip(items, outs)}
        if time.perf_counter() - t0 > 0.5 * budget_s:
            break
    eng_mem = peak_memory(device)

    # batched generate on the first prompts of question 1 (each batch at its items' own max_new_tokens)
    items = groups[1]
    model.batch_size = min(batch_size, max(1, GENERATE_TOKENS_PER_BATCH // max(lengths)))
    model.generate([items[0].prompt], max_new_tokens=1)  # warm-up
    sync(device)
    peak_memory(device, reset=True)
    gen_s, gen_done, gen_flops, same = 0.0, 0, 0.0, 0
    n_gen = min(gen_prompts, len(items))
    for s in range(0, n_gen, model.batch_size):
        batch = items[s:min(s + model.batch_size, n_gen)]
        t = time.perf_counter()
        by_len: dict[int, list] = {}
        for it in batch:
            by_len.setdefault(it.max_new_tokens, []).append(it)
        for n, sub in by_len.items():
            outs = model.generate([it.prompt for it in sub], max_new_tokens=n)
            same += sum(answers.get(it.key["variant"]) == o for it, o in zip(sub, outs))
        sync(device)
        gen_s += time.perf_counter() - t
        gen_done += len(batch)
        gen_flops += sum(cost.lm(0, lengths[s + j]) + cost.vision(patches) for j in range(len(batch)))
        if time.perf_counter() - t0 > budget_s:
            break
    gen_mem = peak_memory(device)
    full_tokens = sum(lengths) / len(lengths)
    return {"dataset": dataset, "image": "x".join(map(str, IMAGE_SIZES[dataset])), "image_tokens": image_tokens,
            "prefix_tokens": plen, "tail_tokens": (sum(lengths) - plen * len(lengths)) / len(lengths),
            "engine": {"questions": eng_prompts // len(groups[1]), "prompts": eng_prompts, "seconds": eng_s,
                       "tokens": eng_tokens, "flops": eng_flops, "peak_gib": eng_mem,
                       "served_tokens": eng_prompts * full_tokens},
            "generate": {"prompts": gen_done, "seconds": gen_s, "tokens": gen_done * full_tokens, "flops": gen_flops,
                         "peak_gib": gen_mem, "served_tokens": gen_done * full_tokens, "same_answers": same,
                         "batch": model.batch_size},
            "cell_seconds": time.perf_counter() - t0}


# ---------------------------------------------------------------------------------------------- report
def table_rows(r: dict, peak_tflops: float) -> list[str]:
    """The table's rows of one (model, dataset) cell: engine and batched generate."""
    grid = GRID_ROWS[r["dataset"]] * FORMATS
    out = []
    for path in ("engine", "generate"):
        p = r[path]
        if not p["prompts"] or not p["seconds"]:
            continue
        rate = p["prompts"] / p["seconds"]
        what = (f"{p['prompts']} ({p['questions']} q)" if path == "engine" else
                f"{p['prompts']}, batch {p['batch']} ({p['same_answers']} as the engine)")
        memory = "-" if p["peak_gib"] is None else f"{p['peak_gib']:.1f} GiB"
        out.append(f"| {r['model']} | {r['dataset']} ({r['image']}) | {r['image_tokens']:,} / {r['prefix_tokens']:,} / "
                   f"{r['tail_tokens']:.0f} | {path} | {what} | {rate:.1f} | {p['tokens'] / p['seconds']:,.0f} | "
                   f"{p['served_tokens'] / p['seconds']:,.0f} | {p['flops'] / p['seconds'] / (peak_tflops * 1e12):.1%}"
                   f" | {memory} | **{grid / rate / 60:,.1f}** ({grid:,}) |")
    return out


def report(results: list[dict], peak_tflops: float, device) -> str:
    lines = [f"device: {torch.cuda.get_device_name() if torch.device(device).type == 'cuda' else 'cpu'}; "
             f"torch {torch.__version__}; transformers {__import__('transformers').__version__}; MFU against "
             f"{peak_tflops:.0f} TFLOP/s; grid = Table 6 rows x {FORMATS} formats",
             "| model | dataset (image) | image / prefix / tail tokens | path | prompts | prompts/s | "
             "computed tokens/s | served tokens/s | MFU | peak GPU memory | grid GPU-minutes (prompts) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [row for r in results for row in table_rows(r, peak_tflops)]
    for r in results:
        if r["dataset"] == "MMBench-dev" and r["engine"]["seconds"]:
            minutes = GRID_ROWS["MMBench-dev"] * FORMATS / (r["engine"]["prompts"] / r["engine"]["seconds"]) / 60
            lines.append(f"{r['model']}: MMBench-dev grid {minutes:.1f} GPU-minutes with the engine "
                         f"(target <= {TARGET_MINUTES:.0f}: {'met' if minutes <= TARGET_MINUTES else 'NOT met'})")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--datasets", default=",".join(GRID_ROWS))
    ap.add_argument("--questions", type=int, default=6, help="engine questions per cell (196 prompts each), at most")
    ap.add_argument("--generate-prompts", type=int, default=48, help="batched-generate prompts per cell, at most")
    ap.add_argument("--batch-size", type=int, default=16, help="batched generate (lmms-eval runs 16-48)")
    ap.add_argument("--budget-s", type=float, default=450.0, help="wall-clock budget of the whole run")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes of the same models (a CPU run of the code path)")
    ap.add_argument("--peak-tflops", type=float, default=PEAK_TFLOPS)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--out", default=None, help="also write the measurements as JSON here")
    a = ap.parse_args()
    import importlib.util

    if importlib.util.find_spec("torchvision") is None:
        sys.exit("torchvision is missing: the Qwen2.5-VL processor needs it (install the wheel matching this torch)")
    if a.threads:
        torch.set_num_threads(a.threads)
    deadline = time.perf_counter() + a.budget_s
    dtype = torch.bfloat16 if torch.device(a.device).type == "cuda" else torch.float32
    models, datasets = a.models.split(","), a.datasets.split(",")
    texts = prompt_texts()
    results: list[dict] = []
    build_s = 0.0
    with tempfile.TemporaryDirectory() as folder:
        for mi, name in enumerate(models):
            left_models = len(models) - mi
            if time.perf_counter() + build_s > deadline:
                print(f"{name}: skipped, the time budget is spent", flush=True)
                continue
            t = time.perf_counter()
            model = MODELS[name](texts, a.device, dtype, a.tiny)
            build_s = time.perf_counter() - t
            params = sum(p.numel() for p in model.model.parameters())
            print(f"{name}: {params / 1e9:.2f} B parameters built on {a.device} in {build_s:.0f} s", flush=True)
            for di, ds in enumerate(datasets):
                cells_left = (left_models - 1) * len(datasets) + len(datasets) - di
                share = (deadline - time.perf_counter() - (left_models - 1) * build_s) / cells_left
                if share <= 0:
                    print(f"{name} / {ds}: skipped, the time budget is spent", flush=True)
                    continue
                r = measure(model, ds, a.questions, a.generate_prompts, a.batch_size, share, a.device, folder)
                r["model"] = name
                results.append(r)
                print("\n".join(table_rows(r, a.peak_tflops)), flush=True)
            del model
            if torch.device(a.device).type == "cuda":
                torch.cuda.empty_cache()
    print()
    print(report(results, a.peak_tflops, a.device))
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
