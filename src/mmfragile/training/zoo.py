"""Training the model zoo (``scripts/train_zoo.py``); nothing a run imports.

1. **Caption** (:func:`train_tower`): tower + projector learn to *write a caption into the LM's own
   input-embedding space*: image token ``i`` is regressed onto the LM's input embedding of token ``i`` of a
   fixed-length caption of the picture ("<blank lines>The image shows a red circle."). The LM is not
   back-propagated through (minutes on two CPU cores). Data: the easy-VQA *train* split (shape and colour of each
   image, read off its training questions) and synthetic scenes from another seed than the evaluation tables, every
   evaluation scene removed (:func:`mmfragile.data.synthetic.training_scenes`). One run per LM gives
   ``<lm>-caption`` and an early snapshot ``<lm>-caption-weak``.
2. **Answer** (:func:`train_answering`): the frozen LMs answer letter multiple choice by position, whatever a
   perfect caption says. This stage fine-tunes every linear weight of the LM on the answer ID of easy-VQA *train*
   questions in the standard format, the exact caption embeddings in the image slots (so the skill is learnt apart
   from the tower's reading errors), and stores each weight's change at rank 32 (``lora-<lm>-answer``), merged
   into the LM when the checkpoint is built (:mod:`mmfragile.models.zoo`). Test questions are never trained on.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch

from mmfragile.data.easyvqa import has_caption
from mmfragile.models.embedded import image_processor_for
from mmfragile.models.zoo import (IMAGE_SIZE, LMS, N_SLOTS, VISION, ZooLM, tower_checkpoint, weights_dir,
                                  weights_file, zoo_records)


#: caption stage, one run per LM: steps, batch, learning rate, seed -> towers ``<lm>-caption`` (final step) and
#: ``<lm>-caption-weak`` (step ``weak_steps``: deliberately under-trained - reads most colours, shape hardly).
#: Synthetic scenes are a sixth of the pictures: at half (3,000) the tower read easy-VQA shapes 49 % right after
#: 4,000 steps, with a sixth 56 % after 2,500 (README)
TRAIN = dict(steps=2500, weak_steps=400, batch_size=32, lr=3e-3, seed=0, n_synthetic=600)


# ============================================================================================ captions
Piece = tuple[str, str | None]  # (text, attribute it states or None)


#: every caption opens as a sentence: the text-caption control (README) learnt to answer from "The image shows a red
#: circle." in ~100 steps, bare words in the image slots took longer
OPENING: list[Piece] = [("The", None), (" image", None), (" shows", None)]


def easy_vqa_caption(colour: str, shape: str) -> list[Piece]:
    return [*OPENING, (" a", None), (f" {colour}", "colour"), (f" {shape}", "shape"), (".", None)]


def scene_caption(scene) -> list[Piece]:
    """Caption of a synthetic scene: the count, then every shape in reading order (top to bottom, left to right)."""
    from mmfragile.data.synthetic import NUMBER_WORDS

    objs = sorted(scene, key=lambda s: (s.y, s.x))
    n = len(objs)
    out: list[Piece] = [*OPENING, (f" {NUMBER_WORDS[n]}", "count"), (" shape" if n == 1 else " shapes", None),
                        (":", None)]
    for k, s in enumerate(objs):
        if k:
            out.append((" and" if k == n - 1 else ",", None))
        out += [(" a", None), (f" {s.colour}", f"object{k}.colour"), (f" {s.shape}", f"object{k}.shape")]
    return [*out, (".", None)]


@dataclass
class CaptionTargets:
    """Token ids of captions laid into the ``N_SLOTS`` image tokens: right-aligned (the caption ends where the
    question starts), the free slots before it filled with the filler token; ``spans`` maps each attribute to
    its slot range."""

    ids: torch.Tensor                       # [n, N_SLOTS] token ids
    spans: list[dict[str, tuple[int, int]]]


def caption_targets(tokenizer, captions: Sequence[list[Piece]], filler: str) -> CaptionTargets:
    fill = tokenizer(filler, add_special_tokens=False)["input_ids"]
    if len(fill) != 1:
        raise ValueError(f"filler {filler!r} must be one token, got {fill}")
    cache: dict[str, list[int]] = {}
    ids = torch.full((len(captions), N_SLOTS), fill[0], dtype=torch.long)
    spans = []
    for r, cap in enumerate(captions):
        toks, sp = [], {}
        for text, attr in cap:
            t = cache.setdefault(text, tokenizer(text, add_special_tokens=False)["input_ids"])
            if attr:
                sp[attr] = (len(toks), len(toks) + len(t))
            toks += t
        if len(toks) > N_SLOTS:
            raise ValueError(f"caption of {len(toks)} tokens does not fit {N_SLOTS} image tokens: {cap}")
        off = N_SLOTS - len(toks)
        ids[r, off:] = torch.tensor(toks)
        spans.append({a: (s + off, e + off) for a, (s, e) in sp.items()})
    return CaptionTargets(ids, spans)


# ============================================================================================ training data
@dataclass
class TowerData:
    pixels: torch.Tensor        # [n, 3, IMAGE_SIZE, IMAGE_SIZE] float16, preprocessed as the checkpoint does
    captions: list[list[Piece]]
    source: list[str]           # "easy-vqa" | "synthetic"


def _preprocess(images) -> torch.Tensor:
    proc = image_processor_for(IMAGE_SIZE)
    out = []
    for s in range(0, len(images), 256):
        out.append(proc(images[s:s + 256], return_tensors="pt")["pixel_values"].to(torch.float16))
    return torch.cat(out)


def easy_vqa_tower_data(split: str) -> TowerData:
    """Every easy-VQA image of ``split`` whose shape and colour its questions state."""
    from PIL import Image

    from mmfragile.data.easyvqa import image_attributes

    attrs = image_attributes(split)
    keep = sorted((p, a) for p, a in attrs.items() if has_caption(a))
    images = []
    for p, _ in keep:
        with Image.open(p) as im:
            images.append(im.convert("RGB"))
    return TowerData(_preprocess(images), [easy_vqa_caption(a["colour"], a["shape"]) for _, a in keep],
                     ["easy-vqa"] * len(keep))


def synthetic_tower_data(scenes) -> TowerData:
    from mmfragile.data.synthetic import render_scene

    return TowerData(_preprocess([render_scene(sc) for sc in scenes]), [scene_caption(sc) for sc in scenes],
                     ["synthetic"] * len(scenes))


def _concat(parts: Sequence[TowerData]) -> TowerData:
    return TowerData(torch.cat([p.pixels for p in parts]), [c for p in parts for c in p.captions],
                     [s for p in parts for s in p.source])


def training_data(n_synthetic: int = TRAIN["n_synthetic"]) -> TowerData:
    """easy-VQA train images + ``n_synthetic`` synthetic training scenes (never an evaluation scene)."""
    from mmfragile.data.synthetic import training_scenes

    return _concat([easy_vqa_tower_data("train"), synthetic_tower_data([sc for _, sc in training_scenes(n_synthetic)])])


def evaluation_data(n_synthetic: int = 400) -> TowerData:
    """easy-VQA *test* images (labels from the test questions) + the first synthetic evaluation scenes (seed 0):
    held out from training, used only to measure the towers' attribute accuracy."""
    from mmfragile.data.synthetic import IMAGE_KINDS, question_scene

    per_kind = -(-n_synthetic // len(IMAGE_KINDS))
    scenes = [question_scene(0, k, i) for i in range(per_kind) for k in IMAGE_KINDS][:n_synthetic]
    return _concat([easy_vqa_tower_data("test"), synthetic_tower_data(scenes)])


# ============================================================================================ the tower
class TowerProjector(torch.nn.Module):
    """The LLaVA vision path alone: ``vision_tower`` (CLIP ViT) + ``multi_modal_projector``, computed exactly as
    ``LlavaModel.get_image_features`` does (last hidden layer, CLS dropped); its ``state_dict`` keys are the
    LLaVA model's own."""

    def __init__(self, text_config):
        super().__init__()
        from transformers import CLIPVisionConfig, CLIPVisionModel, LlavaConfig
        from transformers.models.llava.modeling_llava import LlavaMultiModalProjector

        vision = CLIPVisionConfig(**VISION)
        self.vision_tower = CLIPVisionModel(vision)
        self.multi_modal_projector = LlavaMultiModalProjector(
            LlavaConfig(vision_config=vision, text_config=text_config, vision_feature_layer=-1,
                        vision_feature_select_strategy="default"))

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        h = self.vision_tower(pixel_values, output_hidden_states=True).hidden_states[-1][:, 1:]
        return self.multi_modal_projector(h)


def _lm_embeddings(lm: ZooLM, token_ids: torch.Tensor) -> tuple[torch.Tensor, object]:
    """The LM's input embeddings of ``token_ids`` exactly as its forward computes them (Gemma scales by
    sqrt(hidden)), and the LM's config."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(lm.path(), dtype=torch.float32)
    with torch.no_grad():
        emb = model.get_input_embeddings()(token_ids).float()
    return emb, model.config


FILLER = "\n"  # free image-token slots read as blank lines before the caption (one token in both tokenizers)


@dataclass
class TrainRecord:
    lm: str
    steps: int
    batch_size: int
    lr: float
    seed: int
    n_train_images: dict
    train_seconds: float
    threads: int
    torch_version: str
    vision_accuracy: dict | None = None


def train_tower(lm_key: str, snapshots: Sequence[int], data: TowerData | None = None, steps: int = TRAIN["steps"],
                batch_size: int = TRAIN["batch_size"], lr: float = TRAIN["lr"], seed: int = TRAIN["seed"],
                progress: bool = True) -> tuple[dict[int, dict[str, torch.Tensor]], TrainRecord]:
    """Train a tower + projector for ``lm_key`` to emit captions in its input-embedding space; return the state
    dicts at each step of ``snapshots`` and the run's record. Loss per image token: cross-entropy of the nearest
    caption-vocabulary embedding (distance logits) + the squared distance to the target embedding, relative to
    the mean squared embedding norm."""
    from tqdm.auto import tqdm
    from transformers import AutoTokenizer

    lm = LMS[lm_key]
    data = data or training_data()
    tok = AutoTokenizer.from_pretrained(lm.path())
    tg = caption_targets(tok, data.captions, FILLER)
    vocab, slot_class = torch.unique(tg.ids, return_inverse=True)
    vocab_emb, text_config = _lm_embeddings(lm, vocab)
    # regress onto standardised embeddings (per-dimension mean / std of the caption vocabulary; folded into the
    # projector's last layer afterwards): the LMs' raw embeddings vary by ~0.1 per dimension, too little signal
    mu, sd = vocab_emb.mean(0), vocab_emb.std(0) + 1e-6
    target = (vocab_emb - mu) / sd
    scale = target.pow(2).sum(-1).mean()
    filler = tok(FILLER, add_special_tokens=False)["input_ids"][0]
    weight = torch.where(vocab == filler, 1.0, 10.0)  # most slots are filler: weigh the caption's words up
    torch.manual_seed(seed)
    net = TowerProjector(text_config)
    emb = net.vision_tower.embeddings
    with torch.no_grad():  # uniform backgrounds give near-identical patches: make the slot positions stand out
        emb.position_embedding.weight.normal_(0.0, 1.0)
        emb.patch_embedding.weight.mul_(0.1)
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.05)
    gen = torch.Generator().manual_seed(seed)
    keep = {}
    t0 = time.perf_counter()
    bar = tqdm(range(1, steps + 1), desc=f"tower {lm_key}", disable=not progress)
    for step in bar:
        idx = torch.randint(len(data.pixels), (batch_size,), generator=gen)
        out = net(data.pixels[idx].float())                                  # [b, slots, d]
        cls = slot_class[idx].reshape(-1)                                    # [b * slots]
        w = weight[cls] / weight[cls].mean()
        d2 = (out.reshape(-1, 1, out.shape[-1]) - target[None]).pow(2).sum(-1) / scale
        loss = ((torch.nn.functional.cross_entropy(-d2 * 10.0, cls, reduction="none") +
                 d2.gather(1, cls[:, None])[:, 0]) * w).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 50 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
        if step in snapshots:
            state = {k: v.detach().clone() for k, v in net.state_dict().items()}
            w2, b2 = "multi_modal_projector.linear_2.weight", "multi_modal_projector.linear_2.bias"
            state[w2] = state[w2] * sd[:, None]
            state[b2] = state[b2] * sd + mu
            keep[step] = state
    rec = TrainRecord(lm_key, steps, batch_size, lr, seed,
                      {k: int(v) for k, v in pd.Series(data.source).value_counts().items()},
                      round(time.perf_counter() - t0, 1), torch.get_num_threads(), torch.__version__)
    return keep, rec


@torch.no_grad()
def vision_accuracy(state: dict[str, torch.Tensor], lm_key: str, data: TowerData, batch: int = 256) -> dict[str, float]:
    """Attribute accuracy (%) of a tower: each image token is read as its nearest caption-vocabulary embedding
    (L2, in the LM's input-embedding space); an attribute counts as seen when all its tokens are read right.
    Keys: ``easy-vqa`` (colour and shape), ``synthetic`` (count and every object's colour and shape), per
    attribute kind (``easy-vqa/colour``, ``synthetic/count``, ...), and ``caption`` (% of whole captions right)."""
    from transformers import AutoTokenizer

    lm = LMS[lm_key]
    tok = AutoTokenizer.from_pretrained(lm.path())
    tg = caption_targets(tok, data.captions, FILLER)
    vocab = torch.unique(torch.cat([tg.ids.reshape(-1), caption_vocabulary(tok)]))
    vocab_emb, text_config = _lm_embeddings(lm, vocab)
    net = TowerProjector(text_config)
    net.load_state_dict({k: v.float() for k, v in state.items()})
    net.eval()
    read = torch.cat([vocab[torch.cdist(net(data.pixels[s:s + batch].float()), vocab_emb[None]).argmin(-1)]
                      for s in range(0, len(data.pixels), batch)])
    hits: dict[str, list[bool]] = {}
    for r, (src, spans) in enumerate(zip(data.source, tg.spans)):
        for attr, (a, b) in spans.items():
            ok = bool((read[r, a:b] == tg.ids[r, a:b]).all())
            hits.setdefault(src, []).append(ok)
            hits.setdefault(f"{src}/{attr.split('.')[-1]}", []).append(ok)
        hits.setdefault("caption", []).append(bool((read[r] == tg.ids[r]).all()))
    return {k: round(100 * float(np.mean(v)), 2) for k, v in sorted(hits.items())}


def caption_vocabulary(tokenizer) -> torch.Tensor:
    """Token ids of every word any caption can use (so decoding can confuse any colour with any other)."""
    from mmfragile.data import easyvqa, synthetic

    words = {*(text for text, _ in OPENING), " a", " and", ",", ":", ".", " shape", " shapes", FILLER}
    words |= {f" {w}" for w in [*easyvqa.SHAPES, *easyvqa.image_colours(), *synthetic.SHAPES, *synthetic.COLOURS,
                                 *synthetic.NUMBER_WORDS]}
    ids = [i for w in sorted(words) for i in tokenizer(w, add_special_tokens=False)["input_ids"]]
    return torch.tensor(sorted(set(ids)))


def save_weights(kind: str, key: str, state: dict[str, torch.Tensor], folder: Path | None = None) -> Path:
    """Weights as float16 safetensors (a tower about 1.4 MB; rank-32 changes of every linear weight of SmolLM2 about
    20 MB)."""
    from safetensors.torch import save_file

    path = weights_file(kind, key, folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.to(torch.float16).contiguous() for k, v in state.items()}, str(path),
              metadata={"kind": kind, "key": key})
    return path


def save_record(name: str, record: dict, folder: Path | None = None) -> None:
    folder = folder or weights_dir()
    records = zoo_records(folder)
    records[name] = record
    (folder / "zoo.json").write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")


# ============================================================================================ evaluation
def halfway_score(accuracy: float, chance: float) -> float:
    """Where ``accuracy`` lies between chance (0) and perfect (1)."""
    return (accuracy - chance) / (1 - chance)


def mc_accuracy(model, questions: pd.DataFrame, store_dir: str | Path, progress: bool = False) -> dict[str, float]:
    """Multiple-choice accuracy in the dataset's standard prompt format under circular evaluation: each question's
    share of correct circular shifts (exact match of the raw output, uncovered = wrong), averaged over questions;
    ``chance`` = mean of 1 / options; ``halfway`` = :func:`halfway_score`; ``coverage`` over all items;
    ``by_category``: accuracy per question category (easy-VQA: colour / shape / yes/no)."""
    from mmfragile.runner import run_items
    from mmfragile.studies.format_bias.prompts import exact_match_score
    from mmfragile.studies.format_bias.items import format_bias_items
    from mmfragile.store import ResultStore

    items = format_bias_items(model, questions, formats=[], include_standard=True)
    store = ResultStore(store_dir, config={"study": "zoo-mc-accuracy", "model": model.name, "n": len(questions)})
    res = run_items(model, items, store, exact_match_score, progress=progress)
    per_q = res.groupby("question_id").agg(correct=("correct", "mean"), n_options=("n_options", "first"),
                                           category=("category", "first"))
    acc, chance = float(per_q.correct.mean()), float((1 / per_q.n_options).mean())
    return {"accuracy": round(100 * acc, 2), "chance": round(100 * chance, 2),
            "halfway": round(halfway_score(acc, chance), 3), "coverage": round(100 * float(res.covered.mean()), 2),
            "by_category": {str(c): round(100 * float(v), 2)
                            for c, v in per_q.groupby("category").correct.mean().items()},
            "n_questions": int(len(per_q)), "n_items": int(len(res))}


# ============================================================================================ answering
#: The answering stage. The frozen LMs answer letter multiple choice by position, whatever a perfect caption says,
#: so the LM learns to answer: every linear weight of its layers is fine-tuned (LoRA at rank 8-16 did not turn in
#: 110-130 steps; README) on the answer ID of easy-VQA *train* questions in the standard format, the picture's
#: *exact* caption embeddings in the image slots (what a perfect caption tower writes: the skill is learnt apart
#: from the tower's reading errors, and the tower is never trained through the LM). Each weight's change is stored
#: at rank ``rank`` (truncated SVD) and merged into the LM when a checkpoint is built; a zoo model joins the
#: answering LM with a caption tower.
ANSWER = dict(targets=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                       "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"),
              steps=300, batch_size=8, lr=5e-5, warmup=10, max_grad_norm=1.0, rank=32, seed=0)


def low_rank_state(deltas: dict[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
    """Weight changes ``{path}.weight -> D`` as ``{path}.lora_A`` (rank x in) / ``{path}.lora_B`` (out x rank):
    the best rank-``rank`` approximation of each D (truncated SVD), so :func:`lora_deltas` gives it back."""
    out = {}
    for name, d in deltas.items():
        u, sv, vh = torch.linalg.svd(d.float(), full_matrices=False)
        r = min(rank, len(sv))
        path = name[:-len(".weight")]
        out[f"{path}.lora_A"] = vh[:r].contiguous()
        out[f"{path}.lora_B"] = (u[:, :r] * sv[:r]).contiguous()
    return out


def answer_training_questions(questions: pd.DataFrame, attributes: dict[str, dict], n: int,
                               seed: int) -> pd.DataFrame:
    """``n`` questions (easy-VQA's own mix of yes/no, colour and shape) in random order, each on an image whose shape
    and colour ``attributes`` (:func:`~mmfragile.data.easyvqa.image_attributes`) know, so its caption is exact."""
    known = questions.images.map(lambda ims: has_caption(attributes.get(ims[0], {})))
    pool = questions[known]
    if len(pool) < n:
        raise ValueError(f"{n} training questions asked, {len(pool)} have an image of known shape and colour")
    return pool.sample(n, random_state=seed).reset_index(drop=True)


def answer_training_prompts(questions: pd.DataFrame, eos: str, seed: int,
                            standard_share: float) -> tuple[list, list[str], list[str]]:
    """One training prompt per question: the standard format with probability ``standard_share``, else one of the
    48 formats of Table 1 drawn uniformly; a random circular shift; the paper's instruction (as
    :func:`~mmfragile.runner.format_bias_items` asks). Returns prompts, target texts (answer ID + end of turn)
    and the format names."""
    from mmfragile.studies.format_bias.prompts import all_formats, build_mc_prompt, standard_format

    fmts = all_formats()
    rng = np.random.default_rng(seed)
    prompts, targets, names = [], [], []
    for rec in questions.to_dict("records"):
        std = rng.random() < standard_share
        fmt = standard_format(rec["dataset"]) if std else fmts[int(rng.integers(len(fmts)))]
        fp = build_mc_prompt(rec, fmt, shift=int(rng.integers(len(rec["options"]))), instruction="paper")
        p = fp.to_prompt()
        p.images = list(rec["images"])
        prompts.append(p)
        targets.append(fp.answer_id + eos)
        names.append("standard" if std else fmt.name)
    return prompts, targets, names


@dataclass
class Examples:
    """The training set of an answering-stage fine-tune (:func:`train_answering`), one entry per example: the
    prompt (its images only stand for image-token slots), the target text the LM learns to write after it (+ end of
    turn), the caption token ids laid into its image slots (``[n_images * N_SLOTS]``, images in prompt order; empty
    for a text-only prompt), and a category for the running training accuracy. ``image_slots`` says what the slots
    carry (for the record)."""

    prompts: list
    targets: list[str]
    slots: list[torch.Tensor]
    categories: list[str]
    image_slots: str

    def __len__(self) -> int:
        return len(self.prompts)

    def __post_init__(self):
        if not len(self.prompts) == len(self.targets) == len(self.slots) == len(self.categories):
            raise ValueError("prompts, targets, slots and categories must have one entry per example")


#: ``build(tokenizer, eos, n, seed) -> Examples``: ``n`` training examples for the LM of ``tokenizer`` (end of turn
#: ``eos``), drawn with ``seed``
ExampleBuilder = Callable[[object, str, int, int], Examples]


def exact_caption_slots(tokenizer, captions: Sequence[list[Piece]]) -> list[torch.Tensor]:
    """One slot row per caption: the caption's token ids right-aligned in the ``N_SLOTS`` image tokens, filler
    before (what a perfect caption tower writes, :func:`caption_targets`)."""
    return list(caption_targets(tokenizer, captions, FILLER).ids)


def standard_format_examples(tokenizer, eos: str, n: int, seed: int) -> Examples:
    """The zoo's answering stage: ``n`` easy-VQA *train* questions in the standard format of study 1 (random circular
    shift), target = the answer ID + end of turn, the picture's exact caption in the image slots."""
    from mmfragile.data.easyvqa import image_attributes, load_easy_vqa

    attrs = image_attributes("train")
    qs = answer_training_questions(load_easy_vqa("train", n=None, seed=seed + 1), attrs, n, seed)
    prompts, targets, _ = answer_training_prompts(qs, eos, seed, standard_share=1.0)
    captions = [easy_vqa_caption(attrs[p.images[0]]["colour"], attrs[p.images[0]]["shape"]) for p in prompts]
    return Examples(prompts, targets, exact_caption_slots(tokenizer, captions), qs.category.tolist(),
                    "exact caption embeddings (right-aligned, filler before)")


@dataclass
class AnswerRecord:
    lm: str
    steps: int
    batch_size: int
    lr: float
    warmup: int
    rank: int
    seed: int
    n_questions: int  # training examples (one per step x batch row)
    image_slots: str
    train_seconds: float
    threads: int
    torch_version: str
    train_accuracy: dict  # running accuracy of the last 20 steps (see train_answering), overall and per category


def train_answering(lm_key: str, snapshots: Sequence[int], build: ExampleBuilder = standard_format_examples,
                    steps: int = ANSWER["steps"], batch_size: int = ANSWER["batch_size"], lr: float = ANSWER["lr"],
                    warmup: int = ANSWER["warmup"], max_grad_norm: float = ANSWER["max_grad_norm"],
                    rank: int = ANSWER["rank"], seed: int = ANSWER["seed"], progress: bool = True,
                    on_snapshot: Callable[[int, dict[str, torch.Tensor]], None] | None = None,
                    ) -> tuple[dict[int, dict[str, torch.Tensor]], AnswerRecord]:
    """Fine-tune ``lm_key``'s linear weights on the examples ``build`` draws (``steps * batch_size`` of them, seeded;
    default: easy-VQA *train* questions in the standard prompt format of study 1, :func:`standard_format_examples`),
    each prompt's image slots holding the caption token embeddings the builder lays there (the exact captions of
    the pictures, or what a blind recipe puts there) instead of the tower's outputs. Loss: cross-entropy of the
    target tokens (the answer + end of turn). AdamW, linear warm-up then cosine decay to a tenth, gradients clipped
    to norm ``max_grad_norm``. The running training accuracy counts an example as right when the LM predicts every
    target token (teacher-forced: a multiple-choice answer ID and the end of turn). Returns ``{step: rank-``rank`` weight changes as lora_A / lora_B}`` for each step of
    ``snapshots`` (also handed to ``on_snapshot`` as taken) and the run's record."""
    from tqdm.auto import tqdm

    from mmfragile.models.hf import HFModel

    lm = LMS[lm_key]
    # any caption tower gives the LLaVA wrapper (processor, image token); its outputs are replaced by captions
    model = HFModel.from_pretrained(tower_checkpoint(lm_key, f"{lm_key}-caption"), name=f"zoo-{lm_key}-answering")
    net, embed = model.model, model.model.get_input_embeddings()
    for p in net.parameters():
        p.requires_grad_(False)
    weights = {f"layers.{i}.{t}.weight": layer.get_submodule(t).weight
               for i, layer in enumerate(net.model.language_model.layers) for t in ANSWER["targets"]}
    start = {k: w.detach().clone() for k, w in weights.items()}
    for w in weights.values():
        w.requires_grad_(True)
    opt = torch.optim.AdamW(list(weights.values()), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * (0.1 + 0.45 * (1 + np.cos(np.pi * min(s, steps) / steps))))
    data = build(model.tokenizer, lm.eos[0], steps * batch_size, seed)
    keep, t0, hits = {}, time.perf_counter(), []
    net.train()
    bar = tqdm(range(1, steps + 1), desc=f"answering {lm_key}", disable=not progress)
    for step in bar:
        sl = slice((step - 1) * batch_size, step * batch_size)
        enc = model.encode(data.prompts[sl], data.targets[sl])
        n_cont = enc.pop("cont_lengths")
        k = int(n_cont.max())
        ids = enc["input_ids"]
        with torch.no_grad():
            emb = embed(ids)
            slots = torch.cat(data.slots[sl])
            if len(slots):
                emb[ids == net.config.image_token_id] = embed(slots).reshape(-1, emb.shape[-1])
        with torch.autocast("cpu", dtype=torch.bfloat16):  # bf16 matmuls: ~2x faster on these CPUs
            logits = net(inputs_embeds=emb, attention_mask=enc["attention_mask"],
                         logits_to_keep=k + 1).logits[:, :-1].float()  # the positions predicting the target
        labels = ids[:, -k:]
        mask = torch.arange(k)[None] >= (k - n_cont)[:, None]
        loss = torch.nn.functional.cross_entropy(logits[mask], labels[mask])
        opt.zero_grad()
        loss.backward()
        # Gemma-3 base has never ended a turn: its first steps' end-of-turn loss (~30 nats) would otherwise fill
        # Adam's second moments for hundreds of steps
        torch.nn.utils.clip_grad_norm_(list(weights.values()), max_grad_norm)
        opt.step()
        sched.step()
        whole = ((logits.argmax(-1) == labels) | ~mask).all(-1)         # every target token right
        hits += zip(data.categories[sl], whole.tolist())
        bar.set_postfix(loss=f"{loss.item():.3f}", acc=f"{np.mean([h for _, h in hits[-20 * batch_size:]]):.2f}")
        if step in snapshots:
            keep[step] = low_rank_state({k: w.detach() - start[k] for k, w in weights.items()}, rank)
            if on_snapshot:
                on_snapshot(step, keep[step])
    net.eval()
    last = pd.DataFrame(hits[-20 * batch_size:], columns=["category", "hit"])
    accuracy = {"all": round(float(last.hit.mean()), 3),
                **{str(c): round(float(v), 3) for c, v in last.groupby("category").hit.mean().items()}}
    rec = AnswerRecord(lm_key, steps, batch_size, lr, warmup, rank, seed, len(data), data.image_slots,
                       round(time.perf_counter() - t0, 1), torch.get_num_threads(), torch.__version__, accuracy)
    return keep, rec
