"""Study 2 prompt catalog and rendering: the 61 Promptception prompt types + the baseline.

Reproduces the prompts of "Promptception: How Sensitive Are Large Multimodal Models to
Prompts?" (seed ``promptception``): Appendix A Table 5 (the complete list of 61 prompt types in
15 categories and 6 supercategories), Table 1 (what each category modifies), Sec. 3 (placement),
Sec. 4.2.1 (prompt intent) and Fig. 3 (baseline prompt). The catalog is data -
``resources/promptception_catalog.json``, generated from the seed by
``scripts/extract_promptception_catalog.py`` (its docstring lists every reading of the seed).

Catalog columns (:func:`load_catalog`):

* ``prompt_id`` - "1.1" ... "15.3" exactly as the paper writes them, plus ``"baseline"``;
* ``name``, ``category`` (1-15, 0 = baseline), ``category_name``, ``category_description``
  (Table 1 "Modification"), ``supercategory`` (1-6, 0 = baseline), ``supercategory_name``;
* ``intent`` - "positive" / "neutral" / "negative" from the lists of Sec. 4.2.1 (26 / 17 / 18
  prompts); ``None`` for the baseline;
* ``placement`` - "after" (prompt appended after question and options, the baseline structure),
  "structured" (category 2: the prompt wraps question and options), "before" (3.1: prompt, then
  question and options), "middle" (3.2: question, prompt, options) - Sec. 3: "In all cases, the
  prompts are appended after the question and answer choices, following the structure of the
  baseline prompt (Figure 3), except for Categories 2 and 3";
* ``modalities`` - benchmarks the prompt applies to; 11.4 and 11.5 are video-only (Sec. 4.2.2;
  they are absent from the MMStar / MMMU-Pro tables);
* ``template_open`` / ``template_proprietary`` - the prompt with markers (see below) for
  open-source and proprietary models (Appendix A: green / purple text; the proprietary variant
  typically asks for "Answer: $LETTER" so the model can reason, cf. Table 4 row 1);
* ``option_format`` - "dot" ``A. x``, "paren" ``(A) x`` (1.2), "option" ``Option A: x`` (1.3),
  "inline" (2.6, all options on one line), "json" (2.9, JSON string items);
* ``extra_options`` - options a prompt adds (7.6: "Not sure", "Evidence not sufficient to
  answer", "I'll answer later"), lettered after the question's last option;
* ``has_model_variant``, ``has_modality_variant``.

Template markers: ``<QUESTION>``, ``<QUESTION_UPPER>`` (4.3 upper-cases the question),
``<QUESTION_JSON>`` (2.9), ``<OPTIONS>``, ``<OPTIONS_INLINE>``, ``<OPTIONS_JSON>``,
``<EXTRA_OPTIONS>``, ``<VISUAL>`` ("image(s)" / "video"), ``<VISUALS>`` ("images" /
"the video"). Markers are replaced in one pass, so question or option text that happens to
contain a marker is never substituted again.

Rendering decisions (the paper's text shows one rendered example per prompt):

* Option letters are A, B, C, ... for any number of options; 7.6's three added options take
  the next three letters (E-G for 4 options, as printed; K-M for MMMU-Pro's 10 options, which is
  also what the authors' released s10 prompt file does). More than 26 letters in total ->
  :class:`DataError`.
* Literal letters inside prompt text are kept as printed whatever the number of options:
  4.5's "(A/A/A/A)", 7.1's "option A", 7.3's "option C" (the same prompt text was used for every
  question of a benchmark). 7.3 with two options therefore names a non-existent option - the
  prompt is a misleading-statistics prompt, so this is rendered, not refused.
* ``modality``: "image" and "multi-image" use the image wording, "video" the video wording; a
  question table's "text" modality uses the image wording (the paper has no text-only setting).
  11.4 / 11.5 on a non-video question -> :class:`DataError`.
* ``omit_dollar=True`` drops the ``$`` of ``$LETTER`` (Appendix J: "the $ symbol was omitted
  from all prompts for GPT-4o"); other dollar signs ("a generous tip of $100", 14.1) stay.
* No ``<image>`` token is inserted: images travel in :class:`mmfragile.models.base.Prompt`.
"""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterator, Sequence

import pandas as pd

from mmfragile.models.base import Prompt
from mmfragile.errors import DataError
from mmfragile.schema import MCQuestion

CATALOG_PATH = Path(__file__).resolve().parents[2] / "resources" / "promptception_catalog.json"

BASELINE_ID = "baseline"
MODALITIES = ("image", "multi-image", "video")
MODEL_KINDS = ("open", "proprietary")
LETTERS = tuple(chr(ord("A") + i) for i in range(26))

INTENTS = ("positive", "neutral", "negative")
PLACEMENTS = ("after", "structured", "before", "middle")

_VISUAL_WORDS = {
    "image": {"VISUAL": "image(s)", "VISUALS": "images"},
    "multi-image": {"VISUAL": "image(s)", "VISUALS": "images"},
    "video": {"VISUAL": "video", "VISUALS": "the video"},
}
_MARKER_RE = re.compile(
    r"<(QUESTION|QUESTION_UPPER|QUESTION_JSON|OPTIONS|OPTIONS_INLINE|OPTIONS_JSON|EXTRA_OPTIONS|VISUAL|VISUALS)>"
)


# --------------------------------------------------------------------------------------
# Catalog
# --------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4)
def _read_catalog(path: str) -> dict:
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise DataError(f"{p}: Promptception catalog not found; run scripts/extract_promptception_catalog.py") from e
    except json.JSONDecodeError as e:
        raise DataError(f"{p}: not valid JSON ({e})") from e
    prompts = data.get("prompts")
    if not isinstance(prompts, list) or not prompts:
        raise DataError(f"{p}: no 'prompts' list")
    seen = set()
    for i, row in enumerate(prompts):
        pid = row.get("prompt_id")
        if pid in seen:
            raise DataError(f"{p}, row {i}: duplicate prompt_id {pid!r}")
        seen.add(pid)
        if row.get("placement") not in PLACEMENTS:
            raise DataError(f"{p}, row {i} ({pid}): unknown placement {row.get('placement')!r}")
        if pid != BASELINE_ID and row.get("intent") not in INTENTS:
            raise DataError(f"{p}, row {i} ({pid}): unknown intent {row.get('intent')!r}")
    return data


def load_catalog(path: str | Path | None = None, include_baseline: bool = True) -> pd.DataFrame:
    """The prompt catalog as a DataFrame, one row per prompt type, in paper order.

    The first row is the baseline (``prompt_id == "baseline"``) unless ``include_baseline`` is
    False. ``modalities`` and ``extra_options`` hold lists. A fresh copy is returned each call.
    """
    data = _read_catalog(str(path or CATALOG_PATH))
    df = pd.DataFrame([dict(r) for r in data["prompts"]])
    df["modalities"] = df["modalities"].map(list)
    df["extra_options"] = df["extra_options"].map(list)
    df["intent"] = df["intent"].astype(object).where(df["intent"].notna(), None)
    if not include_baseline:
        df = df[df["prompt_id"] != BASELINE_ID].reset_index(drop=True)
    return df


@dataclass(frozen=True)
class PromptType:
    """One row of the catalog (see the module docstring for the fields)."""

    prompt_id: str
    name: str
    category: int
    category_name: str
    category_description: str
    supercategory: int
    supercategory_name: str
    intent: str | None
    placement: str
    modalities: tuple[str, ...]
    template_open: str
    template_proprietary: str
    option_format: str
    extra_options: tuple[str, ...] = ()
    has_model_variant: bool = False
    has_modality_variant: bool = False

    @property
    def is_baseline(self) -> bool:
        return self.prompt_id == BASELINE_ID

    def template(self, model_kind: str = "open") -> str:
        if model_kind not in MODEL_KINDS:
            raise ValueError(f"model_kind must be one of {MODEL_KINDS}, got {model_kind!r}")
        return self.template_open if model_kind == "open" else self.template_proprietary

    def supports(self, modality: str) -> bool:
        return _resolve_modality(modality) in self.modalities

    def instruction(self, modality: str = "image", model_kind: str = "open") -> str:
        """The prompt text P alone (template without question and option lines)."""
        words = _VISUAL_WORDS[_resolve_modality(modality)]
        keep = [l for l in self.template(model_kind).split("\n")
                if not re.fullmatch(r"<(QUESTION|QUESTION_UPPER|OPTIONS|OPTIONS_JSON)>", l)]
        return _MARKER_RE.sub(lambda m: words.get(m.group(1), m.group(0)), "\n".join(keep))

    def render(self, question: MCQuestion, modality: str | None = None, model_kind: str = "open",
               omit_dollar: bool = False) -> "RenderedPrompt":
        return _render(self, question, modality, model_kind, omit_dollar)


#: answers a prompt's own wording asks for, in the order they are tested (:func:`answer_form`)
_FORMS = (
    (re.compile(r"Answer: \$LETTER"), "Answer: {letter}"),
    (re.compile(r"Best Choice: \$LETTER"), "Best Choice: {letter}"),
    (re.compile(r"(?:as follows|format): \$LETTER\."), "{letter}."),
    (re.compile(r"(?:\*\*Answer:\*\*|##Answer##:|BEST OPTION:)$"), "{letter}. {text}"),
)
_OPTION_FORMS = {"paren": "({letter})", "option": "Option {letter}"}


def answer_form(prompt: PromptType, model_kind: str = "open") -> str:
    """The answer ``prompt`` asks for, as a template with ``{letter}`` and ``{text}`` (the option's text): "Answer:
    {letter}" where it says ``Answer: $LETTER``, "Best Choice: {letter}", "{letter}." for ``... format: $LETTER.``,
    the letter and the option text after an answer slot the prompt ends with (``**Answer:**``, ``BEST OPTION:``),
    the option label's own form for "(A) x" / "Option A: x" options, else the bare letter. Every form is one the
    study's answer extraction reads (:func:`mmfragile.studies.promptception.answers.extract_letter_regex`)."""
    text = prompt.template(model_kind)
    for rx, form in _FORMS:
        if rx.search(text.strip()):
            return form
    return _OPTION_FORMS.get(prompt.option_format, "{letter}")


@functools.lru_cache(maxsize=4)
def _prompt_types(path: str) -> dict[str, PromptType]:
    names = {f.name for f in fields(PromptType)}
    out = {}
    for row in _read_catalog(path)["prompts"]:
        kw = {k: v for k, v in row.items() if k in names}
        kw["modalities"] = tuple(kw["modalities"])
        kw["extra_options"] = tuple(kw.get("extra_options") or ())
        out[row["prompt_id"]] = PromptType(**kw)
    return out


def prompt_types(include_baseline: bool = True, modality: str | None = None) -> list[PromptType]:
    """All prompt types in paper order, optionally only those usable for ``modality``."""
    types = list(_prompt_types(str(CATALOG_PATH)).values())
    if not include_baseline:
        types = [t for t in types if not t.is_baseline]
    if modality is not None:
        types = [t for t in types if t.supports(modality)]
    return types


def prompt_ids(include_baseline: bool = True, modality: str | None = None) -> list[str]:
    """Prompt ids in paper order ("baseline", "1.1", ..., "15.3")."""
    return [t.prompt_id for t in prompt_types(include_baseline, modality)]


def get_prompt_type(prompt_id: str) -> PromptType:
    types = _prompt_types(str(CATALOG_PATH))
    key = str(prompt_id)
    if key not in types:
        raise KeyError(f"unknown Promptception prompt id {prompt_id!r}; known: {list(types)}")
    return types[key]


# --------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RenderedPrompt:
    """A prompt rendered for one question.

    ``valid_letters`` are all letters shown to the model (the question's options followed by
    any options the prompt adds); ``options`` holds the option texts in the same order.
    ``extra_letters`` are the added ones (7.6) - valid answers that are never correct.
    Unpacks as ``text, valid_letters = render(...)``.
    """

    text: str
    valid_letters: tuple[str, ...]
    option_letters: tuple[str, ...]
    extra_letters: tuple[str, ...]
    options: tuple[str, ...]
    answer_letter: str
    prompt_id: str
    modality: str
    model_kind: str
    images: tuple[str, ...] = field(default_factory=tuple)

    def __iter__(self) -> Iterator[Any]:
        return iter((self.text, self.valid_letters))

    def to_prompt(self, images: Sequence[Any] | None = None, system: str | None = None) -> Prompt:
        """A :class:`Prompt` for :meth:`MLLM.generate` (images default to the question's; a video question's
        images are its frames, passed as a video to families that take video input)."""
        return Prompt(text=self.text, images=list(self.images if images is None else images), system=system,
                      video=self.modality == "video")


def _resolve_modality(modality: str) -> str:
    m = "image" if modality == "text" else modality
    if m not in MODALITIES:
        raise ValueError(f"modality must be one of {MODALITIES} (or 'text'), got {modality!r}")
    return m


def _option_block(fmt: str, letters: Sequence[str], opts: Sequence[str]) -> str:
    if fmt == "dot":
        return "\n".join(f"{L}. {o}" for L, o in zip(letters, opts))
    if fmt == "paren":
        return "\n".join(f"({L}) {o}" for L, o in zip(letters, opts))
    if fmt == "option":
        return "\n".join(f"Option {L}: {o}" for L, o in zip(letters, opts))
    if fmt == "inline":
        return " ".join(f"{L}. {o}" for L, o in zip(letters, opts))
    if fmt == "json":
        return ",\n".join(json.dumps(f"{L}. {o}", ensure_ascii=False) for L, o in zip(letters, opts))
    raise DataError(f"promptception catalog: unknown option_format {fmt!r}")


def _render(pt: PromptType, question: MCQuestion, modality: str | None, model_kind: str,
            omit_dollar: bool) -> RenderedPrompt:
    where = f"question {question.dataset}/{question.question_id}"
    mod = _resolve_modality(modality if modality is not None else (question.modality or "image"))
    if mod not in pt.modalities:
        raise DataError(f"{where}: prompt {pt.prompt_id} ({pt.name}) is only defined for "
                        f"{list(pt.modalities)}, not {mod!r}")
    template = pt.template(model_kind)
    opts = [str(o).strip() for o in question.options]
    n = len(opts)
    if n < 2:
        raise DataError(f"{where}: needs at least 2 options, got {n}")
    n_total = n + len(pt.extra_options)
    if n_total > len(LETTERS):
        raise DataError(f"{where}: prompt {pt.prompt_id} would need {n_total} option letters "
                        f"({n} options + {len(pt.extra_options)} added), more than A-Z")
    if not 0 <= int(question.answer) < n:
        raise DataError(f"{where}: answer index {question.answer} is not among the {n} options")
    letters = LETTERS[:n]
    extra_letters = LETTERS[n:n_total]
    qtext = str(question.question).strip()
    words = _VISUAL_WORDS[mod]
    extra_texts = tuple(_MARKER_RE.sub(lambda m: words.get(m.group(1), m.group(0)), e) for e in pt.extra_options)
    values = {
        "QUESTION": qtext,
        "QUESTION_UPPER": qtext.upper(),
        "QUESTION_JSON": json.dumps(qtext, ensure_ascii=False),
        "OPTIONS": _option_block(pt.option_format, letters, opts),
        "OPTIONS_INLINE": _option_block("inline", letters, opts),
        "OPTIONS_JSON": _option_block("json", letters, opts),
        "EXTRA_OPTIONS": _option_block("dot", extra_letters, extra_texts),
        **words,
    }
    if omit_dollar:
        template = re.sub(r"\$(?=LETTER)", "", template)
    text = _MARKER_RE.sub(lambda m: values[m.group(1)], template)
    return RenderedPrompt(
        text=text,
        valid_letters=letters + extra_letters,
        option_letters=letters,
        extra_letters=extra_letters,
        options=tuple(opts) + extra_texts,
        answer_letter=letters[int(question.answer)],
        prompt_id=pt.prompt_id,
        modality=mod,
        model_kind=model_kind,
        images=tuple(str(p) for p in (question.images or [])),
    )


def render(prompt_id: str, question: MCQuestion, modality: str | None = None, model_kind: str = "open",
           omit_dollar: bool = False) -> RenderedPrompt:
    """Render prompt ``prompt_id`` ("baseline", "1.1", ..., "15.3") for ``question``.

    ``modality`` defaults to ``question.modality``; ``model_kind`` picks the open-source or
    proprietary answer-format variant (Appendix A). Returns a :class:`RenderedPrompt` whose
    ``text`` is the user message and ``valid_letters`` the letters a response may name.
    Raises :class:`DataError` for impossible renderings (fewer than 2 or more than 26 option
    letters, a video-only prompt on an image question) and :class:`KeyError` for an unknown id.
    """
    return get_prompt_type(prompt_id).render(question, modality=modality, model_kind=model_kind,
                                             omit_dollar=omit_dollar)
