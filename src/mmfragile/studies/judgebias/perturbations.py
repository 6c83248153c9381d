"""The nine MM-JudgeBias perturbations (Lee et al., 2026, Sec. 3.3, Table 1 and Table 11).

A judge sample is a triplet (Q, I, R) - query, image(s), response - or a text-only pair (Q, R);
see :class:`JudgeSample`. Each perturbation turns an unbiased sample into its biased counterpart
(Q', I', R') (Sec. 3.1 / 3.4):

================================  =============  ======  ==============================================
name                              dimension      metric  perturbation (Table 1 / Table 11)
================================  =============  ======  ==============================================
``text_dominance``                integrality    BD      image -> black image of the same size
``image_dominance``               integrality    BD      query -> ``""``
``response_dominance``            integrality    BD      query -> ``""`` and image -> black image
``instruction_misalignment``      congruity      BD      query -> query of another, random sample
``image_misalignment``            congruity      BD      image -> image of another, random sample
``detail_description``            robustness     BC      detailed caption of the image appended to Q
``unnecessary_image``             robustness     BC      random unrelated image added to a text-only Q
``visual_transformation``         robustness     BC      1 geometric + 7-9 aesthetic image operations
``texture_insertion``             robustness     BC      keyword or query rendered below the image
================================  =============  ======  ==============================================

Every perturbation is a *pure* function ``f(sample, pool=(), seed=0, **options) -> JudgeSample``:
it never mutates its input (images are copied), is deterministic given ``seed`` (same seed ->
byte-identical pixels), and is *auditable*: the returned sample's ``meta["perturbation"]`` names
the perturbation and ``meta["operations"]`` lists every applied operation with its parameters
(enough to replay it by hand). :func:`save_perturbed` writes a PNG per image plus a JSON sidecar.

Seeding. The random stream of one call is ``numpy.random.default_rng(SeedSequence([seed,
crc32(sample_id), crc32(name)]))``: one global ``seed`` gives each sample (and each perturbation)
its own reproducible draw, as the paper draws a fresh operation set per sample, and the result
does not depend on the order in which samples are processed. Candidates drawn from a ``pool``
are sorted by ``sample_id`` first, so the choice does not depend on the pool's order either.

Model-dependent steps (the paper uses GPT-5.1 for captions, keyword extraction and the
image-relevance filter, Table 11) are injected as callables; :func:`model_captioner`,
:func:`model_keyword_extractor` and :func:`model_relevance_checker` build them from any
:class:`~mmfragile.models.base.MLLM`.
"""
from __future__ import annotations

import copy
import io
import json
import re
import zlib
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageEnhance, ImageFilter, ImageFont, ImageOps

from mmfragile.models.base import MLLM, Prompt
from mmfragile.studies.judgebias.catalog import PERTURBATION_INFO  # noqa: F401  (re-exported)
from mmfragile.studies.judgebias.data import (UNPERTURBED, JudgeSample, as_pil, image_sha256,
                                              load_judge_dir)

__all__ = [
    "JudgeSample",
    "PerturbationError",
    "PERTURBATIONS",
    "PERTURBATION_INFO",
    "UNPERTURBED",
    "GEOMETRIC_OPS",
    "AESTHETIC_OPS",
    "DETAIL_DESCRIPTION_PROMPT",
    "KEYWORD_PROMPT",
    "RELEVANCE_PROMPT",
    "apply_perturbation",
    "text_dominance",
    "image_dominance",
    "response_dominance",
    "instruction_misalignment",
    "image_misalignment",
    "detail_description",
    "unnecessary_image",
    "visual_transformation",
    "texture_insertion",
    "black_image",
    "render_text_strip",
    "heuristic_keyword",
    "model_captioner",
    "model_keyword_extractor",
    "model_relevance_checker",
    "image_sha256",
    "save_perturbed",
    "load_perturbed",
]


class PerturbationError(ValueError):
    """A perturbation cannot be applied to this sample (e.g. no image, no usable pool item)."""


# --------------------------------------------------------------------------------------------
# Taxonomy, prompts
# --------------------------------------------------------------------------------------------

#: Table 11, Detail-Description prompt.
DETAIL_DESCRIPTION_PROMPT = (
    "Generate a detailed description of the image. "
    "The description should be concise and relevant to the image content."
)
#: Table 11, Texture-Insertion keyword-extraction prompt.
KEYWORD_PROMPT = (
    "Extract the important keyword from the given instruction and image. "
    "Keyword should be a single word or a short phrase."
)
#: Table 11, Unnecessary-Image relevance-verification prompt.
RELEVANCE_PROMPT = (
    "Determine whether the given image and query are related. I want to determine whether the "
    "image needs to be referenced to answer the query or not. If the image needs to be "
    "referenced, answer True; if it does not need to be referenced, answer False."
)

#: Template used by :func:`detail_description` (the paper appends the caption to the query but
#: does not print the joining format; this one labels the appended text).
DETAIL_TEMPLATE = "{query}\n\nDetailed description of the image: {caption}"


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def _rng(seed: int, sample: JudgeSample, name: str) -> np.random.Generator:
    if int(seed) < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed}")
    sid = zlib.crc32(str(sample.sample_id).encode("utf-8"))
    nid = zlib.crc32(name.encode("utf-8"))
    return np.random.default_rng(np.random.SeedSequence([int(seed), sid, nid]))


def _finish(sample: JudgeSample, out: JudgeSample, name: str, ops: list[dict], seed: int | None) -> JudgeSample:
    """Stamp ``out.meta`` with the perturbation record; keep an earlier one in ``history``."""
    meta = out.meta
    prev = sample.meta.get("perturbation")
    if prev not in (None, UNPERTURBED, "none"):
        hist = list(meta.get("history", []))
        hist.append({"perturbation": prev, "operations": copy.deepcopy(sample.meta.get("operations", [])),
                     "seed": sample.meta.get("perturbation_seed")})
        meta["history"] = hist
    meta["perturbation"] = name
    meta["operations"] = ops
    meta["perturbation_seed"] = None if seed is None else int(seed)
    meta["original_query"] = sample.query
    meta["original_image_sha256"] = [image_sha256(as_pil(im)) for im in sample.images]
    meta["image_sha256"] = [image_sha256(as_pil(im)) for im in out.images]
    return out


def _require_images(sample: JudgeSample, name: str) -> None:
    if not sample.images:
        raise PerturbationError(f"{name}: sample {sample.sample_id!r} has no image (text-only items can't take it)")


def _item_key(sample: JudgeSample) -> str:
    return str(sample.meta.get("item_id", sample.sample_id))


def _sorted_pool(pool: Sequence[JudgeSample]) -> list[JudgeSample]:
    return sorted(pool, key=lambda s: str(s.sample_id))  # stable: ties keep pool order


def _pick(rng: np.random.Generator, candidates: list[JudgeSample]) -> JudgeSample:
    return candidates[int(rng.integers(len(candidates)))]


def black_image(like: Image.Image) -> Image.Image:
    """An all-black image with the size and mode of ``like``.

    All channels are zero (so RGB/L/I/F images are all zeros), except that an alpha channel
    (RGBA/LA/PA) is fully opaque, so the image is black rather than transparent; palette images
    get an all-black palette; CMYK uses K=255 and YCbCr/LAB neutral chroma (128).
    """
    mode = like.mode
    if mode in ("RGBA", "LA"):
        fill = (0,) * (len(mode) - 1) + (255,)
        return Image.new(mode, like.size, fill)
    if mode == "CMYK":
        return Image.new(mode, like.size, (0, 0, 0, 255))
    if mode in ("YCbCr", "LAB"):
        return Image.new(mode, like.size, (0, 128, 128))
    if mode in ("P", "PA"):
        im = Image.new(mode, like.size, 0 if mode == "P" else (0, 255))
        im.putpalette([0, 0, 0] * 256)
        return im
    return Image.new(mode, like.size, 0)


# --------------------------------------------------------------------------------------------
# Integrality
# --------------------------------------------------------------------------------------------


def text_dominance(sample: JudgeSample, pool: Sequence[JudgeSample] = (), seed: int = 0) -> JudgeSample:
    """Text-Dominance (Table 1): every image replaced by a black ("null") image of the same size/mode."""
    _require_images(sample, "text_dominance")
    out = sample.copy()
    ops = []
    for i, im in enumerate(sample.images):
        im = as_pil(im)
        out.images[i] = black_image(im)
        ops.append({"op": "replace_image_black", "image": i, "size": list(im.size), "mode": im.mode})
    return _finish(sample, out, "text_dominance", ops, None)


def image_dominance(sample: JudgeSample, pool: Sequence[JudgeSample] = (), seed: int = 0) -> JudgeSample:
    """Image-Dominance (Table 1): the query replaced by the null text ``""``."""
    out = sample.copy()
    out.query = ""
    return _finish(sample, out, "image_dominance", [{"op": "replace_query_empty"}], None)


def response_dominance(sample: JudgeSample, pool: Sequence[JudgeSample] = (), seed: int = 0) -> JudgeSample:
    """Response-Dominance (Table 1): both query (``""``) and image (black) replaced by null inputs."""
    _require_images(sample, "response_dominance")
    out = sample.copy()
    out.query = ""
    ops: list[dict] = [{"op": "replace_query_empty"}]
    for i, im in enumerate(sample.images):
        im = as_pil(im)
        out.images[i] = black_image(im)
        ops.append({"op": "replace_image_black", "image": i, "size": list(im.size), "mode": im.mode})
    return _finish(sample, out, "response_dominance", ops, None)


# --------------------------------------------------------------------------------------------
# Congruity
# --------------------------------------------------------------------------------------------


def instruction_misalignment(sample: JudgeSample, pool: Sequence[JudgeSample] = (), seed: int = 0) -> JudgeSample:
    """Instruction-Misalignment (Table 1): the query replaced by that of a random, unrelated sample.

    Candidates are pool samples from a *different* source item (``sample_id`` and
    ``meta["item_id"]`` both differ) with a non-empty query that differs from this one; samples of
    the same modality (text-only vs with image) are preferred, so an image task gets another image
    task's query. Drawn with the seeded generator; :class:`PerturbationError` if none qualifies.
    """
    rng = _rng(seed, sample, "instruction_misalignment")
    me = sample.query.strip()
    cands = [p for p in _sorted_pool(pool)
             if p.sample_id != sample.sample_id and _item_key(p) != _item_key(sample)
             and p.query.strip() and p.query.strip() != me]
    same = [p for p in cands if p.is_text_only == sample.is_text_only]
    cands = same or cands
    if not cands:
        raise PerturbationError(f"instruction_misalignment: no other sample with a different query in the pool "
                                f"for {sample.sample_id!r}")
    donor = _pick(rng, cands)
    out = sample.copy()
    out.query = donor.query
    ops = [{"op": "replace_query", "from_sample": donor.sample_id, "from_item": _item_key(donor),
            "n_candidates": len(cands)}]
    return _finish(sample, out, "instruction_misalignment", ops, seed)


def image_misalignment(sample: JudgeSample, pool: Sequence[JudgeSample] = (), seed: int = 0) -> JudgeSample:
    """Image-Misalignment (Table 1): the image(s) replaced by those of a random, unrelated sample.

    Candidates are pool samples with at least one image, from a different source item, whose
    images are not pixel-identical to this sample's. :class:`PerturbationError` if none qualifies.
    """
    _require_images(sample, "image_misalignment")
    rng = _rng(seed, sample, "image_misalignment")
    mine = [image_sha256(as_pil(im)) for im in sample.images]
    cands = [p for p in _sorted_pool(pool)
             if p.images and p.sample_id != sample.sample_id and _item_key(p) != _item_key(sample)
             and [image_sha256(as_pil(im)) for im in p.images] != mine]
    if not cands:
        raise PerturbationError(f"image_misalignment: no other sample with a different image in the pool "
                                f"for {sample.sample_id!r}")
    donor = _pick(rng, cands)
    out = sample.copy()
    out.images = [as_pil(im).copy() for im in donor.images]
    ops = [{"op": "replace_images", "from_sample": donor.sample_id, "from_item": _item_key(donor),
            "n_candidates": len(cands)}]
    return _finish(sample, out, "image_misalignment", ops, seed)


# --------------------------------------------------------------------------------------------
# Robustness: detail description, unnecessary image
# --------------------------------------------------------------------------------------------


def model_captioner(model: MLLM, prompt: str = DETAIL_DESCRIPTION_PROMPT,
                    max_new_tokens: int = 256) -> Callable[[Image.Image], str]:
    """A captioner that asks ``model`` for a detailed description (Table 11 prompt), greedily.

    Public API, unused by the study's own runs (they call no model for this step): the one-line way to
    run the paper's captions with a model (GPT-5.1 in Table 11) through ``build_judge_conditions``."""

    def caption(img: Image.Image) -> str:
        return model.generate([Prompt(text=prompt, images=[img])], max_new_tokens=max_new_tokens)[0].strip()

    caption.__name__ = f"model_captioner[{getattr(model, 'name', 'model')}]"
    return caption


def detail_description(sample: JudgeSample, pool: Sequence[JudgeSample] = (), seed: int = 0, *,
                       captioner: Callable[[Image.Image], str] | None = None,
                       template: str = DETAIL_TEMPLATE) -> JudgeSample:
    """Detail-Description (Table 1 / Table 11): a detailed caption of the image appended to the query.

    ``captioner(image) -> str`` produces the description (the paper uses GPT-5.1 with
    :data:`DETAIL_DESCRIPTION_PROMPT`; :func:`model_captioner` wraps any MLLM). With several
    images each is captioned and the captions are joined with blank lines. The response is left
    unchanged. The caption is recorded in ``meta["operations"]``.
    """
    _require_images(sample, "detail_description")
    if captioner is None:
        raise PerturbationError("detail_description needs captioner=Callable[[PIL.Image], str] "
                                "(e.g. model_captioner(model))")
    caps = [str(captioner(as_pil(im).copy())).strip() for im in sample.images]
    if not any(caps):
        raise PerturbationError(f"detail_description: the captioner returned an empty caption for {sample.sample_id!r}")
    caption = "\n\n".join(c for c in caps if c)
    out = sample.copy()
    out.query = template.format(query=sample.query, caption=caption)
    ops = [{"op": "append_caption", "caption": caption, "template": template,
            "captioner": getattr(captioner, "__name__", type(captioner).__name__)}]
    return _finish(sample, out, "detail_description", ops, None)


def model_relevance_checker(model: MLLM, prompt: str = RELEVANCE_PROMPT,
                            max_new_tokens: int = 8) -> Callable[[str, Image.Image], bool]:
    """``checker(query, image) -> True`` if ``model`` says the image is needed (Table 11 prompt).

    Public API, unused by the study's own runs (they call no model for this step): the one-line way to
    run the paper's image-relevance filter with a model (GPT-5.1 in Table 11) through ``build_judge_conditions``."""

    def check(query: str, img: Image.Image) -> bool:
        text = model.generate([Prompt(text=f"{prompt}\n\nQuery: {query}", images=[img])],
                              max_new_tokens=max_new_tokens)[0]
        m = re.search(r"\b(true|false)\b", text, flags=re.I)
        return bool(m and m.group(1).lower() == "true")

    check.__name__ = f"model_relevance_checker[{getattr(model, 'name', 'model')}]"
    return check


def unnecessary_image(sample: JudgeSample, pool: Sequence[JudgeSample] = (), seed: int = 0, *,
                      relevance_checker: Callable[[str, Image.Image], bool] | None = None,
                      max_tries: int = 10) -> JudgeSample:
    """Unnecessary-Image (Table 1 / Table 11): one random, unrelated image added to a text-only item.

    The image is drawn (seeded) from all images of the pool's samples with images, excluding
    the sample's own item. The paper keeps only pairs a model confirms as unrelated (answer
    False to :data:`RELEVANCE_PROMPT`); pass ``relevance_checker(query, image) -> bool`` to
    redraw (without replacement, at most ``max_tries``) while it answers True. Rejected draws are
    recorded too. :class:`PerturbationError` for an item that already has an image or when no
    image qualifies.
    """
    if sample.images:
        raise PerturbationError(f"unnecessary_image applies to text-only items; {sample.sample_id!r} has "
                                f"{len(sample.images)} image(s)")
    rng = _rng(seed, sample, "unnecessary_image")
    cands = [(p, k) for p in _sorted_pool(pool) if p.sample_id != sample.sample_id
             and _item_key(p) != _item_key(sample) for k in range(len(p.images))]
    if not cands:
        raise PerturbationError(f"unnecessary_image: the pool has no image for {sample.sample_id!r}")
    order = rng.permutation(len(cands))
    rejected: list[dict] = []
    for idx in order[: max(1, int(max_tries)) if relevance_checker else 1]:
        donor, k = cands[int(idx)]
        img = as_pil(donor.images[k]).copy()
        if relevance_checker is not None and relevance_checker(sample.query, img.copy()):
            rejected.append({"from_sample": donor.sample_id, "image_index": k})
            continue
        out = sample.copy()
        out.images = [img]
        op = {"op": "add_image", "from_sample": donor.sample_id, "from_item": _item_key(donor),
              "image_index": k, "n_candidates": len(cands)}
        if relevance_checker is not None:
            op["relevance_checker"] = getattr(relevance_checker, "__name__", type(relevance_checker).__name__)
            op["rejected_as_related"] = rejected
        return _finish(sample, out, "unnecessary_image", [op], seed)
    raise PerturbationError(f"unnecessary_image: all {len(rejected)} drawn images were judged related to the "
                            f"query of {sample.sample_id!r}")


# --------------------------------------------------------------------------------------------
# Robustness: visual transformation (Table 11)
# --------------------------------------------------------------------------------------------
# Each op: (image, rng) -> (image, params). Parameters are drawn from rng, rounded, and the
# rounded values are the ones applied, so the recorded params replay the op exactly.
# The paper names the ops but only gives the ±7° rotation and JPEG quality 65-88; other ranges
# are ours, chosen to be mild (semantics-preserving) and documented in each op.

_WHITE = (255, 255, 255)


def _u(rng: np.random.Generator, lo: float, hi: float, nd: int = 3) -> float:
    return round(float(rng.uniform(lo, hi)), nd)


def _rotate180(im, rng):
    return im.transpose(Image.Transpose.ROTATE_180), {}


def _mirror(im, rng):
    return ImageOps.mirror(im), {}


def _flip(im, rng):
    return ImageOps.flip(im), {}


def _random_rotation(im, rng):
    """Rotation by U(-7°, 7°) about the centre, canvas size kept, corners filled white."""
    angle = _u(rng, -7.0, 7.0, 2)
    return im.rotate(angle, resample=Image.Resampling.BICUBIC, expand=False, fillcolor=_WHITE), {"angle": angle}


def _autocontrast(im, rng):
    """ImageOps.autocontrast with cutoff U(0, 2) % per tail, one curve from the luminance
    histogram applied to all channels (``preserve_tone=True``), so hues are not stretched apart
    per channel (per-channel stretching turns e.g. orange-on-white into black)."""
    cutoff = _u(rng, 0.0, 2.0, 2)
    return ImageOps.autocontrast(im, cutoff=cutoff, preserve_tone=True), {"cutoff": cutoff, "preserve_tone": True}


def _equalize(im, rng):
    """Histogram equalization of the luminance (ImageOps.equalize on the L channel), mixed with
    the original luminance at strength U(0.3, 0.6), applied by scaling R, G, B by the luminance
    ratio so hue and saturation are kept.

    Plain per-channel ImageOps.equalize maps every minority value to ~0 and recolours the objects
    of flat, mostly-background images (documents, charts, our synthetic scenes). In a check on
    the six synthetic colours (7-9 aesthetic ops per draw, 3,600 objects) the colour name changed
    for 16 % of objects with plain equalize and for 4 % with this version - the same rate as with
    no equalization at all.
    """
    strength = _u(rng, 0.3, 0.6, 2)
    lum = im.convert("L")
    y = np.asarray(lum, dtype=np.float64)
    ye = np.asarray(ImageOps.equalize(lum), dtype=np.float64)
    ratio = ((1.0 - strength) * y + strength * ye + 1.0) / (y + 1.0)
    out = np.clip(np.rint(np.asarray(im, dtype=np.float64) * ratio[..., None]), 0, 255).astype(np.uint8)
    return Image.fromarray(out), {"strength": strength, "channel": "luminance"}


def _brightness(im, rng):
    """ImageEnhance.Brightness, factor U(0.8, 1.2)."""
    f = _u(rng, 0.8, 1.2)
    return ImageEnhance.Brightness(im).enhance(f), {"factor": f}


def _contrast(im, rng):
    """ImageEnhance.Contrast, factor U(0.8, 1.2)."""
    f = _u(rng, 0.8, 1.2)
    return ImageEnhance.Contrast(im).enhance(f), {"factor": f}


def _color(im, rng):
    """ImageEnhance.Color (saturation), factor U(0.8, 1.2)."""
    f = _u(rng, 0.8, 1.2)
    return ImageEnhance.Color(im).enhance(f), {"factor": f}


def _gamma(im, rng):
    """Gamma curve out = 255 (in/255)^gamma, gamma U(0.8, 1.25)."""
    g = _u(rng, 0.8, 1.25)
    lut = [int(round(255.0 * (i / 255.0) ** g)) for i in range(256)]
    return im.point(lut * len(im.getbands())), {"gamma": g}


def _temp_shift(im, rng):
    """Colour-temperature shift: R scaled by (1+t), B by (1-t), t U(-0.08, 0.08) (t>0 warmer)."""
    t = _u(rng, -0.08, 0.08)
    r = [min(255, int(round(i * (1 + t)))) for i in range(256)]
    g = list(range(256))
    b = [min(255, int(round(i * (1 - t)))) for i in range(256)]
    return im.point(r + g + b), {"t": t}


def _unsharp_mask(im, rng):
    """ImageFilter.UnsharpMask, radius U(1, 2.5), percent 50-150, threshold 0-3."""
    radius = _u(rng, 1.0, 2.5, 2)
    percent = int(rng.integers(50, 151))
    threshold = int(rng.integers(0, 4))
    out = im.filter(ImageFilter.UnsharpMask(radius=radius, percent=percent, threshold=threshold))
    return out, {"radius": radius, "percent": percent, "threshold": threshold}


def _film_grain(im, rng):
    """Monochrome Gaussian grain, sigma U(3, 8) grey levels, one value per pixel for all channels."""
    sigma = _u(rng, 3.0, 8.0, 2)
    arr = np.asarray(im, dtype=np.float32)
    noise = rng.normal(0.0, sigma, size=arr.shape[:2] + (1,)).astype(np.float32)
    out = np.clip(np.rint(arr + noise), 0, 255).astype(np.uint8)
    return Image.fromarray(out), {"sigma": sigma}


def _jpeg_roundtrip(im, rng):
    """Encode as JPEG with quality 65-88 (Table 11) and decode again."""
    q = int(rng.integers(65, 89))
    buf = io.BytesIO()
    im.save(buf, format="JPEG", quality=q)
    buf.seek(0)
    with Image.open(buf) as j:
        out = j.convert("RGB")
    return out, {"quality": q}


def _safe_affine(im, rng):
    """Small translation (±3 % of each side) and horizontal shear (±0.08) about the centre, white fill."""
    w, h = im.size
    tx = int(round(float(rng.uniform(-0.03, 0.03)) * w))
    ty = int(round(float(rng.uniform(-0.03, 0.03)) * h))
    shear = _u(rng, -0.08, 0.08)
    cy = h / 2.0
    # inverse map: output (x, y) samples input (x + shear*(y-cy) - tx, y - ty)
    data = (1.0, shear, -shear * cy - tx, 0.0, 1.0, -float(ty))
    out = im.transform(im.size, Image.Transform.AFFINE, data, resample=Image.Resampling.BICUBIC, fillcolor=_WHITE)
    return out, {"translate": [tx, ty], "shear": shear}


def _white_padding(im, rng):
    """White border of 2-8 % of the shorter side on every edge (the canvas grows)."""
    pad = max(1, int(round(float(rng.uniform(0.02, 0.08)) * min(im.size))))
    return ImageOps.expand(im, border=pad, fill=_WHITE), {"pad": pad}


#: Table 11 geometric family: exactly one is applied.
GEOMETRIC_OPS: dict[str, Callable] = {
    "rotate180": _rotate180,
    "mirror": _mirror,
    "flip": _flip,
    "random_rotation": _random_rotation,
}
#: Table 11 photometric, quality and spatial families ("aesthetic"): 7-9 distinct ones are applied.
AESTHETIC_OPS: dict[str, tuple[str, Callable]] = {
    "autocontrast": ("photometric", _autocontrast),
    "equalize": ("photometric", _equalize),
    "brightness": ("photometric", _brightness),
    "contrast": ("photometric", _contrast),
    "color": ("photometric", _color),
    "gamma": ("photometric", _gamma),
    "temp_shift": ("photometric", _temp_shift),
    "unsharp_mask": ("quality", _unsharp_mask),
    "film_grain": ("quality", _film_grain),
    "jpeg_roundtrip": ("quality", _jpeg_roundtrip),
    "safe_affine": ("spatial", _safe_affine),
    "white_padding": ("spatial", _white_padding),
}


def visual_transformation(sample: JudgeSample, pool: Sequence[JudgeSample] = (), seed: int = 0, *,
                          n_aesthetic: tuple[int, int] = (7, 9)) -> JudgeSample:
    """Visual-Transformation (Table 11, "Random Composite Selection").

    Per image: one geometric op drawn uniformly from :data:`GEOMETRIC_OPS` (180° rotation,
    mirroring, flipping, random ±7° rotation), then ``k`` ~ U{7..9} *distinct* aesthetic ops from
    :data:`AESTHETIC_OPS` (photometric: autocontrast, equalization, brightness, contrast, colour,
    gamma, temperature shift; quality: unsharp mask, film grain, JPEG round trip q 65-88;
    spatial: safe affine translate/shear, white padding), applied sequentially in the drawn
    order. The paper says "1 geometric and 7-9 aesthetic operations ... applied sequentially" but
    not the order; we apply the geometric one first. Images are processed in RGB (a non-RGB
    input is converted first, recorded as a ``convert`` op). Each op is recorded as
    ``{"op", "family", "image", **params}``.
    """
    _require_images(sample, "visual_transformation")
    lo, hi = n_aesthetic
    if not 1 <= lo <= hi <= len(AESTHETIC_OPS):
        raise ValueError(f"n_aesthetic must satisfy 1 <= lo <= hi <= {len(AESTHETIC_OPS)}, got {n_aesthetic}")
    rng = _rng(seed, sample, "visual_transformation")
    geo_names = list(GEOMETRIC_OPS)
    aes_names = list(AESTHETIC_OPS)
    out = sample.copy()
    ops: list[dict] = []
    for i, src in enumerate(sample.images):
        im = as_pil(src)
        if im.mode != "RGB":
            ops.append({"op": "convert", "family": "preprocess", "image": i, "from": im.mode, "to": "RGB"})
            im = im.convert("RGB")
        else:
            im = im.copy()
        g = geo_names[int(rng.integers(len(geo_names)))]
        im, params = GEOMETRIC_OPS[g](im, rng)
        ops.append({"op": g, "family": "geometric", "image": i, **params})
        k = int(rng.integers(lo, hi + 1))
        for j in rng.choice(len(aes_names), size=k, replace=False):
            name = aes_names[int(j)]
            family, fn = AESTHETIC_OPS[name]
            im, params = fn(im, rng)
            ops.append({"op": name, "family": family, "image": i, **params})
        out.images[i] = im
    return _finish(sample, out, "visual_transformation", ops, seed)


# --------------------------------------------------------------------------------------------
# Robustness: texture insertion (Table 11)
# --------------------------------------------------------------------------------------------

_STOPWORDS = set("""a an the and or but if then else of to in on at by for with from into onto over under about
as is are was were be been being do does did done has have had this that these those there here what which who
whom whose when where why how many much some any each every all both either neither not no nor so than too very
can could should would will shall may might must it its it's their them they he she his her we our you your i me my
image picture photo shown show shows given based according please describe explain answer question following
one two three between among also only just more most less least into out up down""".split())


def heuristic_keyword(query: str) -> str:
    """A model-free stand-in for the paper's GPT-5.1 keyword extraction (Table 11).

    Returns the longest non-stopword token of the query (ties: first occurrence), falling back to
    the first token. Used by :func:`texture_insertion` only when no ``keyword_extractor`` is given.
    """
    toks = re.findall(r"[A-Za-z0-9][A-Za-z0-9'\-]*", query)
    if not toks:
        return query.strip()
    content = [t for t in toks if t.lower() not in _STOPWORDS]
    pool = content or toks
    return max(pool, key=len)  # max keeps the first of equal-length tokens


def model_keyword_extractor(model: MLLM, prompt: str = KEYWORD_PROMPT,
                            max_new_tokens: int = 16) -> Callable[[str, Image.Image], str]:
    """``extract(query, image) -> keyword`` asking ``model`` with the Table 11 prompt (first line, unquoted).

    Public API, unused by the study's own runs (they call no model for this step): the one-line way to
    run the paper's keyword extraction with a model (GPT-5.1 in Table 11) through ``build_judge_conditions``."""

    def extract(query: str, img: Image.Image) -> str:
        text = model.generate([Prompt(text=f"{prompt}\n\nInstruction: {query}", images=[img])],
                              max_new_tokens=max_new_tokens)[0]
        line = next((ln for ln in text.strip().splitlines() if ln.strip()), "")
        line = re.sub(r"^(keyword\s*:\s*)", "", line.strip(), flags=re.I)
        return line.strip().strip("\"'`*").strip()

    extract.__name__ = f"model_keyword_extractor[{getattr(model, 'name', 'model')}]"
    return extract


def _font(size: int):
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: fixed-size bitmap font only
        return ImageFont.load_default()


def _wrap(draw: ImageDraw.ImageDraw, text: str, font, max_w: float) -> list[str]:
    lines: list[str] = []
    for para in text.splitlines() or [""]:
        words = para.split()
        cur = ""
        for w in words:
            trial = f"{cur} {w}".strip()
            if draw.textlength(trial, font=font) <= max_w or not cur:
                cur = trial
            else:
                lines.append(cur)
                cur = w
            while draw.textlength(cur, font=font) > max_w and len(cur) > 1:  # break an over-long word
                cut = len(cur)
                while cut > 1 and draw.textlength(cur[:cut], font=font) > max_w:
                    cut -= 1
                lines.append(cur[:cut])
                cur = cur[cut:]
        lines.append(cur)
    return [ln for ln in lines if ln] or [""]


def render_text_strip(text: str, width: int, font_size: int | None = None, box_alpha: int = 170,
                      background: tuple[int, int, int] = _WHITE) -> tuple[Image.Image, dict]:
    """The bottom strip for texture insertion: ``text`` in white on a semi-transparent black
    rounded rectangle, over ``background``. Returns the RGB strip and its layout parameters."""
    size = int(font_size or max(12, round(width / 22)))
    font = _font(size)
    margin = max(4, width // 64)
    pad = max(4, size // 2)
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    lines = _wrap(probe, text, font, max(8, width - 2 * margin - 2 * pad))
    asc_desc = probe.textbbox((0, 0), "Ag", font=font)
    line_h = (asc_desc[3] - asc_desc[1]) + max(2, size // 4)
    height = 2 * margin + 2 * pad + line_h * len(lines)
    strip = Image.new("RGBA", (width, height), background + (255,))
    overlay = Image.new("RGBA", (width, height), (0, 0, 0, 0))
    d = ImageDraw.Draw(overlay)
    d.rounded_rectangle([margin, margin, width - margin - 1, height - margin - 1],
                        radius=max(2, pad), fill=(0, 0, 0, int(box_alpha)))
    y = margin + pad - asc_desc[1]
    for ln in lines:
        d.text((margin + pad, y), ln, font=font, fill=(255, 255, 255, 255))
        y += line_h
    strip = Image.alpha_composite(strip, overlay).convert("RGB")
    return strip, {"font_size": size, "n_lines": len(lines), "strip_height": height, "box_alpha": int(box_alpha),
                   "margin": margin, "padding": pad, "background": list(background)}


def texture_insertion(sample: JudgeSample, pool: Sequence[JudgeSample] = (), seed: int = 0, *,
                      text_source: str = "random",
                      keyword_extractor: Callable[[str, Image.Image], str] | None = None,
                      font_size: int | None = None, box_alpha: int = 170,
                      background: tuple[int, int, int] = _WHITE) -> JudgeSample:
    """Texture-Insertion (Table 11): the keyword or the query rendered into the image.

    Content (Table 11, "Keyword Extraction" / "Direct Query Mapping"): ``text_source="random"``
    draws one of the two with the seeded generator, as the paper does; ``"keyword"`` or
    ``"query"`` force one. The keyword comes from ``keyword_extractor(query, image)`` (the paper
    uses GPT-5.1 with :data:`KEYWORD_PROMPT`; see :func:`model_keyword_extractor`), else from
    :func:`heuristic_keyword` (recorded as ``"heuristic"``).

    Rendering ("Bottom Canvas Expansion", "Semi-transparent Box, Rounded Rectangle"): the canvas
    is extended downward by a strip just tall enough for the wrapped text; the strip is
    ``background`` (white) with a black rounded rectangle at ``box_alpha``/255 opacity and white
    text in PIL's default font (scalable FreeType version where available). The original pixels
    are kept untouched in the top ``height`` rows (non-RGB images are converted to RGB first).
    Every image of the sample gets the same text.
    """
    _require_images(sample, "texture_insertion")
    if text_source not in ("random", "keyword", "query"):
        raise ValueError(f"text_source must be 'random', 'keyword' or 'query', got {text_source!r}")
    if not sample.query.strip():
        raise PerturbationError(f"texture_insertion: sample {sample.sample_id!r} has an empty query")
    rng = _rng(seed, sample, "texture_insertion")
    source = text_source if text_source != "random" else ("keyword", "query")[int(rng.integers(2))]
    first = as_pil(sample.images[0])
    if source == "keyword":
        if keyword_extractor is not None:
            text = str(keyword_extractor(sample.query, first.copy())).strip()
            how = getattr(keyword_extractor, "__name__", type(keyword_extractor).__name__)
        else:
            text, how = heuristic_keyword(sample.query), "heuristic"
        if not text:
            raise PerturbationError(f"texture_insertion: empty keyword for {sample.sample_id!r}")
    else:
        text, how = sample.query.strip(), "query"
    out = sample.copy()
    ops: list[dict] = []
    for i, src in enumerate(sample.images):
        im = as_pil(src)
        if im.mode != "RGB":
            ops.append({"op": "convert", "image": i, "from": im.mode, "to": "RGB"})
            im = im.convert("RGB")
        w, h = im.size
        strip, layout = render_text_strip(text, w, font_size=font_size, box_alpha=box_alpha, background=background)
        canvas = Image.new("RGB", (w, h + strip.height), background)
        canvas.paste(im, (0, 0))
        canvas.paste(strip, (0, h))
        out.images[i] = canvas
        ops.append({"op": "bottom_canvas_text", "image": i, "content": source, "text": text, "text_from": how,
                    "original_size": [w, h], "new_size": [w, h + strip.height], **layout})
    return _finish(sample, out, "texture_insertion", ops, seed)


# --------------------------------------------------------------------------------------------
# Registry, dispatch, audit files
# --------------------------------------------------------------------------------------------

#: The nine perturbations of Table 1, in the paper's order.
PERTURBATIONS: dict[str, Callable[..., JudgeSample]] = {
    "text_dominance": text_dominance,
    "image_dominance": image_dominance,
    "response_dominance": response_dominance,
    "instruction_misalignment": instruction_misalignment,
    "image_misalignment": image_misalignment,
    "detail_description": detail_description,
    "unnecessary_image": unnecessary_image,
    "visual_transformation": visual_transformation,
    "texture_insertion": texture_insertion,
}


def _normalise(name: str) -> str:
    return re.sub(r"[\s\-]+", "_", str(name).strip().lower())


def apply_perturbation(name: str, sample: JudgeSample, pool: Sequence[JudgeSample] = (), seed: int = 0,
                       **options: Any) -> JudgeSample:
    """Apply perturbation ``name`` (a :data:`PERTURBATIONS` key; ``"Text-Dominance"`` style names
    are accepted too) to ``sample``. ``pool`` supplies donors for the misalignment and
    unnecessary-image perturbations; ``options`` go to the function (e.g. ``captioner=`` for
    ``detail_description``). ``"original"`` (also ``"none"``/``"unbiased"``) returns an unperturbed
    copy with ``meta["perturbation"] = "original"``, for pipelines that loop over the unbiased
    condition as well.
    """
    key = _normalise(name)
    if key in ("none", "unbiased", "original"):
        out = sample.copy()
        out.meta["perturbation"] = UNPERTURBED
        return out
    if key not in PERTURBATIONS:
        raise KeyError(f"unknown perturbation {name!r}; known: {list(PERTURBATIONS)}")
    return PERTURBATIONS[key](sample, pool, seed, **options)


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, (np.ndarray,)):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    return repr(o)


def _safe_stem(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(s)).strip("._") or "sample"


def save_perturbed(sample: JudgeSample, out_dir: str | Path) -> Path:
    """Write ``sample`` for auditing and return the path of its JSON sidecar.

    Files: ``<sample_id>__<perturbation>.png`` (``..._<i>.png`` per image when there are several)
    and ``<sample_id>__<perturbation>.json`` holding ``sample_id``, ``query``, ``response``,
    ``gold_score``, ``images`` (PNG file names relative to the sidecar), ``image_sha256`` and
    ``meta``. The sidecar is a record :func:`mmfragile.studies.judgebias.data.load_judge_dir` (and
    :func:`load_perturbed`) read back.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{_safe_stem(sample.sample_id)}__{_safe_stem(sample.perturbation)}"
    names = []
    for i, im in enumerate(sample.images):
        name = f"{stem}.png" if len(sample.images) == 1 else f"{stem}_{i}.png"
        as_pil(im).save(out_dir / name, format="PNG")
        names.append(name)
    meta = dict(sample.meta)
    meta.pop("image_paths", None)  # paths of the source images are not those of the saved PNGs
    record = {
        "sample_id": sample.sample_id,
        "query": sample.query,
        "response": sample.response,
        "gold_score": sample.gold_score,
        "images": names,
        "image_sha256": [image_sha256(as_pil(im)) for im in sample.images],
        "meta": meta,
    }
    path = out_dir / f"{stem}.json"
    path.write_text(json.dumps(record, indent=2, ensure_ascii=False, default=_json_default), encoding="utf-8")
    return path


def load_perturbed(path: str | Path) -> JudgeSample:
    """Read a sidecar written by :func:`save_perturbed` (images loaded, pixel hashes checked)."""
    (s,) = load_judge_dir(path)
    return s
