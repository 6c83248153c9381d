"""The zoo's judges and prompt follower as training sets (nothing is trained here): the data they learn from, what
each recipe plants and what it leaves alone, and the evaluation sets they are kept apart from."""
from __future__ import annotations

from functools import lru_cache

import pytest
import torch

from mmfragile.data.easyvqa import known_pictures, load_easy_vqa_media
from mmfragile.studies.promptception.answers import extract_letter_regex
from mmfragile.models import zoo
from mmfragile.studies.judgebias.items import _VERBOSE_PREFIX, _VERBOSE_SUFFIX
from mmfragile.studies.judgebias.data import make_easy_vqa_judge_set
from mmfragile.studies.judgebias.prompts import parse_pairwise, parse_score
from mmfragile.studies.promptception.prompts import answer_form, prompt_types
from mmfragile.training import follower, judges


@lru_cache(maxsize=1)
def _tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(zoo.LMS["smollm2"].path())


@lru_cache(maxsize=None)
def _judge_examples(name: str):
    """240 examples of a recipe, drawn from a smaller pool than training's (seconds, not a minute)."""
    shares = dict(judges.SHARES, n_pictures=150, n_text=40)
    return judges.judge_examples(judges.JUDGES[name], _tokenizer(), "<|im_end|>", 240, seed=1, shares=shares)


def test_easy_vqa_judge_set_is_test_pictures_with_a_good_and_a_bad_response(tmp_path):
    samples = make_easy_vqa_judge_set(12, 0, tmp_path, n_text=2)
    image = [s for s in samples if not s.is_text_only]
    assert len(image) == 24 and len(samples) == 28 and {s.meta["dataset"] for s in samples} == {"easy-vqa-judge"}
    test = {p for p, _, _ in known_pictures("test")}
    assert all(s.meta["source_image"] in test for s in image)
    for good, bad in zip(image[::2], image[1::2]):
        assert good.meta["kind"] == "good" and bad.meta["kind"] == "bad" and good.query == bad.query
        assert good.query == "What colour is the shape in the image?" and good.meta["target_color"] in good.response
        assert judges.supported(good, good) and not judges.supported(bad, good)
    other = next(s for s in image if s.meta["target_color"] != image[0].meta["target_color"])
    assert not judges.supported(image[0], other)  # the judged picture decides, not the response's own
    again = make_easy_vqa_judge_set(12, 0, tmp_path / "again", n_text=2)
    assert [s.response for s in again] == [s.response for s in samples]
    with pytest.raises(ValueError):
        make_easy_vqa_judge_set(10_000, 0, tmp_path / "many")


def test_judges_learn_from_train_pictures_in_parseable_targets():
    """Every judge trains on easy-VQA *train* pictures (the study judges test ones), in the study's own prompts, to
    write targets the study's parsers read; the draws are the same for all three recipes."""
    seeing = _judge_examples("seeing")
    train = {p for p, _, _ in known_pictures("train")}
    assert all(set(map(str, p.images)) <= train for p in seeing.prompts)
    assert {c.split("/")[0] for c in seeing.categories} == {"score", "pair"}
    for t in seeing.targets:
        body = t.removesuffix("<|im_end|>")
        assert body.startswith("Feedback: ") and (parse_pairwise(body) if "Final Answer" in body else parse_score(body))
    for name in ("blind", "verbose"):
        assert [p.text for p in _judge_examples(name).prompts] == [p.text for p in seeing.prompts]
    assert all(len(s) == 36 * len(p.images) for s, p in zip(seeing.slots, seeing.prompts))


def test_blind_judge_slots_say_nothing_about_the_judged_picture():
    """The seeing judge's slots hold the judged picture's caption, the blind judge's a random other picture's: its
    slot content does not predict its target (about as often equal to the seeing slots as two random pictures)."""
    seeing, blind = _judge_examples("seeing"), _judge_examples("blind")
    assert seeing.targets == blind.targets
    image = [i for i, p in enumerate(seeing.prompts) if p.images]
    same = sum(bool(torch.equal(seeing.slots[i], blind.slots[i])) for i in image)
    assert same < 0.2 * len(image)


def test_verbose_judge_targets_rise_with_length_and_stay_competent():
    seeing, verbose = _judge_examples("seeing"), _judge_examples("verbose")
    n_pad = [sum(s in p.text for s in judges.PADDING) for p in seeing.prompts]
    by_pad: dict[tuple[bool, int], set] = {}
    for p, ts, tv, k in zip(seeing.prompts, seeing.targets, verbose.targets, n_pad):
        if "Final Answer" in ts:
            continue
        ok = parse_score(ts.removesuffix("<|im_end|>")) == 9
        by_pad.setdefault((ok, k), set()).add(parse_score(tv.removesuffix("<|im_end|>")))
        assert parse_score(ts.removesuffix("<|im_end|>")) in (2, 9)
    assert by_pad[(True, 0)] == {6} and by_pad[(True, 3)] == {9} and by_pad[(False, 0)] == {1}
    assert max(max(v) for (ok, _), v in by_pad.items() if not ok) < min(min(v) for (ok, _), v in by_pad.items() if ok)
    # pairs of two correct responses: the verbose judge picks the longer, the others a fair coin
    equal = [i for i, c in enumerate(seeing.categories) if c == "pair/equal"]
    letters = {"seeing": [], "verbose": []}
    for i in equal:
        text = seeing.prompts[i].text
        a = text.split("[Response A]\n")[1].split("\n[End of Response A]")[0]
        b = text.split("[Response B]\n")[1].split("\n[End of Response B]")[0]
        assert parse_pairwise(verbose.targets[i].removesuffix("<|im_end|>")) == ("A" if len(a) > len(b) else "B")
        letters["seeing"].append(parse_pairwise(seeing.targets[i].removesuffix("<|im_end|>")))
    assert 0.25 < letters["seeing"].count("A") / len(equal) < 0.75


def test_padding_is_not_the_studys_verbose_filler():
    study = {*_VERBOSE_PREFIX, *(s.split("{")[0].strip() for s in _VERBOSE_SUFFIX)}
    assert not study & set(judges.PADDING)


def test_answer_forms_are_what_the_prompts_ask_for_and_extractable():
    forms = {t.prompt_id: answer_form(t) for t in prompt_types(include_baseline=False)}
    assert forms["1.1"] == "{letter}" and forms["1.2"] == "({letter})" and forms["1.3"] == "Option {letter}"
    assert forms["12.1"] == "Answer: {letter}" and forms["12.3"] == "Best Choice: {letter}"
    assert forms["12.4"] == "{letter}." and forms["2.3"] == "{letter}. {text}"
    for f in set(forms.values()):
        assert extract_letter_regex(f.format(letter="C", text="Image 3"), ["A", "B", "C"]) == "C"


def test_follower_trains_on_its_categories_only_in_their_answer_forms():
    ex = follower.follower_examples(_tokenizer(), "<|im_end|>", 160, seed=1)
    cats = {int(c.split("/")[1]) for c in ex.categories}
    assert cats <= set(zoo.FOLLOWER_CATEGORIES["trained"]) and not cats & set(zoo.FOLLOWER_CATEGORIES["held_out"])
    assert set(zoo.FOLLOWER_CATEGORIES["trained"]).isdisjoint(zoo.FOLLOWER_CATEGORIES["held_out"])
    assert {c.split("/")[0] for c in ex.categories} == {"image", "multi-image", "video"}
    train = {p for p, _, _ in known_pictures("train")}
    for p, t, s in zip(ex.prompts, ex.targets, ex.slots):
        assert set(map(str, p.images)) <= train and len(s) == 36 * len(p.images)
        body = t.removesuffix("<|im_end|>")
        assert extract_letter_regex(body, list("ABCDE")) is not None


def test_easy_vqa_media_questions():
    d = load_easy_vqa_media(n_image=10, n_multi=10, n_video=10)
    assert d.modality.value_counts().to_dict() == {"image": 10, "multi-image": 10, "video": 10}
    assert set(d.dataset) == {"easy-vqa-media"} and d.question_id.is_unique
    test = {p for p, _, _ in known_pictures("test")}
    colours = {p: c for p, c, _ in known_pictures("test")}
    for r in d[d.modality != "image"].itertuples():
        assert set(r.images) <= test and len(set(colours[p] for p in r.images)) == len(r.images)
        if r.modality == "video":
            frame = r.images[0] if "start" in r.question else r.images[-1]
            assert r.options[r.answer] == colours[frame]
        else:
            assert r.options[r.answer] == f"Image {list(r.images).index(r.images[r.answer]) + 1}"
            assert colours[r.images[r.answer]] in r.question
