"""Study 1 prompt formats (format-bias seed: Tab. 1, Tab. 3, Tab. 5, Sec. A.3, A.4, B.3)."""
import pandas as pd
import pytest

from mmfragile.data import benchmarks
from mmfragile.studies.format_bias.prompts import (
    DELIMITERS,
    INFERRED_STANDARD,
    OPTION_ID_SETS,
    SEPARATORS,
    STANDARD_FORMATS,
    PromptFormat,
    all_formats,
    build_cloze_prompt,
    build_mc_prompt,
    circular_shifts,
    max_new_tokens_for,
    score_exact_match,
    exact_match_score,
    shift_options,
    standard_format,
)
from mmfragile.errors import DataError
from mmfragile.schema import MCQuestion, questions_frame

PAPER = ("Select the best answer to the above multiple-choice question based on the image. "
         "Respond with only the {noun} (e.g., {ex}) of the correct option and no bracket, colon, or dot.")


@pytest.fixture
def q3():
    return MCQuestion("synthetic-vqa", "q3", "What color is the ball?", ["red", "green", "blue"], 1, ["/img/ball.png"])


@pytest.fixture
def q5():
    return MCQuestion("MME-RealWorld-Lite", "q5", "Which sign is shown?", ["stop", "yield", "speed", "exit", "none"], 4)


# ---------------------------------------------------------------- factor levels (Tab. 1)

def test_level_keys_are_the_shared_names():
    assert list(OPTION_ID_SETS) == ["uppercase", "lowercase", "numbers", "roman"]
    assert list(DELIMITERS) == ["dot", "colon", "bracket", "double_brackets"]
    assert list(SEPARATORS) == ["line_break", "comma", "semicolon"]
    assert OPTION_ID_SETS["uppercase"][:4] == ("A", "B", "C", "D")
    assert OPTION_ID_SETS["lowercase"][:4] == ("a", "b", "c", "d")
    assert OPTION_ID_SETS["numbers"][:4] == ("1", "2", "3", "4")
    assert OPTION_ID_SETS["roman"][:9] == ("I", "II", "III", "IV", "V", "VI", "VII", "VIII", "IX")
    assert OPTION_ID_SETS["roman"][-1] == "XXVI" and all(len(v) == 26 for v in OPTION_ID_SETS.values())


def test_48_unique_formats_in_table_order():
    fmts = all_formats()
    assert len(fmts) == 48 and len({f.name for f in fmts}) == 48
    assert {(f.option_ids, f.delimiter, f.separator) for f in fmts} == {
        (i, d, s) for i in OPTION_ID_SETS for d in DELIMITERS for s in SEPARATORS}
    # Tab. 8-12 order: separator outer (comma first), delimiter, option IDs inner.
    assert fmts[0] == PromptFormat("uppercase", "dot", "comma")
    assert fmts[1] == PromptFormat("lowercase", "dot", "comma")
    assert fmts[4] == PromptFormat("uppercase", "colon", "comma")
    assert fmts[16] == PromptFormat("uppercase", "dot", "line_break")
    assert fmts[-1] == PromptFormat("roman", "double_brackets", "semicolon")
    assert all_formats() == fmts  # deterministic


def test_name_roundtrip_and_validation():
    f = PromptFormat("roman", "double_brackets", "semicolon")
    assert f.name == "roman-double_brackets-semicolon"
    assert PromptFormat.from_name(f.name) == f
    assert f.as_dict() == {"option_ids": "roman", "delimiter": "double_brackets", "separator": "semicolon"}
    with pytest.raises(ValueError, match="unknown delimiter"):
        PromptFormat("uppercase", "dash", "comma")
    with pytest.raises(ValueError):
        PromptFormat.from_name("uppercase-dot")


def test_standard_formats_table5():
    sf = STANDARD_FORMATS
    assert sf["A-OKVQA"] == PromptFormat("lowercase", "double_brackets", "line_break")
    assert sf["HRBench-4K"] == PromptFormat("uppercase", "dot", "line_break")
    assert sf["MMBench"] == PromptFormat("uppercase", "dot", "semicolon")
    assert sf["MME-RealWorld-Lite"] == PromptFormat("uppercase", "double_brackets", "line_break")
    assert sf["V*Bench"] == PromptFormat("uppercase", "dot", "line_break")
    assert sf["synthetic-vqa"] == sf["easy-vqa"] == sf["easy-vqa-media"] == PromptFormat("uppercase", "dot", "line_break")
    # forgiving lookups
    assert sf["a-okvqa"] == sf["A-OKVQA"]
    assert sf["vstar"] == sf["V*Bench"] == sf["vstar-bench"]
    assert sf["hr-bench-4k"] == sf["HRBench-4K"]
    assert sf["MME-RW-Lite"] == sf["MME-RealWorld-Lite"]
    assert sf["mmbench-dev"] == sf["MMBench"]
    # one entry per registry benchmark with a text format (a benchmark's settings and subsets resolve to it)
    with_format = [b.name for b in benchmarks.BENCHMARKS if b.family is None and b.standard_format]
    assert list(sf) == with_format and {"A-OKVQA", "MMBench", "easy-vqa"} <= set(sf)
    # datasets Table 5 does not print: inferred, each with its source; the loaders' names resolve
    assert set(INFERRED_STANDARD) == {"HRBench-8K", "MMStar", "MMMU-Pro", "MVBench"}
    assert sf["hrbench-8k"] == sf["HRBench-4K"]
    assert sf["mmmu-pro-s4"] == sf["mmmu-pro-s10"] == sf["mvbench"] == sf["mmstar"] == PromptFormat()
    with pytest.raises(KeyError):
        sf["mmmu-pro-vision"]  # options in the image: no text format applies
    with pytest.raises(KeyError, match="no standard prompt format"):
        sf["imagenet"]
    assert standard_format("imagenet", default=PromptFormat()) == PromptFormat()


# ---------------------------------------------------------------- rendering

def test_uppercase_dot_linebreak_3_options(q3):
    p = build_mc_prompt(q3, PromptFormat("uppercase", "dot", "line_break"))
    assert p.text == ("What color is the ball?\n"
                      "A. red\nB. green\nC. blue\n"
                      + PAPER.format(noun="letter", ex="A, B or C"))
    assert p.option_ids == ["A", "B", "C"] and p.answer_id == "B" and p.answer == 1
    assert p.options == ["red", "green", "blue"] and p.shift == 0
    assert p.prefix == "What color is the ball?\n" and p.text == p.prefix + p.suffix
    assert p.images == ["/img/ball.png"] and p.question_id == "q3"


def test_roman_double_brackets_semicolon_3_and_5_options(q3, q5):
    f = PromptFormat("roman", "double_brackets", "semicolon")
    p = build_mc_prompt(q3, f)
    assert p.text == ("What color is the ball?\n(I) red; (II) green; (III) blue\n"
                      + PAPER.format(noun="roman number", ex="I, II or III"))
    assert p.answer_id == "II"
    p5 = build_mc_prompt(q5, f)
    assert p5.text == ("Which sign is shown?\n(I) stop; (II) yield; (III) speed; (IV) exit; (V) none\n"
                       + PAPER.format(noun="roman number", ex="I, II, III, IV or V"))
    assert p5.answer_id == "V"


def test_other_delimiters_and_separators(q3, q5):
    assert build_mc_prompt(q3, PromptFormat("lowercase", "bracket", "comma"), instruction=None).text == \
        "What color is the ball?\na) red, b) green, c) blue"
    assert build_mc_prompt(q3, PromptFormat("numbers", "colon", "line_break"), instruction=None).suffix == \
        "1: red\n2: green\n3: blue"
    assert build_mc_prompt(q3, PromptFormat("lowercase", "double_brackets", "line_break"), instruction=None).suffix == \
        "(a) red\n(b) green\n(c) blue"
    p = build_mc_prompt(q5, PromptFormat("numbers", "dot", "comma"))
    assert p.suffix.endswith(PAPER.format(noun="number", ex="1, 2, 3, 4 or 5"))
    p = build_mc_prompt(q5, PromptFormat("lowercase", "dot", "comma"))
    assert PAPER.format(noun="letter", ex="a, b, c, d or e") in p.text


def test_instruction_variants_table3(q3):
    f = PromptFormat()
    assert build_mc_prompt(q3, f, instruction="vstar").text == (
        "What color is the ball?\nA. red\nB. green\nC. blue\n"
        "Please select the correct answer from the options above.")
    none = build_mc_prompt(q3, f, instruction=None)
    assert none.text == "What color is the ball?\nA. red\nB. green\nC. blue" and none.instruction == ""
    # Table 3 rows A/B/C/D and A/B (the latter printed "A, or B" in the paper)
    q4 = MCQuestion("d", "q4", "Q?", ["w", "x", "y", "z"], 0)
    assert build_mc_prompt(q4, f).instruction == PAPER.format(noun="letter", ex="A, B, C or D")
    q2 = MCQuestion("d", "q2", "Q?", ["yes", "no"], 0)
    assert build_mc_prompt(q2, f).instruction == PAPER.format(noun="letter", ex="A, or B")
    with pytest.raises(ValueError):
        build_mc_prompt(q3, f, instruction="other")


def test_shared_prefix_across_formats_shifts_instructions(q5):
    prompts = [build_mc_prompt(q5, f, k, ins) for f in all_formats() for k in circular_shifts(5)
               for ins in ("paper", "vstar", None)]
    assert {p.prefix for p in prompts} == {"Which sign is shown?\n"}
    assert all(p.text == p.prefix + p.suffix for p in prompts)
    assert len({p.text for p in prompts}) == len(prompts)


def test_shifted_prompt(q3):
    p = build_mc_prompt(q3, PromptFormat("uppercase", "dot", "line_break"), shift=1, instruction=None)
    assert p.options == ["green", "blue", "red"] and p.answer_id == "A" and p.answer == 0 and p.shift == 1
    assert p.suffix == "A. green\nB. blue\nC. red"
    p2 = build_mc_prompt(q3, PromptFormat(), shift=2)
    assert p2.options == ["blue", "red", "green"] and p2.answer_id == "C"
    with pytest.raises(ValueError):
        build_mc_prompt(q3, PromptFormat(), shift=3)


def test_question_table_row_input(q3):
    df = questions_frame([q3])
    p = build_mc_prompt(df.iloc[0], PromptFormat())
    assert p.text == build_mc_prompt(q3, PromptFormat()).text
    pr = p.to_prompt()
    assert pr.text == p.text and pr.images == ["/img/ball.png"]


def test_too_many_options_names_the_question():
    q = MCQuestion("synthetic-vqa", "q-many", "Pick one", [f"opt{i}" for i in range(27)], 0)
    for ids in OPTION_ID_SETS:
        with pytest.raises(DataError, match="q-many.*27 options"):
            build_mc_prompt(q, PromptFormat(ids, "dot", "comma"))
    q26 = MCQuestion("synthetic-vqa", "q26", "Pick one", [f"opt{i}" for i in range(26)], 25)
    assert build_mc_prompt(q26, PromptFormat("roman", "dot", "comma")).answer_id == "XXVI"
    assert build_mc_prompt(q26, PromptFormat("lowercase", "dot", "comma")).answer_id == "z"
    with pytest.raises(DataError, match="q1"):
        build_mc_prompt(MCQuestion("d", "q1", "Q", ["only"], 0), PromptFormat())


# ---------------------------------------------------------------- circular evaluation

def test_circular_shifts_and_shift_options():
    assert circular_shifts(4) == [0, 1, 2, 3]
    opts = ["a", "b", "c", "d"]
    assert shift_options(opts, 2, 0) == (["a", "b", "c", "d"], 2)
    assert shift_options(opts, 2, 1) == (["b", "c", "d", "a"], 1)
    assert shift_options(opts, 2, 3) == (["d", "a", "b", "c"], 3)
    # the correct answer visits every position exactly once
    assert sorted(shift_options(opts, 2, k)[1] for k in circular_shifts(4)) == [0, 1, 2, 3]
    for k in circular_shifts(4):
        new, ans = shift_options(opts, 2, k)
        assert new[ans] == "c"
    with pytest.raises(ValueError):
        shift_options(opts, 0, 4)


def test_circular_evaluation_counts(q3, q5, tiny_vlm):
    from mmfragile.studies.format_bias.items import format_bias_items

    q2 = MCQuestion("d", "q2", "Q?", ["yes", "no"], 1)
    items = format_bias_items(tiny_vlm, questions_frame([q3, q5, q2]), formats=[PromptFormat()], include_standard=False)
    assert len(items) == 3 + 5 + 2  # N x O items of one format (Tab. 5 "Circ. eval.")
    shifts = pd.DataFrame([it.key for it in items]).groupby("question_id")["shift"].apply(list).to_dict()
    assert shifts == {"q3": [0, 1, 2], "q5": [0, 1, 2, 3, 4], "q2": [0, 1]}


# ---------------------------------------------------------------- generation budget (A.4)

def test_max_new_tokens_for():
    fake_len = len  # one token per character
    assert max_new_tokens_for(PromptFormat("roman").ids(5), fake_len) == 3  # "III"
    assert max_new_tokens_for(PromptFormat("uppercase").ids(4), fake_len) == 1
    assert max_new_tokens_for(PromptFormat("numbers").ids(12), fake_len) == 2  # "10".."12"
    assert max_new_tokens_for(["A"], lambda s: 0) == 1
    with pytest.raises(ValueError):
        max_new_tokens_for([], fake_len)


# ---------------------------------------------------------------- exact-match scoring (A.3)

UPPER4 = ["A", "B", "C", "D"]


@pytest.mark.parametrize("raw, expected", [
    ("A", (True, True, 0)),
    (" A", (True, True, 0)),       # leading word-boundary space from the decoder
    ("A\n", (True, True, 0)),
    ("B", (True, False, 1)),       # valid ID, wrong answer
    ("D", (True, False, 3)),
    ("A.", (False, False, -1)),    # A.3: "A." is not correct
    ("A)", (False, False, -1)),    # A.3: "A)" is not correct
    ("A. green", (False, False, -1)),
    ("(A)", (False, False, -1)),
    ("a", (False, False, -1)),     # case is part of the ID set
    ("II", (False, False, -1)),    # another ID set
    ("E", (False, False, -1)),     # not among this question's 4 IDs
    ("", (False, False, -1)),
    ("   ", (False, False, -1)),
    (None, (False, False, -1)),
    ("The answer is A", (False, False, -1)),
])
def test_score_exact_match_uppercase(raw, expected):
    assert score_exact_match(raw, UPPER4, "A") == expected


def test_score_exact_match_other_sets():
    roman = ["I", "II", "III", "IV"]
    assert score_exact_match("II", roman, "II") == (True, True, 1)
    assert score_exact_match("I", roman, "II") == (True, False, 0)  # prefix of the answer is a different ID
    assert score_exact_match("ii", roman, "II") == (False, False, -1)
    assert score_exact_match("II.", roman, "II") == (False, False, -1)
    assert score_exact_match("a", ["a", "b", "c"], "a") == (True, True, 0)
    assert score_exact_match("A", ["a", "b", "c"], "a") == (False, False, -1)
    assert score_exact_match("3", ["1", "2", "3"], "3") == (True, True, 2)
    assert score_exact_match("(3)", ["1", "2", "3"], "3") == (False, False, -1)


def test_grid_score_keeps_unparseable(q3):
    from types import SimpleNamespace

    prompts = [build_mc_prompt(q3, PromptFormat(), k) for k in circular_shifts(3)]  # answer ids B, A, C
    assert [p.answer for p in prompts] == [1, 0, 2]
    rows = pd.DataFrame([exact_match_score(out, SimpleNamespace(option_ids=p.option_ids, answer_id=p.answer_id))
                         for out, p in zip(["B", "A.", ""], prompts)])
    assert rows["covered"].tolist() == [True, False, False]   # every output scored, none dropped
    assert rows["correct"].tolist() == [True, False, False]
    assert rows["selected_position"].tolist() == [1, -1, -1]


def test_cloze_prompt(q3):
    c = build_cloze_prompt(q3)
    assert c.text == "What color is the ball?"
    assert c.continuations == ["red", "green", "blue"] and c.answer == 1
    assert c.to_prompt().images == ["/img/ball.png"]
