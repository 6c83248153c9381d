"""Two-stage answer extraction for generated multiple-choice answers (Promptception, Appendix E).

Stage 1 - regex (:func:`extract_letter_regex`): find "a single letter corresponding to one of
the available choices" in the response. Stage 2 - model matching
(:func:`extract_letter_model`): if stage 1 fails, ask a text model (GPT-4o mini in the paper,
SmolLM2 here) which option the response means, with the prompt of Fig. 7 (or Fig. 8, which
adds a "refusal" output, used in the paper for GPT-4o's responses); its output is parsed with
stage 1. "If it is unable to determine a valid letter, we classify the response as a failure."

Policy (Appendix E, "Handling Invalid Responses"): responses unresolved by both stages are
**incorrect**; GPT-4o's safety refusals were **excluded** from its accuracy. Here every
response gets an :class:`ExtractionResult` with ``stage`` in {"regex", "model", "failed",
"refusal"}; callers count "failed" as incorrect and decide per model whether "refusal" rows are
excluded (paper: proprietary models) or counted as incorrect. Nothing is dropped here.

Figures 7 and 8 are images in the paper (not in the seed text). The prompts below follow their
described design - a question, its lettered options and the model's answer; output the matching
option letter, a "no match" code (Y in the authors' released code) or, in the Fig. 8 variant, a
"refusal / uncertainty" code (X) - with two or three worked examples; the wording is ours.

Stage-1 rules, in order (first that decides wins; a letter outside ``valid_letters`` or an
ambiguous statement such as "A or B" makes the response unresolved, never a guess):

1. the whole response is one letter, possibly decorated: ``B``, ``B.``, ``(B)``, ``[B]``,
   ``**B**``, ``$B$``, ``\\boxed{B}``, ``'b'``, ``Option B``;
2. explicit answer statements, the *last* one in the text wins: ``Answer: B``,
   ``The (correct|best|final) answer is (C)``, ``Best Choice: B``, ``{"answer": "B"}``,
   ``I choose B``, ``I'd go with B``, ``It's C``, ``So/Therefore/Thus D``, ``(C) is correct``;
3. a response opening with an option label: ``B) red``, ``B. red``, ``(B) red``, ``B: red``
   (skipped when the response lists several options, e.g. an echo of the choices);
4. the last line is a bare (decorated) letter (reasoning that ends in the letter);
5. exactly one distinct letter mentioned as ``option X`` / ``choice X``;
6. exactly one distinct valid capital letter standing alone in the text.

Lower-case letters count only in rules 1-3 (``answer: b``, ``(b)``), and "a" / "A" or "i" / "I"
followed by a word ("A cat is ...", "I think ...") are read as the article / pronoun, not as an
option, outside explicit statements. "A or B", "A and B", "A/B" are ambiguous.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from mmfragile.models.base import MLLM, Prompt
from mmfragile.schema import MCQuestion

__all__ = [
    "ExtractionResult",
    "extract_letter_regex",
    "is_refusal",
    "build_extraction_prompt",
    "extract_letter_model",
    "resolve_without_model",
    "read_extractor_output",
    "extract_answer",
]

_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
STAGES = ("regex", "model", "failed", "refusal")


@dataclass(frozen=True)
class ExtractionResult:
    """Outcome of extracting one response.

    ``letter`` is the extracted option letter or None; ``stage`` is "regex" (stage 1),
    "model" (stage 2), "failed" (neither; counts as incorrect) or "refusal" (the response is a
    refusal / disclaimer; the caller decides whether to exclude it). ``model_output`` is the raw
    stage-2 output when stage 2 ran.
    """

    letter: str | None
    stage: str
    refusal: bool = False
    model_output: str | None = None

    def is_correct(self, gold_letter: str) -> bool:
        """Failures and refusals are never correct."""
        return self.letter is not None and self.letter == str(gold_letter).upper()


# --------------------------------------------------------------------------------------
# Stage 1: regex
# --------------------------------------------------------------------------------------

def _valid(valid_letters: Sequence[str]) -> tuple[str, ...]:
    out = tuple(str(v).strip().upper() for v in valid_letters)
    if not out or any(len(v) != 1 or v not in _ALPHABET for v in out):
        raise ValueError(f"valid_letters must be single letters A-Z, got {list(valid_letters)!r}")
    return out


_SPECIAL_TOKENS = re.compile(r"<\|[^|>]{1,40}\|>|</?s>|<eos>|<end_of_turn>")
_LATEX_WRAP = re.compile(r"\\(?:boxed|text|textbf|mathrm|mathbf)\s*\{\s*([^{}]*?)\s*\}")

_DECOR_L = r"[\s\(\[\{\"'“‘’”$*<`_]*"
_DECOR_R = r"[\s\)\]\}\"'“‘’”$*>`_\.:,;!]*"
_BARE = re.compile(rf"^{_DECOR_L}(?:(?:option|choice|letter)\s*)?{_DECOR_L}([A-Za-z]){_DECOR_R}$", re.I)

# words after which "A"/"I" is still a letter ("A or B", "A to D")
_CONNECTORS = {"or", "and", "nor", "vs", "versus", "to", "through", "and/or"}

_VERB = (r"(?:(?:(?:is|was)(?:\s+(?:likely|probably|clearly|definitely|therefore|most\s+likely))?"
         r"|would\s+be|should\s+be|will\s+be|must\s+be|might\s+be|could\s+be|may\s+be"
         r"|seems\s+to\s+be|appears\s+to\s+be)\b\s*[:\-]?|[:=\-–—])")
_LPAD = r"[\s\(\[\{\"'“‘$\\]*"
_STRONG = [
    # Answer: B / The correct answer is (C) / Best Choice: B / {"answer": "B"} / answer is option C
    re.compile(
        r"\b(?:(?:final|correct|best|right|most\s+(?:likely|appropriate|suitable|accurate))\s+)?"
        r"(?:answer|choice|option|selection)(?:\s+(?:letter|choice|option))?[\"'”’]?\s*"
        rf"{_VERB}\s*(?:(?:option|choice|letter)\s*)?{_LPAD}(?P<L>[A-Za-z])(?![A-Za-z0-9])",
        re.I),
    # I choose B / I'd go with (B) / I would select C
    re.compile(
        r"\bI(?:\s+would|\s+will|'d|’d|'ll|’ll)?\s+(?:choose|select|pick|go\s+with|opt\s+for)\s+"
        rf"(?:(?:option|choice|answer)\s+)?{_LPAD}(?P<L>[A-Za-z])(?![A-Za-z0-9])",
        re.I),
    # it's C / that is B / so, D / therefore C  (capital letters only)
    re.compile(
        r"\b(?:[Ii]t(?:'s|’s|\s+is|\s+must\s+be|\s+should\s+be|\s+would\s+be)|[Tt]hat(?:'s|’s|\s+is)"
        r"|[Ss]o|[Tt]herefore|[Tt]hus|[Hh]ence)[,:]?\s+(?:[Oo]ption\s+|[Cc]hoice\s+)?[\(\[]?"
        r"(?P<L>[A-Z])(?![A-Za-z0-9'’])"),
    # (C) is correct / option B is the best answer / A is the right one
    re.compile(
        r"(?<![A-Za-z0-9])(?:[Oo]ption\s+|[Cc]hoice\s+)?[\(\[]?(?P<L>[A-Z])[\)\]]?\s+(?:is|seems|appears)\s+"
        r"(?:to\s+be\s+)?(?:the\s+)?(?:correct|right|best|most\s+(?:likely|appropriate|accurate|suitable))\b"),
]
_AMBIG_AFTER = re.compile(
    r"^[\)\]\}\"'”’$*]*\s*(?:or|and|nor|/|&|,)\s*(?:(?:option|choice)\s+)?[\(\[]?[A-Za-z](?![A-Za-z0-9])", re.I)
_LEADING = re.compile(
    r"^\s*(?:\((?P<a>[A-Za-z])\)|\[(?P<b>[A-Za-z])\]|(?P<c>[A-Z])[\.\):]|(?P<d>[a-z])\)|"
    r"(?:[Oo]ption|[Cc]hoice)\s*[\(\[]?(?P<e>[A-Za-z])[\)\]]?(?![A-Za-z0-9]))(?=\s|$|[\.,:;])")
_LABEL_LINE = re.compile(r"^[ \t]*(?:\(([A-Z])\)|([A-Z])[\.\):]|Option ([A-Z]):)(?=[ \t]|$)", re.M)
_OPTION_MENTION = re.compile(r"\b(?:[Oo]ption|[Cc]hoice)\s*[\(\[]?(?P<L>[A-Z])[\)\]]?(?![A-Za-z0-9'’])")
_STANDALONE = re.compile(r"(?<![A-Za-z0-9_'’\\-])(?P<L>[A-Z])(?![A-Za-z0-9_'’]|-\w)")
_NEGATED = re.compile(r"(?:\bnot|\bisn[’']t|\brather\s+than|\binstead\s+of|\bexcept|\bnor)\s+(?:option\s+|choice\s+)?[\(\[]?$",
                      re.I)


def _clean(text: str) -> str:
    s = _SPECIAL_TOKENS.sub(" ", str(text))
    s = _LATEX_WRAP.sub(r"\1", s)
    s = s.replace("**", "").replace("__", "")
    return s.strip()


def _word_follows(s: str, end: int) -> bool:
    """True if a word (not a connector) follows position ``end`` after whitespace."""
    m = re.match(r"\s+([A-Za-z][A-Za-z/]*)", s[end:])
    return bool(m) and len(m.group(1)) >= 1 and m.group(1).lower() not in _CONNECTORS and not (
        len(m.group(1)) == 1 and m.group(1).isupper())


def _is_article_or_pronoun(s: str, start: int, end: int) -> bool:
    L = s[start:end]
    if L.upper() not in ("A", "I"):
        return False
    if L.upper() == "I" and re.match(r"['’]", s[end:end + 1]):
        return True
    return _word_follows(s, end)


def _bare_letter(s: str) -> str | None:
    m = _BARE.match(s)
    return m.group(1).upper() if m else None


def _strong_matches(s: str) -> list[tuple[int, str, bool]]:
    """(position, letter, ambiguous) of explicit answer statements, in text order."""
    found: dict[int, tuple[int, str, bool]] = {}
    for pat in _STRONG:
        for m in pat.finditer(s):
            L = m.group("L")
            st, en = m.span("L")
            if L.islower() and L in "ai" and _word_follows(s, en):
                continue  # "the answer is a cat"
            if L.isupper() and pat is not _STRONG[0] and pat is not _STRONG[1] and _is_article_or_pronoun(s, st, en):
                continue  # "It is A cat", "so I think"
            if L.islower() and pat is _STRONG[1] and _word_follows(s, en):
                continue
            amb = bool(_AMBIG_AFTER.match(s[en:]))
            found[st] = (st, L.upper(), amb)
    return [found[k] for k in sorted(found)]


def extract_letter_regex(response: str | None, valid_letters: Sequence[str]) -> str | None:
    """Stage 1: the option letter a response names, or None (see the module docstring).

    Returns None for an empty response, an ambiguous one ("A or B"), one whose letter is not
    in ``valid_letters``, and one without a recognisable letter (stage 2 may still resolve it).
    """
    valid = _valid(valid_letters)
    if response is None:
        return None
    s = _clean(response)
    if not s:
        return None

    def ok(L: str | None) -> str | None:
        return L if L is not None and L in valid else None

    # 1. the whole response is a letter
    L = _bare_letter(s)
    if L is not None:
        return ok(L)

    # 2. explicit statements; the last one wins
    strong = _strong_matches(s)
    if strong:
        _, L, amb = strong[-1]
        return None if amb else ok(L)

    lines = [l for l in (x.strip() for x in s.splitlines()) if l]

    # 3. response opens with an option label (not a list of options)
    label_letters = {next(g for g in m.groups() if g) for m in _LABEL_LINE.finditer(s)}
    m = _LEADING.match(s)
    if m and len(label_letters) <= 1:
        L = next(g for g in m.groups() if g)
        st = m.start(next(k for k in "abcde" if m.group(k)))
        if not (L.islower() and L in "ai" and _word_follows(s, st + 1)):
            if not _AMBIG_AFTER.match(s[m.end():]):
                return ok(L.upper())

    # 4. the last line is a bare letter (not one of several bare-letter / label lines)
    if len(lines) > 1 and len(label_letters | {_bare_letter(l) for l in lines} - {None}) <= 1:
        L = _bare_letter(lines[-1])
        if L is not None:
            return ok(L)

    # 5. a single letter named as "option X" / "choice X"
    mentions = {m.group("L") for m in _OPTION_MENTION.finditer(s)
                if not _NEGATED.search(s[:m.start()])}
    mentions &= set(valid)
    if len(mentions) == 1:
        return mentions.pop()

    # 6. a single distinct valid capital letter standing alone
    cands = set()
    for m in _STANDALONE.finditer(s):
        L = m.group("L")
        if L not in valid:
            continue
        st, en = m.span("L")
        if _is_article_or_pronoun(s, st, en):
            continue
        if _NEGATED.search(s[:st]):
            continue
        cands.add(L)
    if len(cands) == 1:
        return cands.pop()
    return None


# --------------------------------------------------------------------------------------
# Refusals
# --------------------------------------------------------------------------------------

_REFUSAL = [re.compile(p, re.I) for p in (
    r"\bI\s*(?:'m|’m|\s+am)\s+(?:sorry|afraid)\b",
    r"\b(?:sorry|apologi[sz]e)\b[^.\n]*\b(?:can(?:not|'t|’t)|can\s+not|unable|not\s+able|won['’]t)\b",
    r"\bI\s*(?:cannot|can\s+not|can['’]t|won['’]t|am\s+unable|['’]m\s+unable|am\s+not\s+able|['’]m\s+not\s+able)"
    r"(?:\s+\w+ly){0,2}\s+(?:to\s+)?(?:help|assist|answer|determine|identify|see|view|provide|comply|tell|analy[sz]e|access|"
    r"process|make|say|know|be\s+sure|verify|confirm|evaluate|interpret|respond|choose|select|pick|open|watch)",
    r"\b(?:unable|not\s+able)\s+to\s+(?:determine|answer|identify|see|view|provide|assist|help|analy[sz]e|access|"
    r"process|tell|make|verify|confirm|evaluate|interpret|respond|choose|select|watch|open)",
    r"\b(?:cannot|can\s*not|can['’]t)\s+be\s+(?:determined|answered|identified|inferred)\b",
    r"\b(?:not\s+possible|impossible)\s+(?:for\s+me\s+)?to\s+(?:determine|tell|answer|say|identify|know)",
    r"\bI\s+(?:don['’]t|do\s+not)\s+know\b",
    r"\bI\s*(?:['’]m|\s+am)\s+not\s+(?:sure|certain)\b",
    r"\b(?:insufficient|not\s+enough)\s+(?:information|evidence|context|detail)",
    r"\bas\s+an\s+(?:AI|artificial\s+intelligence)\b",
)]


def is_refusal(response: str | None) -> bool:
    """True if the response reads as a refusal / disclaimer / declared inability to answer.

    Matches phrases such as "I cannot ...", "I'm sorry", "unable to determine", "cannot be
    determined", "I don't know", "I'm not sure", "not enough information", "As an AI".
    A response that also names a valid letter is still answered: :func:`extract_answer` only
    asks this after stage 1 found no letter (the Fig. 8 matcher likewise only sees responses
    stage 1 could not resolve).
    """
    if response is None:
        return False
    s = _clean(response)
    return bool(s) and any(p.search(s) for p in _REFUSAL)


# --------------------------------------------------------------------------------------
# Stage 2: model matching (Fig. 7 / Fig. 8)
# --------------------------------------------------------------------------------------

_EXAMPLE = (
    "Question: Which animal is shown in the picture?\n"
    "Options:\nA. horse\nB. giraffe\nC. zebra\nD. donkey\n"
)

EXTRACTION_PROMPT_FIG7 = (
    "You help grade a multiple-choice test. You are given a question, its lettered options and a "
    "student's answer. Find the option that the answer corresponds to.\n"
    "Decide only from what the answer literally says; do not solve the question yourself.\n"
    "If the answer matches none of the options, output {no_match}.\n"
    "Output only one character: the letter of the matching option, or {no_match}.\n\n"
    "Example 1:\n" + _EXAMPLE + "Answer: It is a zebra, you can see the black and white stripes.\n"
    "Your output: C\n\n"
    "Example 2:\n" + _EXAMPLE + "Answer: an elephant\nYour output: {no_match}\n\n"
    "{refusal_example}"
    "Now it is your turn:\n"
    "Question: {question}\nOptions:\n{options}\nAnswer: {response}\nYour output:"
)
_FIG8_RULE = (
    "If the answer refuses, apologises, or says it cannot tell or does not know (for example "
    "\"I'm sorry\", \"I can't\", \"I don't know\", \"I'm unable to\", \"I'm not sure\"), output {refusal}.\n"
)
_FIG8_EXAMPLE = "Example 3:\n" + _EXAMPLE + "Answer: I'm sorry, I can't see the image clearly.\nYour output: {refusal}\n\n"


def _codes(valid: tuple[str, ...]) -> tuple[str, str]:
    """No-match and refusal codes: Y and X as in the authors' code, unless they are options."""
    no_match = "Y" if "Y" not in valid else "NONE"
    refusal = "X" if "X" not in valid else "REFUSED"
    return no_match, refusal


def _format_options(options: Sequence[str], valid: tuple[str, ...]) -> str:
    opts = [str(o).strip() for o in options]
    return "\n".join(f"{L}. {opts[i]}" if i < len(opts) else f"{L}." for i, L in enumerate(valid))


def build_extraction_prompt(question: str, options: Sequence[str], response: str,
                            valid_letters: Sequence[str], refusal_aware: bool = False) -> str:
    """The stage-2 matching prompt: Fig. 7, or with ``refusal_aware`` the Fig. 8 variant that
    also asks for a refusal code (the paper uses Fig. 8 for GPT-4o's responses).

    ``options`` are listed with ``valid_letters`` in order (pass the rendered options, which
    include any options the prompt added, e.g. 7.6's E-G).
    """
    valid = _valid(valid_letters)
    no_match, refusal = _codes(valid)
    text = EXTRACTION_PROMPT_FIG7
    if refusal_aware:
        text = text.replace("Output only one character", _FIG8_RULE + "Output only one character")
        text = text.replace("the letter of the matching option, or {no_match}.",
                            "the letter of the matching option, {no_match}, or {refusal}.")
    fill = {
        "no_match": no_match,
        "refusal": refusal,
        "refusal_example": _FIG8_EXAMPLE.replace("{refusal}", refusal) if refusal_aware else "",
        "question": str(question).strip(),
        "options": _format_options(options, valid),
        "response": str(response).strip(),
    }
    return re.sub(r"\{(no_match|refusal|refusal_example|question|options|response)\}", lambda m: fill[m.group(1)], text)


def _parse_model_output(out: str, valid: tuple[str, ...], refusal_aware: bool) -> tuple[str | None, bool]:
    """(letter, refusal) from the stage-2 model output."""
    no_match, refusal = _codes(valid)
    s = _clean(out or "")
    first = re.match(r"^\W*([A-Za-z]+)", s)
    tok = first.group(1) if first else ""
    if tok == refusal:
        return None, refusal_aware  # without the Fig. 8 rule an X is just "no letter"
    if tok == no_match:
        return None, False
    return extract_letter_regex(s, valid), False


def _question_parts(question: MCQuestion | str, options: Sequence[str] | None) -> tuple[str, list[str]]:
    if isinstance(question, MCQuestion):
        return question.question, list(options if options is not None else question.options)
    if options is None:
        raise ValueError("options are required when question is a string")
    return str(question), list(options)


def extract_letter_model(response: str, question: MCQuestion | str, options: Sequence[str] | None,
                         valid_letters: Sequence[str], model: MLLM, *, refusal_aware: bool = False,
                         max_new_tokens: int = 8) -> str | None:
    """Stage 2: ask ``model`` which option ``response`` means; its output is parsed with stage 1.

    Returns the letter, or None when the model outputs the no-match / refusal code or nothing
    usable ("failure").
    """
    valid = _valid(valid_letters)
    qtext, opts = _question_parts(question, options)
    prompt = Prompt(text=build_extraction_prompt(qtext, opts, response, valid, refusal_aware))
    out = model.generate([prompt], max_new_tokens=max_new_tokens)[0]
    letter, _ = _parse_model_output(out, valid, refusal_aware)
    return letter


# --------------------------------------------------------------------------------------
# Both stages
# --------------------------------------------------------------------------------------

def _stage1(response: str | None, valid: tuple[str, ...], refusals: bool) -> ExtractionResult | None:
    letter = extract_letter_regex(response, valid)
    if letter is not None:
        return ExtractionResult(letter, "regex")
    if response is None or not _clean(response):
        return ExtractionResult(None, "failed")  # nothing to match
    if refusals and is_refusal(response):
        return ExtractionResult(None, "refusal", refusal=True)
    return None


def match_option_text(response: str | None, options: Sequence[str], valid_letters: Sequence[str]) -> str | None:
    """The letter of the one option whose text the response names ("The colour of the star is black." with
    options [red, black, gray] -> "B"), else None: no option named, or several (also when one option's text
    contains another's and both match). Case-insensitive, whole words.

    Not part of the paper's Appendix E; it is VLMEvalKit's ``can_infer_text`` rule, a deterministic,
    free stand-in for what the stage-2 model does with such responses. Off unless asked for
    (``extract_answer(..., match_text=True)``); results record it as stage ``"text"``."""
    if not response:
        return None
    valid = _valid(valid_letters)
    text = response.lower()
    hits = [i for i, o in enumerate(options[: len(valid)])
            if str(o).strip() and re.search(r"(?<!\w)" + re.escape(str(o).strip().lower()) + r"(?!\w)", text)]
    return valid[hits[0]] if len(hits) == 1 else None


def resolve_without_model(response: str | None, question: MCQuestion | str, valid_letters: Sequence[str], *,
                          options: Sequence[str] | None = None, refusals: bool = True,
                          match_text: bool = False) -> ExtractionResult | None:
    """Everything before stage 2: stage 1, the refusal heuristic (``refusals``) and, with ``match_text``,
    :func:`match_option_text`. None: only the stage-2 model can still resolve the response (a study sends those
    to the extractor as their own batched requests, :mod:`mmfragile.studies.promptception.extraction`)."""
    valid = _valid(valid_letters)
    r = _stage1(response, valid, refusals)
    if r is not None or not match_text:
        return r
    _, opts = _question_parts(question, options)
    letter = match_option_text(response, opts, valid)
    return ExtractionResult(letter, "text") if letter is not None else None


def extract_answer(response: str | None, question: MCQuestion | str, valid_letters: Sequence[str],
                   model: MLLM | None = None, *, options: Sequence[str] | None = None,
                   refusals: bool = True, max_new_tokens: int = 8, match_text: bool = False) -> ExtractionResult:
    """Stage 1, then (if ``model`` is given and stage 1 failed) stage 2, for one response.

    ``refusals=True`` flags refusals (stage "refusal", heuristic :func:`is_refusal` after stage 1
    fails, and the Fig. 8 refusal code in stage 2); ``refusals=False`` reproduces the Fig. 7
    pipeline used for all models except GPT-4o, where anything unresolved is "failed".
    An empty response is "failed" without calling the model (the paper: unresolved responses
    are incorrect; the authors' released evaluation script instead skips empty responses like
    refusals - callers wanting that can treat ``response == ""`` themselves). ``options`` overrides
    ``question.options`` (pass ``RenderedPrompt.options`` when a prompt adds options).
    One ``generate`` call per response: for many responses run the study's ``extraction`` stage (batched,
    resumable).
    """
    valid = _valid(valid_letters)
    r = resolve_without_model(response, question, valid, options=options, refusals=refusals, match_text=match_text)
    if r is not None:
        return r
    if model is None:
        return ExtractionResult(None, "failed")
    qtext, opts = _question_parts(question, options)
    out = model.generate([Prompt(text=build_extraction_prompt(qtext, opts, str(response), valid, refusals))],
                         max_new_tokens=max_new_tokens)[0]
    return read_extractor_output(out, valid, refusals)


def read_extractor_output(out: str, valid_letters: Sequence[str], refusals: bool) -> ExtractionResult:
    """The stage-2 result of the extractor's output ``out`` to :func:`build_extraction_prompt` (built with the same
    ``refusals``): stage "model" with its letter, "refusal" (the Fig. 8 code) or "failed"."""
    letter, refused = _parse_model_output(out, _valid(valid_letters), refusals)
    if refused:
        return ExtractionResult(None, "refusal", refusal=True, model_output=out)
    if letter is None:
        return ExtractionResult(None, "failed", model_output=out)
    return ExtractionResult(letter, "model", model_output=out)
