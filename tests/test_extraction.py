"""Two-stage answer extraction (Promptception Appendix E): regex stage, refusals, model stage."""
from __future__ import annotations

import re

import pytest

from mmfragile.studies.promptception.answers import (
    ExtractionResult,
    build_extraction_prompt,
    extract_answer,
    extract_letter_model,
    extract_letter_regex,
    is_refusal,
)
from mmfragile.models.base import MLLM, Prompt
from mmfragile.schema import MCQuestion

ABCD = ["A", "B", "C", "D"]
A_TO_G = list("ABCDEFG")  # 7.6 renders E-G as extra options for 4-option questions


# (response, expected letter) for 4 options A-D
CASES = [
    # bare / decorated letters
    ("B", "B"),
    ("B.", "B"),
    (" (B) ", "B"),
    ("[B]", "B"),
    ("**B**", "B"),
    ("$B$", "B"),
    ("\\boxed{C}", "C"),
    ("'D'", "D"),
    ("b", "B"),
    ("(c)", "C"),
    ("Option B", "B"),
    ("B<|im_end|>", "B"),
    # explicit statements
    ("Answer: B", "B"),
    ("answer: b", "B"),
    ("Answer: $B$", "B"),
    ("**Answer:** C", "C"),
    ("Answer: D. Shape", "D"),
    ("The answer is (C) blue", "C"),
    ("The correct answer is A.", "A"),
    ("The best answer is D", "D"),
    ("Best Choice: B", "B"),
    ("BEST OPTION: A", "A"),
    ("The correct option is (A) Composition.", "A"),
    ("Final answer: C", "C"),
    ('{"answer": "B"}', "B"),
    ('```json\n{"Answer": "D"}\n```', "D"),
    ("I choose B because of the strong diagonal lines.", "B"),
    ("I'd go with C.", "C"),
    ("I think it's C because the weights on both sides are equal.", "C"),
    ("The answer would be D, since the outline is a simple shape.", "D"),
    ("(C) is correct.", "C"),
    ("Option B is the best answer here.", "B"),
    ("The answer is \\boxed{A}", "A"),
    # lettered option openings
    ("B) red", "B"),
    ("B. Perspective", "B"),
    ("(B) Perspective - the lines converge.", "B"),
    ("C: Balance", "C"),
    ("A. Composition", "A"),
    # reasoning ending in an answer
    ("The image shows converging lines.\nOption A is about arrangement, option B about depth.\n"
     "So the answer is D", "D"),
    ("Step 1) The picture is symmetric.\nStep 2) Symmetry relates to balance.\nTherefore, C.", "C"),
    ("Let me look at the image carefully. The two sides mirror each other.\n\nC", "C"),
    ("A careful look shows that the left and right halves mirror each other, "
     "so the answer is C.", "C"),
    ("It is not A, it is B.", "B"),
    ("The answer is B, not A.", "B"),
    ("The image shows a balanced scene. C", "C"),
    ("Answer: C\nExplanation: a balanced layout puts equal visual weight on both sides.", "C"),
    # unresolved by stage 1
    ("A cat is sitting on the mat.", None),
    ("A or B", None),
    ("The answer is A or B.", None),
    ("Either B or C could be right.", None),
    ("Both A and C describe the picture.", None),
    ("Answer: E", None),  # not a valid letter for 4 options
    ("E", None),
    ("$LETTER", None),  # Table 12: models echo the placeholder
    ("Answer: $LETTER", None),
    ("$ LETTER", None),
    ("Composition", None),
    ("I think the image shows a balanced scene.", None),
    ("A.\nB.\nC.\nD.", None),
    ("A. Composition\nB. Perspective\nC. Balance\nD. Shape", None),
    ("", None),
    ("   ", None),
    ("I cannot determine the answer from the image.", None),
]


@pytest.mark.parametrize("response,expected", CASES)
def test_regex_stage(response, expected):
    assert extract_letter_regex(response, ABCD) == expected


def test_many_cases():
    assert len(CASES) >= 40


@pytest.mark.parametrize("response,letters,expected", [
    ("E", A_TO_G, "E"),  # 7.6: "Not sure" is a valid (never correct) answer
    ("Answer: G", A_TO_G, "G"),
    ("F. Evidence not sufficient to answer", A_TO_G, "F"),
    ("Answer: J", list("ABCDEFGHIJ"), "J"),  # MMMU-Pro 10 options
    ("I", list("ABCDEFGHIJ"), "I"),
    ("I think it's H.", list("ABCDEFGHIJ"), "H"),
    ("I am not sure.", list("ABCDEFGHIJ"), None),
    ("Answer: C", ["A", "B"], None),  # letter beyond a 2-option question
    ("A/A/A/A", ABCD, "A"),  # Table 12, 4.5's letter leak echoed
    ("a", ["a", "b"], "A"),  # valid letters are case-insensitive
])
def test_regex_stage_other_letter_sets(response, letters, expected):
    assert extract_letter_regex(response, letters) == expected


def test_regex_rejects_bad_valid_letters():
    with pytest.raises(ValueError):
        extract_letter_regex("A", ["AB"])
    with pytest.raises(ValueError):
        extract_letter_regex("A", [])


@pytest.mark.parametrize("response,expected", [
    ("I'm sorry, but I can't help with identifying people in images.", True),
    ("I cannot determine the answer from the provided image.", True),
    ("I am unable to view the video.", True),
    ("Unable to determine the correct option.", True),
    ("The answer cannot be determined from the information given.", True),
    ("I don't know.", True),
    ("There is not enough information in the image to answer.", True),
    ("As an AI, I do not make judgements about people.", True),
    ("I can't accurately determine that.", True),
    ("B", False),
    ("The answer is C.", False),
    ("The scene is balanced, which is why C is correct.", False),
    ("", False),
    (None, False),
])
def test_is_refusal(response, expected):
    assert is_refusal(response) is expected


# --------------------------------------------------------------------------------------
# Stage 2 with a deterministic fake model
# --------------------------------------------------------------------------------------

class FakeMLLM(MLLM):
    """Answers the extraction prompt by literal option-text matching (test double only).

    Reads the last "Options:" block and "Answer:" line of the prompt, outputs the letter of the
    first option whose text occurs in the answer (or contains it), the refusal code if the prompt offers one and
    the answer apologises, the no-match code otherwise. ``style`` changes how the output looks.
    """

    name = "fake-extractor"
    supports_images = False

    def __init__(self, style: str = "letter"):
        self.style = style
        self.prompts: list[Prompt] = []
        self.calls = 0

    def generate(self, prompts, max_new_tokens=16):
        self.calls += 1
        outs = []
        for p in prompts:
            self.prompts.append(p)
            assert not p.images
            tail = p.text.rsplit("Now it is your turn:", 1)[1]
            opts = re.findall(r"^([A-Z])\. (.+)$", tail.split("Answer:")[0], flags=re.M)
            answer = re.search(r"^Answer: (.*)$", tail, flags=re.M).group(1).lower()
            no_match = re.search(r"matches none of the options, output (\w+)\.", p.text).group(1)
            refusal = re.search(r"cannot tell or does not know .*?output (\w+)\.", p.text)
            if refusal and ("sorry" in answer or "can't" in answer):
                out = refusal.group(1)
            else:
                out = next((L for L, t in opts if t.lower() in answer or answer in t.lower()), no_match)
            if self.style == "sentence":
                out = f"The matching option is {out}."
            elif self.style == "garbage":
                out = "hmm"
            outs.append(out)
        return outs

    def option_logits(self, prompts, candidates):
        raise NotImplementedError

    def loglikelihood(self, prompts, continuations):
        raise NotImplementedError


Q = MCQuestion(dataset="mmmu-pro", question_id="q1", question="What design element best describes the visuals?",
               options=["Composition", "Perspective", "Balance", "Shape"], answer=2)


def test_extraction_prompt_fig7_and_fig8():
    p7 = build_extraction_prompt(Q.question, Q.options, "It shows balance.", ABCD)
    assert "Question: What design element best describes the visuals?" in p7
    assert "A. Composition\nB. Perspective\nC. Balance\nD. Shape" in p7
    assert p7.rstrip().endswith("Answer: It shows balance.\nYour output:")
    assert "output Y" in p7 and "X" not in p7.replace("Example", "")
    p8 = build_extraction_prompt(Q.question, Q.options, "Sorry.", ABCD, refusal_aware=True)
    assert "output X" in p8 and "Your output: X" in p8
    # codes never collide with option letters
    p26 = build_extraction_prompt("q", [str(i) for i in range(26)], "r", [chr(65 + i) for i in range(26)], True)
    assert "output NONE" in p26 and "output REFUSED" in p26


def test_stage2_resolves_option_text():
    m = FakeMLLM()
    assert extract_letter_model("I believe the design shows balance between both halves.", Q, None, ABCD, m) == "C"
    assert extract_letter_model("Something unrelated", Q.question, Q.options, ABCD, m) is None
    assert m.calls == 2


def test_stage2_output_parsed_with_stage1():
    assert extract_letter_model("It is about shape", Q, None, ABCD, FakeMLLM("sentence")) == "D"
    assert extract_letter_model("It is about shape", Q, None, ABCD, FakeMLLM("garbage")) is None


def test_extract_answer_regex_stage_does_not_call_model():
    m = FakeMLLM()
    r = extract_answer("Answer: C", Q, ABCD, model=m)
    assert r == ExtractionResult("C", "regex", False, None)
    assert r.is_correct("C") and not r.is_correct("B")
    assert m.calls == 0


def test_extract_answer_model_stage():
    m = FakeMLLM()
    r = extract_answer("The picture is all about perspective.", Q, ABCD, model=m)
    assert (r.letter, r.stage, r.refusal, r.model_output) == ("B", "model", False, "B")


def test_extract_answer_failure_is_kept_and_incorrect():
    r = extract_answer("The sky is blue.", Q, ABCD, model=FakeMLLM())
    assert (r.letter, r.stage, r.refusal) == (None, "failed", False)
    assert not r.is_correct("C")
    r = extract_answer("The sky is blue.", Q, ABCD)  # no stage-2 model
    assert (r.letter, r.stage) == (None, "failed")
    m = FakeMLLM()
    r = extract_answer("", Q, ABCD, model=m)
    assert r.stage == "failed" and m.calls == 0


def test_extract_answer_refusals():
    m = FakeMLLM()
    r = extract_answer("I'm sorry, but I can't help with that.", Q, ABCD, model=m)
    assert (r.letter, r.stage, r.refusal) == (None, "refusal", True)
    assert m.calls == 0  # caught by the refusal heuristic before stage 2
    # Fig. 8 code from the model
    r = extract_answer("Sorry - no.", Q, ABCD, model=m)
    assert (r.stage, r.refusal, r.model_output) == ("refusal", True, "X")
    # Fig. 7 pipeline (refusals=False): everything unresolved is a failure
    r = extract_answer("I'm sorry, but I can't help with that.", Q, ABCD, model=m, refusals=False)
    assert (r.stage, r.refusal) == ("failed", False)
    assert "output X" not in m.prompts[-1].text
    # a refusal phrase next to a letter is still an answer
    r = extract_answer("I'm not sure, but I think it's C.", Q, ABCD, model=m)
    assert (r.letter, r.stage) == ("C", "regex")


def test_extract_answer_with_added_options():
    m = FakeMLLM()
    extra = ["Not sure (if you genuinely do not know the answer).",
             "Evidence not sufficient to answer (if the question cannot be answered based on the given image(s)).",
             "I’ll answer later (if you prefer to delay your decision)."]
    r = extract_answer("evidence not sufficient to answer", Q, A_TO_G, model=m, options=list(Q.options) + extra)
    assert (r.letter, r.stage) == ("F", "model")
    assert "G. I’ll answer later" in m.prompts[-1].text


def test_extract_answer_stages_of_mixed_responses():
    """Many responses run as the Promptception extraction stage (batched; test_promptception_extraction checks it
    gives these same results); one by one, each lands in its stage."""
    responses = ["B", "The picture is all about perspective.", "The sky is blue.", "I'm sorry, I can't.",
                 "shape, clearly", "Answer: E"]
    got = [extract_answer(r, Q, ABCD, model=FakeMLLM()) for r in responses]
    assert [r.stage for r in got] == ["regex", "model", "failed", "refusal", "model", "failed"]


# --- optional option-text matching (VLMEvalKit's can_infer_text), off by default -------------------------
from mmfragile.studies.promptception.answers import match_option_text  # noqa: E402


@pytest.mark.parametrize("response,expected", [
    ("The colour of the star is black.", "B"),
    ("It is RED, clearly.", "A"),
    ("The colour of the star is indeed black or gray.", None),   # two options named
    ("I cannot tell.", None),
    ("", None),
    ("blackish", None),                                           # whole words only
])
def test_match_option_text(response, expected):
    assert match_option_text(response, ["red", "black", "gray"], ["A", "B", "C"]) == expected


def test_match_text_is_a_separate_opt_in_stage():
    q = "What is the colour of the star?"
    opts = ["red", "black", "gray"]
    assert extract_answer("The star is black.", q, "ABC", options=opts).stage == "failed"
    r = extract_answer("The star is black.", q, "ABC", options=opts, match_text=True)
    assert (r.letter, r.stage) == ("B", "text")
    # a letter found by the regex still wins
    assert extract_answer("Answer: C (black)", q, "ABC", options=opts, match_text=True).letter == "C"
