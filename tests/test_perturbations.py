"""The nine MM-JudgeBias perturbations (Table 1 / Table 11): pure, seeded, auditable."""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from PIL import Image, ImageDraw

from mmfragile.models.base import MLLM, Prompt
from mmfragile.studies.judgebias.perturbations import (
    AESTHETIC_OPS,
    GEOMETRIC_OPS,
    PERTURBATION_INFO,
    PERTURBATIONS,
    UNPERTURBED,
    JudgeSample,
    PerturbationError,
    apply_perturbation,
    detail_description,
    heuristic_keyword,
    image_dominance,
    image_misalignment,
    image_sha256,
    instruction_misalignment,
    load_perturbed,
    model_captioner,
    model_keyword_extractor,
    model_relevance_checker,
    response_dominance,
    save_perturbed,
    text_dominance,
    texture_insertion,
    unnecessary_image,
    visual_transformation,
)


def _img(color, size=(64, 48), mode="RGB", mark=(10, 10)):
    im = Image.new("RGB", size, color)
    ImageDraw.Draw(im).rectangle([mark[0], mark[1], mark[0] + 12, mark[1] + 9], fill=(20, 20, 20))
    return im.convert(mode) if mode != "RGB" else im


def _sample(i, color=(200, 60, 60), **kw):
    return JudgeSample(sample_id=f"s{i}", query=f"What is shown in picture {i}?", images=[_img(color)],
                       response=f"Response {i}.", gold_score=7.0, meta={"item_id": f"item{i}", **kw})


@pytest.fixture
def pool():
    colors = [(200, 60, 60), (60, 200, 60), (60, 60, 200), (220, 220, 40), (150, 40, 160)]
    out = [_sample(i, c) for i, c in enumerate(colors)]
    out.append(JudgeSample("t0", "What is 2 + 3?", [], "5", 9.0, {"item_id": "t0"}))
    return out


def _snapshot(s: JudgeSample):
    return (s.sample_id, s.query, s.response, s.gold_score, copy.deepcopy(s.meta),
            [(im.mode, im.size, im.tobytes()) for im in s.images], [id(im) for im in s.images])


ALL_OPTIONS = {"detail_description": {"captioner": lambda im: "A red rectangle with a dark mark."}}


def test_registry_is_the_nine_of_table_1():
    assert list(PERTURBATIONS) == [
        "text_dominance", "image_dominance", "response_dominance", "instruction_misalignment",
        "image_misalignment", "detail_description", "unnecessary_image", "visual_transformation",
        "texture_insertion"]
    assert set(PERTURBATION_INFO) == set(PERTURBATIONS)
    assert [k for k, v in PERTURBATION_INFO.items() if v["metric"] == "BD"] == list(PERTURBATIONS)[:5]


def test_names_agree_with_the_judgebias_metrics():
    from mmfragile.studies.judgebias import metrics as jb

    assert tuple(PERTURBATIONS) == jb.PERTURBATIONS and UNPERTURBED == jb.REFERENCE
    assert {k: v["metric"] for k, v in PERTURBATION_INFO.items()} == jb.METRIC_OF
    assert {k: v["dimension"] for k, v in PERTURBATION_INFO.items()} == jb.DIMENSION_OF
    assert {k: v["label"] for k, v in PERTURBATION_INFO.items()} == jb.SHORT_NAMES


@pytest.mark.parametrize("name", list(PERTURBATIONS))
def test_input_not_mutated_and_meta_recorded(name, pool):
    s = pool[-1] if name == "unnecessary_image" else pool[0]
    before = _snapshot(s)
    pool_before = [_snapshot(p) for p in pool]
    out = apply_perturbation(name, s, pool, seed=3, **ALL_OPTIONS.get(name, {}))
    assert _snapshot(s) == before
    assert [_snapshot(p) for p in pool] == pool_before
    assert out is not s and out.meta is not s.meta
    assert all(o is not i for o in out.images for i in s.images)
    assert out.meta["perturbation"] == name
    assert isinstance(out.meta["operations"], list) and out.meta["operations"]
    assert out.sample_id == s.sample_id and out.response == s.response and out.gold_score == s.gold_score
    assert "perturbation" not in s.meta
    json.dumps(out.meta)  # auditable: the record is plain JSON


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_text_dominance_black_same_size_and_mode(mode):
    s = JudgeSample("a", "q?", [_img((200, 100, 50), size=(37, 23), mode=mode)], "r")
    out = text_dominance(s)
    (im,) = out.images
    assert im.mode == mode and im.size == (37, 23)
    assert not np.asarray(im).any()
    assert out.query == "q?"
    assert out.meta["operations"] == [{"op": "replace_image_black", "image": 0, "size": [37, 23], "mode": mode}]


def test_text_dominance_rgba_is_opaque_black():
    s = JudgeSample("a", "q?", [_img((200, 100, 50), mode="RGBA")], "r")
    a = np.asarray(text_dominance(s).image)
    assert (a[..., :3] == 0).all() and (a[..., 3] == 255).all()


def test_image_and_response_dominance(pool):
    s = pool[1]
    o = image_dominance(s)
    assert o.query == "" and o.images[0].tobytes() == s.images[0].tobytes()
    r = response_dominance(s)
    assert r.query == "" and not np.asarray(r.image).any() and r.image.size == s.image.size
    assert [op["op"] for op in r.meta["operations"]] == ["replace_query_empty", "replace_image_black"]


def test_image_perturbations_reject_text_only(pool):
    t = pool[-1]
    for f in (text_dominance, response_dominance, image_misalignment, visual_transformation, texture_insertion):
        with pytest.raises(PerturbationError):
            f(t, pool, 0)
    with pytest.raises(PerturbationError):
        unnecessary_image(pool[0], pool, 0)  # already has an image


def test_instruction_misalignment_never_itself_and_seeded(pool):
    s = pool[2]
    # a sibling (same item, different response) and an exact duplicate query must not be drawn
    sib = JudgeSample("s2-bad", s.query, [s.image.copy()], "bad", 2.0, {"item_id": "item2"})
    dup = JudgeSample("x9", s.query, [_img((1, 2, 3))], "r", None, {"item_id": "other"})
    big = pool + [sib, dup]
    donors = set()
    for seed in range(60):
        out = instruction_misalignment(s, big, seed)
        assert out.query != s.query
        d = out.meta["operations"][0]["from_sample"]
        assert d not in (s.sample_id, "s2-bad", "x9")
        assert out.query == next(p.query for p in big if p.sample_id == d)
        assert out.images[0].tobytes() == s.images[0].tobytes()
        donors.add(d)
    # image tasks take image tasks' queries (the text-only t0 is never used while others exist)
    assert donors == {"s0", "s1", "s3", "s4"}
    a = instruction_misalignment(s, big, 11)
    b = instruction_misalignment(s, list(reversed(big)), 11)  # pool order does not matter
    assert a.query == b.query and a.meta == b.meta
    with pytest.raises(PerturbationError):
        instruction_misalignment(s, [s, sib], 0)


def test_image_misalignment_never_itself_and_seeded(pool):
    s = pool[0]
    twin = JudgeSample("twin", "other q", [s.image.copy()], "r", None, {"item_id": "elsewhere"})
    big = pool + [twin]
    seen = set()
    for seed in range(60):
        out = image_misalignment(s, big, seed)
        d = out.meta["operations"][0]["from_sample"]
        assert d not in ("s0", "twin", "t0")
        assert image_sha256(out.image) != image_sha256(s.image)
        assert out.image.tobytes() == next(p for p in big if p.sample_id == d).image.tobytes()
        assert out.query == s.query
        seen.add(d)
    assert seen == {"s1", "s2", "s3", "s4"}
    assert image_misalignment(s, big, 5).image.tobytes() == image_misalignment(s, big, 5).image.tobytes()
    with pytest.raises(PerturbationError):
        image_misalignment(s, [s, twin], 0)


def test_detail_description_uses_captioner(pool):
    s = pool[0]
    calls = []

    def fake(im):
        calls.append((im.size, im is s.image))
        return "  A red rectangle with a small dark mark in the top-left corner. "

    out = detail_description(s, captioner=fake)
    assert calls == [((64, 48), False)]  # called once, on a copy
    assert out.query == ("What is shown in picture 0?\n\nDetailed description of the image: "
                         "A red rectangle with a small dark mark in the top-left corner.")
    assert out.images[0].tobytes() == s.images[0].tobytes() and out.response == s.response
    assert out.meta["operations"][0]["caption"].startswith("A red rectangle")
    with pytest.raises(PerturbationError):
        detail_description(s)  # no captioner
    with pytest.raises(PerturbationError):
        detail_description(s, captioner=lambda im: "  ")


class _FakeMLLM(MLLM):
    name = "fake"

    def __init__(self, reply):
        self.reply, self.prompts = reply, []

    def generate(self, prompts, max_new_tokens=16):
        self.prompts.extend((p, max_new_tokens) for p in prompts)
        return [self.reply for _ in prompts]

    def option_logits(self, prompts, candidates):
        raise NotImplementedError

    def loglikelihood(self, prompts, continuations):
        raise NotImplementedError


def test_model_callables_prompt_the_mllm(pool):
    m = _FakeMLLM(" A red card. ")
    cap = model_captioner(m, max_new_tokens=77)
    assert cap(pool[0].image) == "A red card."
    (p, n), = m.prompts
    assert isinstance(p, Prompt) and len(p.images) == 1 and n == 77
    assert p.text.startswith("Generate a detailed description of the image.")
    k = _FakeMLLM('Keyword: "red card"\nbecause ...')
    assert model_keyword_extractor(k)("What colour is the card?", pool[0].image) == "red card"
    assert model_relevance_checker(_FakeMLLM("False."))("q", pool[0].image) is False
    assert model_relevance_checker(_FakeMLLM("True"))("q", pool[0].image) is True


def test_unnecessary_image_adds_exactly_one(pool):
    t = pool[-1]
    out = unnecessary_image(t, pool, seed=4)
    assert len(t.images) == 0 and len(out.images) == 1
    op = out.meta["operations"][0]
    donor = next(p for p in pool if p.sample_id == op["from_sample"])
    assert out.image.tobytes() == donor.images[op["image_index"]].tobytes()
    assert out.query == t.query and out.response == t.response
    assert unnecessary_image(t, pool, 4).image.tobytes() == out.image.tobytes()
    # a relevance filter redraws while the image is judged related
    related = {"s0", "s1", "s2"}
    filt = unnecessary_image(t, pool, 4, relevance_checker=lambda q, im: bool(
        [p for p in pool[:5] if p.image.tobytes() == im.tobytes()][0].sample_id in related))
    assert filt.meta["operations"][0]["from_sample"] in {"s3", "s4"}
    with pytest.raises(PerturbationError):
        unnecessary_image(t, pool, 4, relevance_checker=lambda q, im: True)


def test_visual_transformation_reproducible_and_composition(pool):
    s = pool[3]
    a = visual_transformation(s, seed=7)
    b = visual_transformation(s, seed=7)
    assert a.image.tobytes() == b.image.tobytes() and a.image.size == b.image.size
    assert a.meta["operations"] == b.meta["operations"]
    c = visual_transformation(s, seed=8)
    assert (a.image.size, a.image.tobytes()) != (c.image.size, c.image.tobytes())
    assert a.meta["operations"] != c.meta["operations"]
    n_geo_seen, k_seen = set(), set()
    for seed in range(40):
        ops = visual_transformation(s, seed=seed).meta["operations"]
        geo = [o for o in ops if o["family"] == "geometric"]
        aes = [o for o in ops if o["family"] in ("photometric", "quality", "spatial")]
        assert len(geo) == 1 and geo[0]["op"] in GEOMETRIC_OPS
        assert 7 <= len(aes) <= 9 and len(aes) + 1 == len(ops)
        assert len({o["op"] for o in aes}) == len(aes) and all(o["op"] in AESTHETIC_OPS for o in aes)
        assert ops[0]["family"] == "geometric"
        if geo[0]["op"] == "random_rotation":
            assert -7 <= geo[0]["angle"] <= 7
        for o in aes:
            if o["op"] == "jpeg_roundtrip":
                assert 65 <= o["quality"] <= 88
        n_geo_seen.add(geo[0]["op"])
        k_seen.add(len(aes))
    assert n_geo_seen == set(GEOMETRIC_OPS) and k_seen == {7, 8, 9}


def test_visual_transformation_same_seed_different_samples_differ(pool):
    # one global seed still gives each sample its own draw (the stream is keyed by sample_id)
    seqs = {tuple(o["op"] for o in visual_transformation(p, seed=1).meta["operations"]) for p in pool[:5]}
    assert len(seqs) == 5


def test_single_ops_match_pillow_by_hand():
    im = _img((120, 130, 140))
    rng = np.random.default_rng(0)
    out, p = GEOMETRIC_OPS["mirror"](im, rng)
    assert np.array_equal(np.asarray(out), np.asarray(im)[:, ::-1])
    out, p = GEOMETRIC_OPS["rotate180"](im, rng)
    assert np.array_equal(np.asarray(out), np.asarray(im)[::-1, ::-1])
    out, p = AESTHETIC_OPS["white_padding"][1](im, rng)
    pad = p["pad"]
    assert out.size == (64 + 2 * pad, 48 + 2 * pad)
    a = np.asarray(out)
    assert (a[:pad] == 255).all() and np.array_equal(a[pad:pad + 48, pad:pad + 64], np.asarray(im))
    out, p = AESTHETIC_OPS["gamma"][1](im, rng)
    g = p["gamma"]
    assert out.getpixel((0, 0))[0] == round(255 * (120 / 255) ** g)


def test_texture_insertion_geometry_and_pixels(pool):
    s = pool[1]
    orig = s.image
    out = texture_insertion(s, seed=0, text_source="query")
    im = out.image
    w, h = orig.size
    assert im.width == w and im.height > h
    assert np.array_equal(np.asarray(im)[:h], np.asarray(orig))  # top: original pixels untouched
    bottom = np.asarray(im)[h:]
    assert (bottom != 255).any(axis=-1).sum() > 50  # box + text, not just white background
    # the box is semi-transparent black over white, with white text inside it
    vals = {tuple(v) for v in bottom.reshape(-1, 3)}
    box = tuple([255 - round(255 * 170 / 255)] * 3)
    assert box in vals and (255, 255, 255) in vals
    op = out.meta["operations"][0]
    assert op["content"] == "query" and op["text"] == s.query and op["new_size"] == [w, im.height]
    kw = texture_insertion(s, seed=0, text_source="keyword", keyword_extractor=lambda q, im: "picture")
    assert kw.meta["operations"][0]["text"] == "picture" and kw.image.height < im.height + 1
    assert texture_insertion(s, seed=0, text_source="keyword").meta["operations"][0]["text_from"] == "heuristic"


def test_texture_insertion_random_source_is_seeded_and_both_occur(pool):
    s = pool[0]
    srcs = [texture_insertion(s, seed=k).meta["operations"][0]["content"] for k in range(30)]
    assert set(srcs) == {"keyword", "query"}
    a, b = texture_insertion(s, seed=5), texture_insertion(s, seed=5)
    assert a.image.tobytes() == b.image.tobytes()


def test_texture_insertion_long_text_wraps_inside_width():
    s = JudgeSample("L", "word " * 60 + "Supercalifragilisticexpialidocious" * 3, [_img((9, 9, 9), size=(80, 40))], "r")
    out = texture_insertion(s, seed=0, text_source="query")
    assert out.image.width == 80 and out.meta["operations"][0]["n_lines"] > 5


def test_heuristic_keyword():
    assert heuristic_keyword("How many red triangles are there in the image?") == "triangles"
    assert heuristic_keyword("What is the capital?") == "capital"


def test_apply_perturbation_names_and_original(pool):
    s = pool[0]
    assert apply_perturbation("Image-Dominance", s).query == ""
    n = apply_perturbation("none", s)
    assert n.meta["perturbation"] == "original" and n.image.tobytes() == s.image.tobytes()
    assert apply_perturbation("original", s).meta == n.meta and s.perturbation == "original"
    with pytest.raises(KeyError):
        apply_perturbation("position_bias", s)


def test_chained_perturbation_keeps_history(pool):
    a = visual_transformation(pool[0], seed=1)
    b = text_dominance(a)
    assert b.meta["perturbation"] == "text_dominance"
    assert b.meta["history"][0]["perturbation"] == "visual_transformation"


def test_save_perturbed_roundtrip(tmp_path, pool):
    out = visual_transformation(pool[0], seed=2)
    path = save_perturbed(out, tmp_path)
    assert path == tmp_path / "s0__visual_transformation.json"
    rec = json.loads(path.read_text())
    assert rec["images"] == ["s0__visual_transformation.png"] and rec["meta"]["operations"] == out.meta["operations"]
    with Image.open(tmp_path / rec["images"][0]) as im:
        assert im.tobytes() == out.image.tobytes()
    back = load_perturbed(path)
    assert back.image.tobytes() == out.image.tobytes() and back.query == out.query
    assert back.meta["perturbation"] == "visual_transformation"
    # the saved PNG is byte-identical for the same seed
    p2 = save_perturbed(visual_transformation(pool[0], seed=2), tmp_path / "again")
    assert (tmp_path / "again" / rec["images"][0]).read_bytes() == (tmp_path / rec["images"][0]).read_bytes()
    assert p2.name == path.name
    # text-only samples get a sidecar without PNG
    t = save_perturbed(image_dominance(pool[-1]), tmp_path / "t")
    assert json.loads(t.read_text())["images"] == [] and not list((tmp_path / "t").glob("*.png"))
