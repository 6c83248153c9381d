"""Study 1 prompt formats: option ID sets x option delimiters x option separators.

Reproduces the prompt template of "Unexplored Flaws in Multiple-Choice VQA Evaluations"
(seed ``format-bias-mcvqa``): Fig. 1 / Sec. 2.2 (question, options indexed by option IDs,
instruction), Table 1 (the 4 x 4 x 3 = 48 prompt format variations), Table 3 / Sec. A.1
(the optimised instruction prompt and the V*Bench reference prompt; Table 3 is "used across all
multiple-choice VQA datasets", so every dataset - the ones the paper does not cover included - gets the
same ``"paper"`` instruction), Table 5 (the standard format of each dataset; the datasets it does not
list - HRBench-8K and the Promptception benchmarks - are inferred in :data:`INFERRED_STANDARD`), Sec. 4.2 / B.3 (circular evaluation), Sec. A.3 (exact-match accuracy
and coverage) and Sec. A.4 (generation budget = longest tokenised option ID).

Level names (shared with :mod:`mmfragile.studies.format_bias.metrics`, do not rename):

* option_ids: ``uppercase``, ``lowercase``, ``numbers``, ``roman``
* delimiter:  ``dot``, ``colon``, ``bracket``, ``double_brackets``
* separator:  ``line_break``, ``comma``, ``semicolon``

Rendering decisions (the paper shows examples, not code; each choice is the literal reading):

* An option renders as ``<delimited ID> <option text>``: Table 1 gives the delimited ID
  (``{opt}.``, ``{opt}:``, ``{opt})``, ``({opt})``); the option text follows after one space
  (``A. red``, ``(a) red``) - the usual rendering; the seed's figures are not available as text,
  so the single space is our choice. Option text is stripped of surrounding whitespace.
* Separators are ``"\\n"``, ``", "`` and ``"; "`` (Table 1 ``{opt}\\n {opt}``, ``{opt}, {opt}``,
  ``{opt}; {opt}``). The blank after ``\\n`` in Table 1 is read as typesetting, not a space at
  the start of the next line: line-separated options start at column 0 (``A. x\\nB. y``).
* Order: question, options, instruction. Table 3's instruction says "the *above*
  multiple-choice question" and the V*Bench reference says "from the options *above*", so the
  instruction follows the options. The user text is
  ``question + "\\n" + options_block + "\\n" + instruction``.
* Shared prefix for KV-cache reuse: ``prefix = question + "\\n"`` (image + question; identical for
  all 48 formats, all shifts and both instructions), ``suffix = options_block + "\\n" +
  instruction``; ``text == prefix + suffix``. The prefix ends at a line boundary; a caller that
  caches it should still check that ``tokenize(prefix)`` is a prefix of ``tokenize(text)``
  (BPE merges across ``"\\n"`` + next char are tokenizer specific).
* Instruction (Table 3): ``{noun}`` is "letter" for upper/lowercase, "number" for numbers and
  "roman number" for roman IDs; the example list is ``", ".join(ids[:-1]) + " or " + ids[-1]``
  ("A, B, C or D", "A, B, C, D or E"), except for two options where Table 3 literally prints
  "A, or B" - reproduced as printed. The text keeps "based on the image" for every modality,
  as the paper uses one prompt for all datasets.
"""
from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

from mmfragile.data import benchmarks
from mmfragile.errors import DataError
from mmfragile.schema import MCQuestion

# --------------------------------------------------------------------------------------
# Factor levels (Table 1)
# --------------------------------------------------------------------------------------

#: How many IDs each set provides. 26 = the Latin alphabet; numbers and roman numerals are
#: capped at the same count so that every set can index the same questions.
MAX_OPTIONS = 26


def _roman(n: int) -> str:
    vals = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
            (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]
    out = []
    for v, s in vals:
        while n >= v:
            out.append(s)
            n -= v
    return "".join(out)


#: Option ID sets, in Table 1 order: uppercase A/B/C/D, lowercase a/b/c/d, numbers 1/2/3/4,
#: roman numbers I/II/III/IV. Each holds :data:`MAX_OPTIONS` IDs.
OPTION_ID_SETS: dict[str, tuple[str, ...]] = {
    "uppercase": tuple(chr(ord("A") + i) for i in range(MAX_OPTIONS)),
    "lowercase": tuple(chr(ord("a") + i) for i in range(MAX_OPTIONS)),
    "numbers": tuple(str(i + 1) for i in range(MAX_OPTIONS)),
    "roman": tuple(_roman(i + 1) for i in range(MAX_OPTIONS)),
}

#: Option delimiters (Table 1 "Example repr."): how an option ID is marked. ``{id}`` is the ID;
#: the option text follows after one space, e.g. ``A. red``, ``A: red``, ``A) red``, ``(A) red``.
DELIMITERS: dict[str, str] = {
    "dot": "{id}.",
    "colon": "{id}:",
    "bracket": "{id})",
    "double_brackets": "({id})",
}

#: Option separators (Table 1): what stands between two ``ID + option`` pairs.
SEPARATORS: dict[str, str] = {
    "line_break": "\n",
    "comma": ", ",
    "semicolon": "; ",
}

#: The noun Table 3 uses for each ID set ("Respond with only the <noun> (e.g., ...)").
ID_NOUNS: dict[str, str] = {
    "uppercase": "letter",
    "lowercase": "letter",
    "numbers": "number",
    "roman": "roman number",
}

#: Factor orders used by :func:`all_formats` (the order of the paper's full-result tables
#: 8-12: separator Comma/Line break/Semicolon, delimiter Dot/Colon/Bracket/Double brackets,
#: option IDs Upp./Low./Num./Rom.).
TABLE_ORDER = {
    "separator": ("comma", "line_break", "semicolon"),
    "delimiter": ("dot", "colon", "bracket", "double_brackets"),
    "option_ids": ("uppercase", "lowercase", "numbers", "roman"),
}

# --------------------------------------------------------------------------------------
# Instruction prompts (Table 3)
# --------------------------------------------------------------------------------------

#: Table 3 "Template" row; ``{noun}`` and ``{examples}`` are filled per ID set / option count.
PAPER_INSTRUCTION = (
    "Select the best answer to the above multiple-choice question based on the image. "
    "Respond with only the {noun} (e.g., {examples}) of the correct option and no bracket, "
    "colon, or dot."
)
#: Table 3 "Reference (V*Bench)" row.
VSTAR_INSTRUCTION = "Please select the correct answer from the options above."

INSTRUCTIONS = ("paper", "vstar", None)


def _example_list(ids: Sequence[str]) -> str:
    ids = list(ids)
    if len(ids) == 1:
        return ids[0]
    if len(ids) == 2:
        # Table 3 row "A/B" prints "A, or B" (sic); reproduced verbatim.
        return f"{ids[0]}, or {ids[1]}"
    return ", ".join(ids[:-1]) + " or " + ids[-1]


def instruction_text(kind: str | None, option_ids: Sequence[str], id_set: str) -> str:
    """The instruction prompt of Table 3 for ``kind`` ("paper", "vstar" or None -> "")."""
    if kind is None:
        return ""
    if kind == "paper":
        return PAPER_INSTRUCTION.format(noun=ID_NOUNS[id_set], examples=_example_list(option_ids))
    if kind == "vstar":
        return VSTAR_INSTRUCTION
    raise ValueError(f"instruction must be one of {INSTRUCTIONS}, got {kind!r}")


# --------------------------------------------------------------------------------------
# PromptFormat
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PromptFormat:
    """One of the 48 prompt formats: (option ID set, option delimiter, option separator)."""

    option_ids: str = "uppercase"
    delimiter: str = "dot"
    separator: str = "line_break"

    def __post_init__(self) -> None:
        for attr, levels in (("option_ids", OPTION_ID_SETS), ("delimiter", DELIMITERS),
                             ("separator", SEPARATORS)):
            v = getattr(self, attr)
            if v not in levels:
                raise ValueError(f"unknown {attr} {v!r}; choose one of {list(levels)}")

    @property
    def name(self) -> str:
        """``"<option_ids>-<delimiter>-<separator>"``, e.g. ``"uppercase-dot-line_break"``."""
        return f"{self.option_ids}-{self.delimiter}-{self.separator}"

    @classmethod
    def from_name(cls, name: str) -> "PromptFormat":
        parts = name.split("-")
        if len(parts) != 3:
            raise ValueError(f"bad prompt format name {name!r}; expected '<option_ids>-<delimiter>-<separator>'")
        return cls(*parts)

    def as_dict(self) -> dict[str, str]:
        return {"option_ids": self.option_ids, "delimiter": self.delimiter, "separator": self.separator}

    def ids(self, n: int, where: str = "") -> list[str]:
        """The first ``n`` IDs of this format's ID set; :class:`DataError` naming ``where`` if too many."""
        return option_ids_for(self.option_ids, n, where)

    def render_option(self, option_id: str, text: str) -> str:
        return DELIMITERS[self.delimiter].format(id=option_id) + " " + str(text).strip()

    def render_options(self, option_ids: Sequence[str], options: Sequence[str]) -> str:
        return SEPARATORS[self.separator].join(
            self.render_option(i, o) for i, o in zip(option_ids, options, strict=True))

    def __str__(self) -> str:  # pragma: no cover - cosmetic
        return self.name


def option_ids_for(id_set: str, n: int, where: str = "") -> list[str]:
    """First ``n`` IDs of ``id_set``; :class:`DataError` (naming ``where``) beyond the set's size."""
    ids = OPTION_ID_SETS[id_set]
    if n > len(ids):
        w = f"{where}: " if where else ""
        raise DataError(f"{w}{n} options but the {id_set!r} option ID set has only {len(ids)} IDs")
    return list(ids[:n])


def all_formats() -> list[PromptFormat]:
    """The 48 prompt formats of Table 1 in a fixed order.

    Order = the paper's full-result tables (Tab. 8-12): separator (comma, line_break, semicolon)
    outermost, then delimiter (dot, colon, bracket, double_brackets), then option IDs
    (uppercase, lowercase, numbers, roman) innermost.
    """
    return [PromptFormat(ids, delim, sep)
            for sep, delim, ids in itertools.product(TABLE_ORDER["separator"], TABLE_ORDER["delimiter"],
                                                     TABLE_ORDER["option_ids"])]


# --------------------------------------------------------------------------------------
# Standard formats per dataset (Table 5)
# --------------------------------------------------------------------------------------


#: Standard formats that Table 5 does not print, with where they come from (the benchmark registry,
#: :mod:`mmfragile.data.benchmarks`, holds every benchmark's format and its source). HRBench-8K: Table 5 lists
#: HR-Bench 4K only; 8K ships in the same release (HF ``DreamMr/HR-Bench``) and both are prompted by the same code
#: (HR-Bench's ``vlmeval/dataset/image_mcq.py``, ``"A. x\n"`` lines), so 8K gets 4K's format. MMStar, MMMU-Pro,
#: MVBench (the Promptception benchmarks, absent from the format-bias paper): the format the Promptception study
#: shows them in - its baseline prompt (Fig. 3, Type 1.1 "<LETTER>.": ``A. x`` on separate lines; the authors'
#: ``parse_options`` default) - i.e. uppercase, dot, line break.
INFERRED_STANDARD: dict[str, str] = benchmarks.inferred_standard()


class NoStandardFormat(KeyError, ValueError):
    """A dataset with no standard prompt format (neither Table 5 nor :data:`INFERRED_STANDARD`: a
    ``generic:`` file, a table with its own dataset name) where one is asked for. A :class:`KeyError` (the
    mapping protocol of :data:`STANDARD_FORMATS`) and a :class:`ValueError`; ``datasets`` names the ones
    without a format, ``known`` the datasets that have one. ``hint`` says what to pass instead."""

    def __init__(self, datasets: str | Sequence[str], hint: str = ""):
        self.datasets = [datasets] if isinstance(datasets, str) else list(datasets)
        self.known, self.hint = list(benchmarks.standard_formats()), hint
        names = ", ".join(repr(d) for d in self.datasets)
        msg = (f"no standard prompt format for dataset{'s' if len(self.datasets) > 1 else ''} {names}; "
               f"known: {self.known}")
        super().__init__(msg + (f"; {hint}" if hint else ""))

    def __str__(self) -> str:  # KeyError would print the message in quotes
        return str(self.args[0])

    def __reduce__(self):  # picklable (Ray workers) with its own arguments, not the message
        return type(self), (self.datasets, self.hint)


class _StandardFormats(Mapping):
    """Read-only mapping dataset -> standard :class:`PromptFormat` (Table 5, plus the inferred entries of
    :data:`INFERRED_STANDARD`), read from the benchmark registry (:mod:`mmfragile.data.benchmarks`).

    Keys are the paper's dataset names; lookups are forgiving: case and punctuation are
    ignored and common aliases work (``"a-okvqa"``, ``"vstar"``, ``"hr-bench-4k"``,
    ``"MME-RW-Lite"``, ``"mmbench-dev"``, and the loaders' names ``"hrbench-8k"``, ``"mmmu-pro-s10"``,
    ``"mvbench"``). The MMMU-Pro vision setting has no standard format: its options are in the image.
    """

    def __getitem__(self, key: str) -> PromptFormat:
        try:
            name = benchmarks.benchmark(key).standard_format
        except KeyError:
            name = None
        if name is None:
            raise NoStandardFormat(str(key))
        return PromptFormat.from_name(name)

    def __iter__(self) -> Iterator[str]:
        return iter(benchmarks.standard_formats())

    def __len__(self) -> int:
        return len(benchmarks.standard_formats())

    def __repr__(self) -> str:
        return "STANDARD_FORMATS(" + ", ".join(f"{k!r}: {v}" for k, v in benchmarks.standard_formats().items()) + ")"


STANDARD_FORMATS: Mapping[str, PromptFormat] = _StandardFormats()


def standard_format(dataset: str, default: PromptFormat | None = None) -> PromptFormat:
    """Table 5 standard format of ``dataset``; ``default`` (if given) for unknown datasets, else
    :class:`NoStandardFormat` (a ``KeyError`` and a ``ValueError``) listing the known datasets."""
    try:
        return STANDARD_FORMATS[dataset]
    except KeyError:
        if default is not None:
            return default
        raise


# --------------------------------------------------------------------------------------
# Circular evaluation (Sec. 4.2, B.3; MMBench CircularEval)
# --------------------------------------------------------------------------------------


def circular_shifts(n_options: int) -> list[int]:
    """Shifts ``k = 0..O-1`` of circular evaluation: every question is asked O times."""
    if n_options < 1:
        raise ValueError(f"n_options must be >= 1, got {n_options}")
    return list(range(n_options))


def shift_options(options: Sequence[str], answer: int, shift: int) -> tuple[list[str], int]:
    """Rotate ``options`` left by ``shift`` and return ``(shifted_options, new_answer_index)``.

    ``shifted[j] = options[(j + shift) % O]`` - the MMBench CircularEval order
    (ABCD, BCDA, CDAB, DABC): shift 1 puts the second option first. The correct answer moves
    to ``(answer - shift) % O``, so over k = 0..O-1 it visits every position exactly once.
    """
    n = len(options)
    if not 0 <= shift < n:
        raise ValueError(f"shift must be in 0..{n - 1} for {n} options, got {shift}")
    if not 0 <= answer < n:
        raise ValueError(f"answer index {answer} outside the {n} options")
    shifted = [options[(j + shift) % n] for j in range(n)]
    return shifted, (answer - shift) % n


# --------------------------------------------------------------------------------------
# Prompt builder
# --------------------------------------------------------------------------------------


@dataclass
class FormattedPrompt:
    """A rendered multiple-choice prompt. ``text == prefix + suffix``."""

    text: str
    prefix: str          # question part, shared by all formats / shifts / instructions
    suffix: str          # options block + instruction
    option_ids: list[str]
    answer_id: str       # ID of the correct option after the shift
    answer: int          # index of the correct option in ``options`` (after the shift)
    options: list[str]   # options in the shown (shifted) order
    shift: int
    fmt: PromptFormat
    instruction: str = ""
    question_id: str = ""
    dataset: str = ""
    images: list[str] = field(default_factory=list)

    def to_prompt(self, system: str | None = None, assistant_prefix: str = ""):
        """As a :class:`mmfragile.models.base.Prompt` (user text + the question's images)."""
        from mmfragile.models.base import Prompt

        return Prompt(text=self.text, images=list(self.images), system=system, assistant_prefix=assistant_prefix)


def _as_question(q: Any) -> MCQuestion:
    if isinstance(q, MCQuestion):
        return q
    return MCQuestion.from_row(q)


def _where(q: MCQuestion) -> str:
    return f"dataset {q.dataset!r}, question_id={q.question_id!r}"


def build_mc_prompt(question: Any, fmt: PromptFormat, shift: int = 0,
                    instruction: str | None = "paper") -> FormattedPrompt:
    """Render ``question`` (an :class:`MCQuestion` or a question-table row) in format ``fmt``.

    The options are rotated by ``shift`` (circular evaluation), indexed by the first O IDs of
    ``fmt.option_ids``, marked by ``fmt.delimiter``, joined by ``fmt.separator``, and followed
    by the Table 3 instruction (``"paper"``: the optimised prompt adapted to the ID set and
    option count; ``"vstar"``: the V*Bench reference prompt; ``None``: no instruction).
    Raises :class:`DataError` naming the question if it has more options than the ID set has
    IDs, fewer than two options, or an answer index outside the options.
    """
    q = _as_question(question)
    where = _where(q)
    n = len(q.options)
    if n < 2:
        raise DataError(f"{where}: needs at least 2 options, got {n}")
    if not 0 <= q.answer < n:
        raise DataError(f"{where}: answer index {q.answer} is not among the {n} options")
    ids = fmt.ids(n, where)
    if not 0 <= shift < n:
        raise ValueError(f"{where}: shift must be in 0..{n - 1}, got {shift}")
    options, answer = shift_options(list(q.options), q.answer, shift)
    instr = instruction_text(instruction, ids, fmt.option_ids)
    prefix = f"{q.question.strip()}\n"
    suffix = fmt.render_options(ids, options)
    if instr:
        suffix += "\n" + instr
    return FormattedPrompt(
        text=prefix + suffix, prefix=prefix, suffix=suffix, option_ids=ids, answer_id=ids[answer],
        answer=answer, options=options, shift=shift, fmt=fmt, instruction=instr,
        question_id=q.question_id, dataset=q.dataset, images=list(q.images),
    )


@dataclass
class ClozePrompt:
    """CP-LN input (Sec. 4.3 / B.3): only the question; each option is scored as a continuation."""

    text: str
    continuations: list[str]
    answer: int
    question_id: str = ""
    dataset: str = ""
    images: list[str] = field(default_factory=list)

    def to_prompt(self, system: str | None = None, assistant_prefix: str = ""):
        from mmfragile.models.base import Prompt

        return Prompt(text=self.text, images=list(self.images), system=system, assistant_prefix=assistant_prefix)


def build_cloze_prompt(question: Any) -> ClozePrompt:
    """Cloze prompt for CP-LN: the question alone (no options, IDs or instruction), and the
    option texts as continuations of the assistant turn, in canonical order.

    Sec. 4.3: "instead of including all answer options in the prompt ... only the question is
    provided"; so the result does not depend on the prompt format.
    """
    q = _as_question(question)
    if len(q.options) < 2:
        raise DataError(f"{_where(q)}: needs at least 2 options, got {len(q.options)}")
    return ClozePrompt(text=q.question.strip(), continuations=[str(o).strip() for o in q.options],
                       answer=q.answer, question_id=q.question_id, dataset=q.dataset, images=list(q.images))


# --------------------------------------------------------------------------------------
# Generation budget (Sec. A.4) and scoring (Sec. A.3)
# --------------------------------------------------------------------------------------


def max_new_tokens_for(ids: Sequence[str], tokenizer_len_fn: Callable[[str], int]) -> int:
    """Sec. A.4: tokenize every option ID the dataset needs and generate as many tokens as the
    longest one takes (at least 1).

    ``ids`` should be the IDs for the dataset's largest option count, e.g.
    ``fmt.ids(max_options)``; ``tokenizer_len_fn(s)`` returns the number of tokens of ``s``
    (e.g. ``lambda s: len(tok(s, add_special_tokens=False).input_ids)``).
    """
    ids = list(ids)
    if not ids:
        raise ValueError("max_new_tokens_for needs at least one option ID")
    return max(1, max(int(tokenizer_len_fn(i)) for i in ids))


def score_exact_match(raw_output: str | None, option_ids: Sequence[str], answer_id: str) -> tuple[bool, bool, int]:
    """Score one raw generation by exact match (Sec. A.3): ``(covered, correct, selected)``.

    * ``covered``  - the output is one of the valid option IDs of this question (Eq. 6, s_i);
    * ``correct``  - the output equals the ground-truth ID;
    * ``selected`` - index of the matched ID in ``option_ids`` (the selected option position),
      or ``-1`` when not covered.

    Rule: the output is stripped of leading/trailing whitespace and then compared to the IDs
    exactly, case-sensitive, with no answer extraction. Justification: A.3 evaluates "directly
    on the model's generated output sequence without applying any answer extraction
    mechanism" and counts "A." or "A)" as wrong for label "A", so punctuation, brackets and
    extra words always fail; case is part of the ID because the ID set (uppercase vs lowercase,
    "II" vs "ii") is the factor under study, so "a" is not a valid answer to A/B/C/D (and is the
    only valid form for a/b/c/d). Whitespace is the one thing removed: the budget is the
    token length of the longest ID (A.4), decoders often emit the ID as a word-initial piece
    (" A", "▁A") or a trailing newline, and A.3 never lists whitespace as a failure. ``None``
    or an empty/whitespace output is out of coverage and incorrect - never dropped.
    """
    out = "" if raw_output is None else str(raw_output).strip()
    ids = [str(i) for i in option_ids]
    if out in ids:
        sel = ids.index(out)
        return True, out == str(answer_id), sel
    return False, False, -1


def exact_match_score(raw: str | None, item: Any) -> dict[str, Any]:
    """The grid stage's score of one output (an :class:`~mmfragile.runner.EvalItem`'s): :func:`score_exact_match`
    as the stored columns ``covered``, ``correct`` and ``selected_position``."""
    covered, correct, selected = score_exact_match(raw, item.option_ids, item.answer_id)
    return {"covered": covered, "correct": correct, "selected_position": selected}


__all__ = [
    "MAX_OPTIONS", "OPTION_ID_SETS", "DELIMITERS", "SEPARATORS", "ID_NOUNS", "TABLE_ORDER",
    "PAPER_INSTRUCTION", "VSTAR_INSTRUCTION", "INSTRUCTIONS", "instruction_text",
    "PromptFormat", "option_ids_for", "all_formats", "STANDARD_FORMATS", "INFERRED_STANDARD", "standard_format",
    "NoStandardFormat",
    "circular_shifts", "shift_options", "FormattedPrompt", "build_mc_prompt",
    "ClozePrompt", "build_cloze_prompt", "max_new_tokens_for", "score_exact_match", "exact_match_score",
]
