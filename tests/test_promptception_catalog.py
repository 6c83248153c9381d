"""Promptception prompt catalog (Appendix A Table 5, Table 1, Sec. 3, Sec. 4.2.1) and rendering."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from mmfragile.paths import seed_missing, seed_path

import pytest

from mmfragile.studies.promptception.prompts import (
    BASELINE_ID,
    CATALOG_PATH,
    PromptType,
    RenderedPrompt,
    get_prompt_type,
    load_catalog,
    prompt_ids,
    render,
)
from mmfragile.errors import DataError
from mmfragile.schema import MCQuestion

REPO = Path(__file__).resolve().parents[1]
SEED = seed_path("promptception.txt")

# Sec. 4.2.1, copied by hand from the paper
POSITIVE = ["2.3", "2.4", "2.5", "2.6", "2.7", "2.8", "2.9", "6.1", "6.2", "6.3", "6.4", "9.1", "10.1", "10.2",
            "11.4", "11.5", "13.1", "13.2", "13.3", "13.4", "14.1", "14.2", "14.3", "15.1", "15.2", "15.3"]
NEUTRAL = ["1.1", "1.2", "1.3", "2.1", "2.2", "3.1", "3.2", "5.1", "8.1", "8.2", "8.3", "8.4",
           "12.1", "12.2", "12.3", "12.4", "12.5"]
NEGATIVE = ["4.1", "4.2", "4.3", "4.4", "4.5", "5.2", "5.3", "7.1", "7.2", "7.3", "7.4", "7.5", "7.6",
            "9.2", "9.3", "11.1", "11.2", "11.3"]

Q4 = MCQuestion(dataset="mmmu-pro", question_id="ex", question="What design element best describes the visuals?",
                options=["Composition", "Perspective", "Balance", "Shape"], answer=2)
Q3 = MCQuestion(dataset="mvbench", question_id="v3", question="What did the person do first?",
                options=["Sat down", "Stood up", "Waved"], answer=0, modality="video")
Q7 = MCQuestion(dataset="mmmu-pro", question_id="s7", question="Which value is correct?",
                options=["1", "2", "3", "4", "5", "6", "7"], answer=6, modality="multi-image")

BASELINE_TEXT = ("What design element best describes the visuals?\nA. Composition\nB. Perspective\nC. Balance\n"
                 "D. Shape\nAnswer with the option letter from the given choices directly.")


@pytest.fixture(scope="module")
def cat():
    return load_catalog(include_baseline=False)


def test_counts(cat):
    assert len(cat) == 61
    assert cat["prompt_id"].is_unique
    assert cat["category"].nunique() == 15 and sorted(cat["category"].unique()) == list(range(1, 16))
    assert cat["supercategory"].nunique() == 6
    assert cat["category_name"].nunique() == 15
    assert cat.groupby("category").size().to_dict() == {1: 3, 2: 9, 3: 2, 4: 5, 5: 3, 6: 4, 7: 6, 8: 4, 9: 3,
                                                        10: 2, 11: 5, 12: 5, 13: 4, 14: 3, 15: 3}
    assert list(cat["supercategory_name"].unique()) == [
        "Choice Formatting and Presentation", "Linguistic and Stylistic Challenges", "Thought Process and Reasoning",
        "Context-Aware and Ethical Guidance", "Task-Specific Instructions", "Performance, Feedback, and Penalty"]
    # categories 1-3, 4-5, 6-7, 8-10, 11-12, 13-15 (Table 1 / Table 5)
    sup = cat.groupby("category")["supercategory"].first().to_dict()
    assert sup == {1: 1, 2: 1, 3: 1, 4: 2, 5: 2, 6: 3, 7: 3, 8: 4, 9: 4, 10: 4, 11: 5, 12: 5, 13: 6, 14: 6, 15: 6}


def test_ids_and_names(cat):
    ids = list(cat["prompt_id"])
    assert ids[:4] == ["1.1", "1.2", "1.3", "2.1"] and ids[-1] == "15.3"
    assert "12.3" in ids and "7.6" in ids
    assert prompt_ids()[0] == BASELINE_ID and len(prompt_ids()) == 62
    names = dict(zip(cat["prompt_id"], cat["name"]))
    assert names["7.5"] == "Acknowledged Complexity Response"
    assert names["11.4"] == "Observation-Driven Analysis"
    assert names["9.2"] == "Act as a Careless Student"
    cats = dict(zip(cat["category"], cat["category_name"]))
    assert cats[2] == "Structured Formatting" and cats[12] == "Answer Handling"
    desc = dict(zip(cat["category"], cat["category_description"]))
    assert desc[9] == "Assigning specific personas."
    assert desc[15] == "Framing the task as a competition or challenge."


def test_intents_match_section_4_2_1(cat):
    intents = dict(zip(cat["prompt_id"], cat["intent"]))
    assert sorted(p for p, i in intents.items() if i == "positive") == sorted(POSITIVE)
    assert sorted(p for p, i in intents.items() if i == "neutral") == sorted(NEUTRAL)
    assert sorted(p for p, i in intents.items() if i == "negative") == sorted(NEGATIVE)
    assert cat["intent"].value_counts().to_dict() == {"positive": 26, "negative": 18, "neutral": 17}
    assert load_catalog().set_index("prompt_id").loc["baseline", "intent"] is None


def test_placement_categories_2_and_3(cat):
    pl = dict(zip(cat["prompt_id"], cat["placement"]))
    assert pl["3.1"] == "before" and pl["3.2"] == "middle"
    assert {pl[p] for p in cat["prompt_id"] if p.startswith("2.")} == {"structured"}
    assert {pl[p] for p in cat["prompt_id"] if not p.startswith(("2.", "3."))} == {"after"}
    t31 = render("3.1", Q4).text.split("\n")
    assert t31[0] == "Answer with the option letter from the given choices directly."
    assert t31[1] == Q4.question and t31[2:] == ["A. Composition", "B. Perspective", "C. Balance", "D. Shape"]
    t32 = render("3.2", Q4).text.split("\n")
    assert t32[:2] == [Q4.question, "Answer with the option letter from the given choices directly."]
    assert t32[2] == "A. Composition"
    assert render("2.2", Q4).text.startswith("Question: What design element best describes the visuals?\nOptions:\nA. ")


def test_baseline_is_fig3_and_equals_1_1():
    assert render("baseline", Q4).text == BASELINE_TEXT
    assert render("1.1", Q4).text == BASELINE_TEXT
    assert render("baseline", Q4, model_kind="proprietary").text == BASELINE_TEXT


def test_rendering_matches_table5_examples():
    # Table 5 prints each prompt with this very question; spot-check a few renderings verbatim
    assert render("1.2", Q4).text.split("\n")[1:5] == ["(A) Composition", "(B) Perspective", "(C) Balance", "(D) Shape"]
    assert render("1.3", Q4).text.split("\n")[1] == "Option A: Composition"
    assert render("4.3", Q4).text.split("\n")[0] == "WHAT DESIGN ELEMENT BEST DESCRIBES THE VISUALS?"
    assert render("4.3", Q4).text.split("\n")[1] == "A. Composition"
    assert render("4.5", Q4).text.endswith("directly (A/A/A/A).")
    assert render("12.3", Q4).text.endswith("D. Shape\nBest Choice: $LETTER")
    t26 = render("2.6", Q4).text
    assert ("Here is the question: What design element best describes the visuals? A. Composition B. Perspective "
            "C. Balance D. Shape. Respond only with: ‘$LETTER’ of the best answer choice.") in t26
    t25 = render("2.5", Q4, modality="image").text
    assert t25.split("\n")[0] == "TASK: Analyze the image(s) and pick the best option."


def test_open_vs_proprietary_variants():
    o = render("6.1", Q4, model_kind="open").text
    p = render("6.1", Q4, model_kind="proprietary").text
    assert o.endswith("Think step by step before answering. Respond only with: ‘$LETTER’ of the best answer choice.")
    assert p.endswith("The last line of your response should be of the following format: ’Answer: LETTER’ "
                      "(without quotes) where LETTER is one of the options.")
    assert render("12.1", Q4, model_kind="open").text == render("12.1", Q4, model_kind="proprietary").text
    # Appendix J: no "$" for GPT-4o, but the $100 tip stays
    t = render("14.1", Q4, model_kind="open", omit_dollar=True).text
    assert "$LETTER" not in t and "‘LETTER’" in t and "$100" in t
    with pytest.raises(ValueError):
        render("1.1", Q4, model_kind="closed")


def test_video_wording():
    img = render("7.1", Q4, modality="image").text
    vid = render("7.1", Q4, modality="video").text
    assert "Based on our analysis of the image(s), there is a 25% chance" in img
    assert "Based on our analysis of the video, there is a 25% chance" in vid
    assert "image" not in vid.replace(Q4.question, "")
    assert "Analyze the given video and understand its content." in render("2.3", Q4, modality="video").text
    assert "based on the video, you often overlook" in render("9.2", Q4, modality="video").text
    assert "based on images, you often overlook" in render("9.2", Q4, modality="image").text
    assert "contextual content of the video and question" in render("10.2", Q4, modality="video").text
    assert "contextual content of the image(s) and question" in render("10.2", Q4, modality="image",
                                                                       model_kind="proprietary").text
    # modality defaults to the question's own; multi-image uses the image wording
    assert "analysis of the video" in render("7.1", Q3).text
    assert "analysis of the image(s)" in render("7.1", Q7).text
    for pid in prompt_ids(modality="video"):
        assert "image(s)" not in render(pid, Q3).text, pid
        assert "image(s)" not in render(pid, Q3, model_kind="proprietary").text, pid


def test_video_only_prompts():
    assert "11.4" in prompt_ids(modality="video") and "11.4" not in prompt_ids(modality="image")
    assert len(prompt_ids(include_baseline=False, modality="image")) == 59
    assert len(prompt_ids(include_baseline=False, modality="video")) == 61
    assert "chronological order" in render("11.5", Q3).text
    with pytest.raises(DataError, match="ex"):
        render("11.4", Q4, modality="image")


@pytest.mark.parametrize("q", [Q3, Q4, Q7], ids=["3opts", "4opts", "7opts"])
def test_render_every_prompt_any_option_count(q):
    n = len(q.options)
    letters = tuple("ABCDEFG"[:n])
    for pid in prompt_ids(modality=q.modality):
        for kind in ("open", "proprietary"):
            r = render(pid, q, model_kind=kind)
            assert isinstance(r, RenderedPrompt)
            text, valid = r
            assert text == r.text and valid == r.valid_letters
            assert r.option_letters == letters and r.answer_letter == letters[q.answer]
            assert q.question in text or q.question.upper() in text or json.dumps(q.question) in text
            assert "<QUESTION" not in text and "<OPTIONS" not in text and "<VISUAL" not in text
            assert "<EXTRA_OPTIONS>" not in text
            last = letters[-1]
            assert f"{last}. {q.options[-1]}" in text or f"({last}) {q.options[-1]}" in text \
                or f"Option {last}: {q.options[-1]}" in text
            if pid == "7.6":
                assert r.extra_letters == tuple("ABCDEFGHIJ"[n:n + 3])
                assert valid == letters + r.extra_letters
                assert len(r.options) == n + 3
            else:
                assert valid == letters and r.extra_letters == ()


def test_7_6_adds_not_sure_options_after_last_letter():
    r = render("7.6", Q4)
    assert r.valid_letters == tuple("ABCDEFG") and r.extra_letters == ("E", "F", "G")
    assert "\nE. Not sure (if you genuinely do not know the answer).\n" in r.text
    assert "\nF. Evidence not sufficient to answer (if the question cannot be answered based on the given image(s)).\n" \
        in r.text
    assert "\nG. I’ll answer later (if you prefer to delay your decision).\n" in r.text
    r3 = render("7.6", Q3)
    assert r3.extra_letters == ("D", "E", "F")
    assert "\nD. Not sure" in r3.text and "based on the given video)." in r3.text
    q10 = MCQuestion("mmmu-pro", "s10", "Q?", [f"o{i}" for i in range(10)], 3)
    assert render("7.6", q10).extra_letters == ("K", "L", "M")  # as in MMMU-Pro s10


def test_2_9_renders_valid_json_even_with_quotes():
    q = MCQuestion("d", "j", 'Which "word" is it?', ['say "hi"', "b\\c", "x"], 1)
    for kind in ("open", "proprietary"):
        obj = json.loads(render("2.9", q, model_kind=kind).text)
        assert obj["Question"] == 'Which "word" is it?'
        assert obj["Options"] == ['A. say "hi"', "B. b\\c", "C. x"]


def test_impossible_renderings():
    q26 = MCQuestion("d", "q26", "Q?", [f"o{i}" for i in range(26)], 0)
    assert render("1.1", q26).valid_letters[-1] == "Z"
    with pytest.raises(DataError, match="q26"):
        render("7.6", q26)  # 26 + 3 letters
    with pytest.raises(DataError):
        render("1.1", MCQuestion("d", "q27", "Q?", [f"o{i}" for i in range(27)], 0))
    with pytest.raises(DataError):
        render("1.1", MCQuestion("d", "q1", "Q?", ["only"], 0))
    with pytest.raises(KeyError):
        render("16.1", Q4)


def test_prompt_type_and_to_prompt():
    pt = get_prompt_type("13.1")
    assert isinstance(pt, PromptType) and pt.intent == "positive" and pt.category == 13
    assert pt.instruction(modality="video").startswith("**Warning:** An **incorrect answer**")
    assert "Carefully examine all details in the video" in pt.instruction(modality="video")
    q = MCQuestion("d", "i", "Q?", ["a", "b"], 1, images=["images/x.png"])
    p = render("1.1", q).to_prompt()
    assert p.images == ["images/x.png"] and p.text.startswith("Q?\nA. a\nB. b\n")


@pytest.mark.skipif(SEED is None, reason=seed_missing("promptception.txt"))
def test_catalog_file_is_reproducible_from_seed(tmp_path):
    out = tmp_path / "catalog.json"
    subprocess.run([sys.executable, str(REPO / "scripts" / "extract_promptception_catalog.py"), "--seed", str(SEED),
                    "--out", str(out)], check=True, capture_output=True)
    assert json.loads(out.read_text(encoding="utf-8")) == json.loads(CATALOG_PATH.read_text(encoding="utf-8"))
