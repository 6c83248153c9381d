"""Judge prompts and output parsers for Study 3 (MM-JudgeBias, Lee et al., arXiv 2604.18164).

Prompts
-------
* :func:`score_prompt` - the *Score-wise Judgment Prompt* (App. E, Fig. 11): the judge writes
  "detailed feedback" first (chain of thought, interpretability) and then an integer score between
  1 and 10 for "how effectively a candidate response follows the provided instruction in the
  context of the input image".  ``variant`` selects the Sec. 4.4 / Tables 3-4 variants:

  - ``"original"``  - the main-experiment prompt;
  - ``"score_guide"`` - adds qualitative guidance for the score scale (+Guide, App. J);
  - ``"constraints"`` - Modality Constraints: explicitly verify all of Q, I and R (+Const., App. K);
  - ``"reasoning"`` - Modality Reasoning: rubric decomposition, modality-wise inspection, final
    synthesis (+Reason., App. K);

  and ``allow_na=True`` adds the explicit N/A (abstention) option of the abstention-aware evaluation
  (Table 3, App. I); it combines with any variant.
* :func:`pairwise_prompt` - the *Pairwise Judgment Prompt* (App. E, Fig. 12) used for position and
  verbosity bias (Sec. 4.3, App. H): two responses A and B, the judge must pick one, strict output
  format.

The seed text describes Figures 11/12 and the App. J/K prompts but does not reproduce their wording
(they are images in the paper), so the templates below are reconstructions that keep every element
the text names: detailed feedback before the score, an integer 1-10, the instruction-following-in-
context-of-the-image criterion, a strict final-answer line.  The same template is used whether or
not an image is attached (the Unnecessary-Image original is text-only): only the perturbed input may
differ between an unbiased and a biased judgment.  A perturbed empty query (Image-/Response-
Dominance) renders as an empty instruction block, exactly as the perturbation intends.  Images are
not rendered into the text; the caller passes them (``images=``) and the backend places them.

Parsers
-------
:func:`parse_score`, :func:`parse_score_or_na` and :func:`parse_pairwise` extract the final verdict
and raise :class:`ScoreParseError` (quoting the offending text) when there is none, it is out of
range, non-integer or ambiguous - never a silent default.  Unparseable judgments are counted
separately by the metrics (:mod:`mmfragile.studies.judgebias.metrics`).
"""
from __future__ import annotations

import re
from typing import Sequence

from mmfragile.models.base import Prompt

__all__ = [
    "ScoreParseError",
    "SCORE_VARIANTS",
    "score_prompt",
    "pairwise_prompt",
    "na_prompt",
    "parse_score",
    "parse_score_or_na",
    "parse_pairwise",
]

SCORE_VARIANTS = ("original", "score_guide", "constraints", "reasoning")


class ScoreParseError(ValueError):
    """The judge output holds no usable verdict. The message quotes the offending text."""

    def __init__(self, reason: str, text: str):
        self.reason = reason
        self.text = text
        shown = text if len(text) <= 300 else text[:120] + " [...] " + text[-160:]
        super().__init__(f"{reason}; judge output was: {shown!r}")


# --------------------------------------------------------------------------------------------
# Templates
# --------------------------------------------------------------------------------------------

_SCORE_INTRO = (
    "You are a helpful and precise assistant for checking the quality of a response. "
    "You will be given an instruction, an input image, and a response to evaluate.\n"
    "Your task is to evaluate how effectively the response follows the instruction in the context "
    "of the input image, and to assign an integer score between 1 and {scale}, where a higher "
    "score indicates better overall performance."
)

_SCORE_GUIDE = (
    "Score guide:\n"
    "- 1-2: The response is irrelevant to the instruction or the image, or is completely wrong.\n"
    "- 3-4: The response addresses the instruction but contains major errors or misreads the image.\n"
    "- 5-6: The response is partially correct; it has noticeable errors or omits important parts.\n"
    "- 7-8: The response is mostly correct and grounded in the image, with only minor issues.\n"
    "- 9-{scale}: The response is fully correct, complete, and accurately grounded in the image."
)

_CONSTRAINTS = (
    "Modality constraints: before scoring, verify all three components - the instruction, the image, "
    "and the response. The response can only be judged good if (1) the instruction is present and the "
    "response answers this instruction, (2) the image is present and the response is grounded in this "
    "image, and (3) the response is correct given both. If the instruction or the image is missing, "
    "empty, or unrelated to the response, the response must not receive a high score."
)

_REASONING = (
    "Follow this evaluation process:\n"
    "Step 1 - Rubric decomposition: list what a correct response to this instruction must contain.\n"
    "Step 2 - Modality-wise inspection:\n"
    "  (a) Instruction: check that the instruction is present and what it asks for.\n"
    "  (b) Image: check that the image is present, relevant to the instruction, and which visual "
    "evidence it provides.\n"
    "  (c) Response: check each claim of the response against the instruction and the visual evidence.\n"
    "Step 3 - Final synthesis: combine the checks above into the final judgment."
)

_NA_OPTION = (
    "If the provided inputs are insufficient or fundamentally inconsistent, so that the response "
    "cannot be judged (for example, a required input is missing or the inputs contradict each other), "
    "you may abstain by writing N/A instead of a score."
)

_SCORE_BODY = (
    "[Instruction]\n{query}\n[End of Instruction]\n\n"
    "[Response]\n{response}\n[End of Response]"
)

_SCORE_FORMAT = (
    "First, write detailed feedback that assesses the quality of the response. "
    "After writing the feedback, write the score{na_clause}. "
    "Use exactly the following output format:\n"
    "Feedback: <your detailed feedback>\n"
    "Score: <an integer between 1 and {scale}{na_alt}>"
)

_PAIR_INTRO = (
    "You are a helpful and precise assistant for checking the quality of responses. "
    "You will be given an instruction, an input image, and two responses (Response A and Response B).\n"
    "Your task is to decide which response follows the instruction better in the context of the "
    "input image."
)

_PAIR_BODY = (
    "[Instruction]\n{query}\n[End of Instruction]\n\n"
    "[Response A]\n{response_a}\n[End of Response A]\n\n"
    "[Response B]\n{response_b}\n[End of Response B]"
)

_PAIR_FORMAT = (
    "First, write a brief feedback comparing the two responses. Then output your final choice. "
    "You must choose exactly one response. Use exactly the following output format:\n"
    "Feedback: <your feedback>\n"
    "Final Answer: [[A]] or [[B]]"
)


def _images(images: Sequence | None) -> list:
    if images is None:
        return []
    if isinstance(images, (str, bytes)) or not isinstance(images, Sequence):
        return [images]
    return list(images)


def score_prompt(
    query: str,
    response: str,
    images: Sequence | None = None,
    *,
    variant: str = "original",
    allow_na: bool = False,
    scale: int = 10,
    system: str | None = None,
) -> Prompt:
    """Render the score-wise judgment prompt (Fig. 11) or one of its Table 3-4 variants.

    ``query``/``response`` are inserted verbatim (an empty ``query`` is a legitimate perturbed
    input); ``images`` are attached to the :class:`Prompt` unchanged, in order.
    """
    if variant not in SCORE_VARIANTS:
        raise ValueError(f"unknown score prompt variant {variant!r}; choose one of {SCORE_VARIANTS}")
    if not isinstance(scale, int) or scale < 2:
        raise ValueError(f"scale must be an integer >= 2, got {scale!r}")
    parts = [_SCORE_INTRO.format(scale=scale)]
    if variant == "score_guide":
        parts.append(_SCORE_GUIDE.format(scale=scale))
    elif variant == "constraints":
        parts.append(_CONSTRAINTS)
    elif variant == "reasoning":
        parts.append(_CONSTRAINTS)
        parts.append(_REASONING)
    if allow_na:
        parts.append(_NA_OPTION)
    parts.append(_SCORE_BODY.format(query=query or "", response=response or ""))
    parts.append(_SCORE_FORMAT.format(
        scale=scale,
        na_clause=" (or N/A if you abstain)" if allow_na else "",
        na_alt=", or N/A" if allow_na else "",
    ))
    return Prompt(text="\n\n".join(parts), images=_images(images), system=system)


def na_prompt(query: str, response: str, images: Sequence | None = None, **kw) -> Prompt:
    """The N/A-enabled (abstention-aware, Table 3) score prompt: ``score_prompt(..., allow_na=True)``."""
    return score_prompt(query, response, images, allow_na=True, **kw)


def pairwise_prompt(
    query: str,
    response_a: str,
    response_b: str,
    images: Sequence | None = None,
    *,
    system: str | None = None,
) -> Prompt:
    """Render the pairwise judgment prompt (Fig. 12): choose Response A or Response B."""
    text = "\n\n".join([
        _PAIR_INTRO,
        _PAIR_BODY.format(query=query or "", response_a=response_a or "", response_b=response_b or ""),
        _PAIR_FORMAT,
    ])
    return Prompt(text=text, images=_images(images), system=system)


# --------------------------------------------------------------------------------------------
# Parsers
# --------------------------------------------------------------------------------------------

_NUM = r"(?P<num>[-+]?\d+(?:\.\d+)?)"
_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
          "nine": 9, "ten": 10}
_WORD = r"(?P<word>" + "|".join(_WORDS) + r")"
_MD = r"[\s*_`#]*"  # markdown emphasis / spaces between a label and its value
_LABEL = (r"(?:final\s+|overall\s+|total\s+)?(?:score|rating|grade)\b"
          r"(?:\s*\(\s*1\s*(?:-|–|to)\s*\d+\s*\))?")
_SEP = _MD + r"(?:is|of|=|:|-|–)?" + _MD

#: Explicit verdict markers; the last match anywhere in the text wins.
_EXPLICIT = [
    re.compile(r"\[\[\s*" + _NUM + r"\s*(?:/\s*\d+)?\s*\]\]"),
    re.compile(r"\[RESULT\]" + _MD + r"\[?\s*" + _NUM, re.I),
    re.compile(r"\b" + _LABEL + _SEP + r"[\[(]?\s*" + _NUM + r"(?![\d.]*\s*%)", re.I),
    re.compile(r"\b" + _LABEL + _SEP + _WORD + r"\b", re.I),
    # first-person verdicts need an object ("I give it a 6", "I would rate this response 7"), so that
    # "the response gives 3 examples" is not read as a score
    re.compile(r"\b(?:rate|give|assign|award)\b(?:\s+(?:it|this|that|the|response|answer)){1,2}"
               r"(?:\s+(?:a|an|score|rating|of|as)){0,3}\s+" + _MD + _NUM + r"(?![\d.]*\s*%)", re.I),
    re.compile(r"\b(?:deserves|earns|merits)\s+(?:a|an)\s+" + _MD + _NUM + r"(?![\d.]*\s*%)", re.I),
    re.compile(r"(?<![\d.])" + _NUM + r"\s*(?:/|out\s+of)\s*(?P<den>\d+)\b", re.I),
]
_NA_MARK = re.compile(
    r"(?:\[\[\s*N/?A\s*\]\]|\[RESULT\]" + _MD + r"N/?A\b|\b" + _LABEL + _SEP
    + r"N/A\b|^\W*N/A\W*$)", re.I | re.M)
_TRAILING = re.compile(r"(?<![\w.\-/])" + _NUM + r"[\s*_`)\].!]*$")
_RANGE_AFTER = re.compile(r"\s*(?:-|–|to|or)\s*\d")
_SLASH_AFTER = re.compile(r"\s*(?:/|out\s+of)\s*(\d+)", re.I)
_THINK = re.compile(r"<think>.*?</think>", re.S | re.I)


def _strip_thinking(text: str) -> str:
    """Drop closed ``<think>...</think>`` blocks of reasoning models (their numbers are not verdicts)."""
    return _THINK.sub(" ", text)


def _last_explicit(text: str, scale: int) -> re.Match | None:
    """The explicit score marker that ends last (fractions count only on this ``scale``)."""
    best = None
    for rx in _EXPLICIT:
        for m in rx.finditer(text):
            den = m.groupdict().get("den")
            if den is not None and int(den) != scale:
                continue  # "2 out of 3 parts", "3/4 of the bars": not a verdict
            if best is None or m.end() > best.end():
                best = m
    return best


def _value_from(m: re.Match, text: str, scale: int) -> int:
    gd = m.groupdict()
    if gd.get("word"):
        value: float = _WORDS[gd["word"].lower()]
    else:
        raw = gd["num"]
        tail = m.string[m.end("num"):]
        if gd.get("den") is None:
            if _RANGE_AFTER.match(tail):
                raise ScoreParseError(f"ambiguous score range at '{m.group(0).strip()}{tail[:6]}'", text)
            sl = _SLASH_AFTER.match(tail)
            if sl and int(sl.group(1)) != scale:
                raise ScoreParseError(
                    f"score given on a different scale ('{raw}{sl.group(0)}', expected /{scale})", text)
        value = float(raw)
        if value != int(value):
            raise ScoreParseError(f"non-integer score {raw}", text)
    value = int(value)
    if not 1 <= value <= scale:
        raise ScoreParseError(f"score {value} out of range 1..{scale}", text)
    return value


def _parse_score_clean(clean: str, text: str, scale: int) -> int:
    best = _last_explicit(clean, scale)
    if best is not None:
        return _value_from(best, text, scale)
    # fallback: the output ends with a bare integer after the feedback ("... Overall solid.\n\n7")
    t = clean.rstrip()
    m = _TRAILING.search(t)
    if m:
        before = t[: m.start()].rstrip().lower()
        if re.search(r"(?:\bto|\band|\bthrough|\bof|\bfrom|[-–/])$", before):
            raise ScoreParseError("trailing number is part of a range/scale, not a score", text)
        return _value_from(m, text, scale)
    raise ScoreParseError("no score found", text)


def _na_last(clean: str, scale: int) -> bool:
    na = list(_NA_MARK.finditer(clean))
    best = _last_explicit(clean, scale)
    return bool(na) and (best is None or na[-1].end() > best.end())


def parse_score(text: str, scale: int = 10) -> int:
    """The judge's final integer score in ``1..scale``.

    Recognised (last occurrence wins, so a restated score at the end beats an earlier one):
    ``[[7]]``, ``[RESULT] 7``, ``Score: 7``, ``**Final Score:** 7/10``, ``Rating - 7``,
    ``Overall score is 7``, ``Score: seven``, ``I would rate it a 7``, ``deserves a 7``,
    ``7 out of 10``, ``7/10``; otherwise a bare integer that ends the output (after the feedback).
    ``<think>...</think>`` blocks are ignored.  Raises :class:`ScoreParseError` when there is no
    score, the score is N/A (use :func:`parse_score_or_na`), out of range, non-integer, a range
    (``7-8``) or on another scale (``4/5`` when ``scale=10``).
    """
    if not isinstance(text, str):
        raise ScoreParseError(f"judge output is not a string ({type(text).__name__})", repr(text))
    if not text.strip():
        raise ScoreParseError("empty judge output", text)
    clean = _strip_thinking(text)
    if _na_last(clean, scale):
        raise ScoreParseError("judge abstained (N/A); use parse_score_or_na for the N/A variant", text)
    return _parse_score_clean(clean, text, scale)


def parse_score_or_na(text: str, scale: int = 10) -> int | None:
    """Like :func:`parse_score` but returns ``None`` when the final verdict is N/A (abstention,
    Table 3 of the paper): ``Score: N/A``, ``[[N/A]]``, ``[RESULT] N/A`` or a last line ``N/A``.
    A numeric score given after the N/A mention wins; N/A after the last score wins."""
    if not isinstance(text, str):
        raise ScoreParseError(f"judge output is not a string ({type(text).__name__})", repr(text))
    if _na_last(_strip_thinking(text), scale):
        return None
    return parse_score(text, scale)


_AB = r"[(\[]?(?P<c>(?-i:[AB]))[)\]]?(?!\w)"
_PAIR_ECHO = re.compile(r"\[\[A\]\]\s*or\s*\[\[B\]\]")  # the format line echoed back
_PAIR_TIERS = [
    [re.compile(r"\[\[\s*(?:Response\s+|Assistant\s+)?(?P<c>[AB])\s*\]\]")],
    [re.compile(r"\b(?:final\s+)?(?:answer|verdict|choice|decision|selection|output|preference|winner|judg(?:e)?ment)"
                r"\b" + _MD + r"(?:is\s*:?|:|=|-)?" + _MD + r"\[?(?:Response\s+|Assistant\s+|Option\s+)?" + _AB, re.I),
     re.compile(r"\bbetter\s+response\b" + _MD + r"(?:is|:|=|-)?" + _MD + r"(?:Response\s+)?" + _AB, re.I)],
    [re.compile(r"\b(?:Response|Assistant)\s+(?P<c>[AB])\b" + _MD + r"(?:is|was)\s+(?:clearly\s+|slightly\s+|much\s+)?"
                r"(?:the\s+)?(?:better|superior|preferred|stronger|more\s+accurate|best)", re.I),
     re.compile(r"\b(?:I\s+)?(?:prefer|choose|select|pick)\s+(?:Response\s+|Assistant\s+)?" + _AB, re.I)],
    [re.compile(r"^" + _MD + r"(?:Response\s+|Assistant\s+)?" + _AB + _MD + r"[.!]?" + _MD + r"$", re.M)],
]


def parse_pairwise(text: str) -> str:
    """``"A"`` or ``"B"``: the judge's final choice in a pairwise judgment.

    Tiers (the first tier with a match decides; within a tier the last match wins):
    ``[[A]]``; labelled verdicts (``Final Answer: B``, ``Verdict: Response A``, ``Better response: B``);
    sentences (``Response B is better``, ``I prefer A``); a line that is just ``A``/``(B)``/
    ``Response A``.  Only capital A/B count.  Raises :class:`ScoreParseError` for no verdict or a
    tie (``[[C]]``, "tie", "equally good") without an A/B verdict.
    """
    if not isinstance(text, str):
        raise ScoreParseError(f"judge output is not a string ({type(text).__name__})", repr(text))
    if not text.strip():
        raise ScoreParseError("empty judge output", text)
    clean = _PAIR_ECHO.sub(" ", _strip_thinking(text))
    for tier in _PAIR_TIERS:
        hits = [m for rx in tier for m in rx.finditer(clean)]
        if hits:
            last = max(hits, key=lambda m: m.end())
            return last.group("c")
    if re.search(r"\[\[\s*C\s*\]\]|\btie\b|\bequally\s+good\b", clean, re.I):
        raise ScoreParseError("judge declared a tie; the pairwise protocol requires A or B", text)
    raise ScoreParseError("no pairwise verdict (A or B) found", text)
