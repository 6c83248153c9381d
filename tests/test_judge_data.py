"""Synthetic judge set and the judge-data loader (MM-JudgeBias study)."""
from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
from PIL import Image

from mmfragile.studies.judgebias.data import COLORS, MANIFEST_NAME, SHAPES, load_judge_dir, make_judge_set
from mmfragile.studies.judgebias.perturbations import PERTURBATIONS, apply_perturbation, save_perturbed
from mmfragile.errors import DataError


def _png_bytes(d):
    return {p.name: p.read_bytes() for p in sorted((d / "images").glob("*.png"))}


def test_make_judge_set_is_deterministic(tmp_path):
    a = make_judge_set(6, 123, tmp_path / "a")
    b = make_judge_set(6, 123, tmp_path / "b")
    c = make_judge_set(6, 124, tmp_path / "c")
    assert len(a) == 2 * 6 + 2 * 2  # good+bad per scene, default n_text = max(2, n // 4)
    assert [(s.sample_id, s.query, s.response, s.gold_score) for s in a] == \
           [(s.sample_id, s.query, s.response, s.gold_score) for s in b]
    assert [s.image.tobytes() if s.images else b"" for s in a] == [s.image.tobytes() if s.images else b"" for s in b]
    assert [s.image.tobytes() if s.images else b"" for s in a] != [s.image.tobytes() if s.images else b"" for s in c]
    assert _png_bytes(tmp_path / "a") == _png_bytes(tmp_path / "b")
    assert (tmp_path / "a" / MANIFEST_NAME).read_bytes() == (tmp_path / "b" / MANIFEST_NAME).read_bytes()
    assert _png_bytes(tmp_path / "a") != _png_bytes(tmp_path / "c")


def test_make_judge_set_content(tmp_path):
    samples = make_judge_set(12, 0, tmp_path, n_text=3)
    img = [s for s in samples if s.images]
    txt = [s for s in samples if not s.images]
    assert len(img) == 24 and len(txt) == 6
    for good, bad in zip(samples[0::2], samples[1::2]):
        assert good.meta["item_id"] == bad.meta["item_id"] and good.query == bad.query
        assert good.meta["kind"] == "good" and bad.meta["kind"] == "bad"
        assert (good.gold_score, bad.gold_score) == (9.0, 2.0)
        assert good.response != bad.response
        assert good.meta["perturbation"] == "original"
    for s in img[0::2]:
        m = s.meta
        assert s.image.size == (256, 256) and s.image.mode == "RGB"
        assert m["target_shape"] in SHAPES and m["target_color"] in COLORS
        objs = m["objects"]
        if m["question_type"] == "count":
            assert sum(o["shape"] == m["target_shape"] and o["color"] == m["target_color"] for o in objs) == m["count"]
            assert f" {m['count']} {m['target_color']} " in s.response
        elif m["question_type"] == "color":  # the asked shape is unique and has the answered colour
            (o,) = [o for o in objs if o["shape"] == m["target_shape"]]
            assert o["color"] == m["target_color"] and s.response.endswith(f"is {o['color']}.")
        else:
            (o,) = [o for o in objs if o["color"] == m["target_color"]]
            assert o["shape"] == m["target_shape"] and s.response.endswith(f"a {o['shape']}.")
        # the drawn pixel at each object's centre has its colour (scene really matches the facts)
        for o in objs:
            x, y = (int(round(v)) for v in o["center"])
            assert s.image.getpixel((x, y)) == COLORS[o["color"]]
    qtypes = {s.meta["question_type"] for s in img}
    assert qtypes == {"count", "color", "shape"}


def test_synthetic_set_supports_all_perturbations(tmp_path):
    samples = make_judge_set(4, 1, tmp_path)
    img, txt = samples[0], next(s for s in samples if not s.images)
    for name in PERTURBATIONS:
        target = txt if name == "unnecessary_image" else img
        opts = {"captioner": lambda im: "shapes on a background"} if name == "detail_description" else {}
        out = apply_perturbation(name, target, samples, seed=0, **opts)
        assert out.meta["perturbation"] == name
        if name in ("instruction_misalignment", "image_misalignment", "unnecessary_image"):
            donor = out.meta["operations"][0]["from_item"]
            assert donor != target.meta["item_id"]  # never the sibling with the other response


def test_loader_roundtrip_of_synthetic_set(tmp_path):
    samples = make_judge_set(5, 7, tmp_path)
    back = load_judge_dir(tmp_path)
    assert len(back) == len(samples)
    for s, b in zip(samples, back):
        assert (s.sample_id, s.query, s.response, s.gold_score) == (b.sample_id, b.query, b.response, b.gold_score)
        assert [im.tobytes() for im in s.images] == [im.tobytes() for im in b.images]
        extra = {"source_file", "source_row"}
        assert {k: v for k, v in b.meta.items() if k not in extra} == s.meta
        assert b.meta["source_file"] == str(tmp_path / MANIFEST_NAME)
    lazy = load_judge_dir(tmp_path / MANIFEST_NAME, load_images=False)
    assert all(not s.images for s in lazy)
    assert lazy[0].meta["image_paths"] == samples[0].meta["image_paths"]
    assert lazy[0].load_images().image.tobytes() == samples[0].image.tobytes()


def _tiny_folder(tmp_path):
    d = tmp_path / "bench"
    (d / "imgs").mkdir(parents=True)
    Image.new("RGB", (8, 6), (255, 0, 0)).save(d / "imgs" / "a.png")
    Image.new("L", (5, 5), 128).save(d / "imgs" / "b.png")
    recs = [
        {"id": 1, "instruction": "What colour is it?", "image": "imgs/a.png", "response": "Red.", "score": 9,
         "task_type": "General", "domain_type": "Art"},
        {"question_id": "q2", "query": "Is it grey?", "images": ["imgs/b.png", "imgs/a.png"], "answer": "Yes.",
         "rating": "3.5"},
        {"query": "What is 2+2?", "response": "4", "image": None},
    ]
    (d / "data.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n\n")
    return d


def test_loader_flat_records_and_aliases(tmp_path):
    d = _tiny_folder(tmp_path)
    s1, s2, s3 = load_judge_dir(d)
    assert (s1.sample_id, s1.query, s1.response, s1.gold_score) == ("1", "What colour is it?", "Red.", 9.0)
    assert s1.image.getpixel((0, 0)) == (255, 0, 0) and s1.image.size == (8, 6)
    assert s1.meta["task_type"] == "General" and s1.meta["domain_type"] == "Art"
    assert s1.meta["image_paths"] == [str((d / "imgs" / "a.png").resolve())]
    assert s1.meta["source_row"] == 0 and s1.meta["perturbation"] == "original"
    assert s2.sample_id == "q2" and s2.gold_score == 3.5 and [im.mode for im in s2.images] == ["L", "RGB"]
    assert s3.images == [] and s3.gold_score is None and s3.sample_id == "data-2"


def test_loader_errors_name_file_and_row(tmp_path):
    d = _tiny_folder(tmp_path)
    (d / "imgs" / "b.png").unlink()
    with pytest.raises(DataError, match=r"data\.jsonl, row 1 \(line 2\).*'images'\[0\].*not found.*b\.png"):
        load_judge_dir(d)

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"query": "q", "response": "r"}, {"query": "q2"}]))
    with pytest.raises(DataError, match=r"bad\.json, row 1: missing field 'response'"):
        load_judge_dir(bad)
    bad.write_text(json.dumps([{"query": "q", "response": "r", "score": "high"}]))
    with pytest.raises(DataError, match=r"bad\.json, row 0: field 'score' must be a number"):
        load_judge_dir(bad)
    bad.write_text(json.dumps({"data": [{"sample_id": "x", "query": "q", "response": "r"},
                                        {"sample_id": "x", "query": "q", "response": "r"}]}))
    with pytest.raises(DataError, match=r"row 1: duplicate sample_id 'x'"):
        load_judge_dir(bad)
    Image.new("RGB", (4, 4)).save(tmp_path / "ok.png")
    (tmp_path / "broken.png").write_bytes(b"not a png")
    bad.write_text(json.dumps([{"query": "q", "response": "r", "image": "broken.png"}]))
    with pytest.raises(DataError, match=r"bad\.json, row 0.*corrupt or unreadable"):
        load_judge_dir(bad)
    with pytest.raises(DataError, match="no such file"):
        load_judge_dir(tmp_path / "nope")


def _paired_record(i, bias, unb_img, b_img, **kw):
    rec = {"id": i, "bias_type": bias, "bias_category": "robustness", "task_type": "General",
           "domain_type": "Art", "difficulty": "Hard", "unbiased_source": "COCO", "biased_source": "COCO",
           "response": "A cat.", "unbiased_instruction": "What animal is it?",
           "biased_instruction": "What animal is it?", "unbiased_image": unb_img, "biased_image": b_img}
    rec.update(kw)
    return rec


def test_loader_paired_mm_judgebias_records(tmp_path):
    d = tmp_path / "mmjb"
    (d / "images").mkdir(parents=True)
    Image.new("RGB", (6, 6), (1, 2, 3)).save(d / "images" / "u.png")
    buf = io.BytesIO()
    Image.new("RGB", (6, 6), (0, 0, 0)).save(buf, format="PNG")
    inline = {"bytes": base64.b64encode(buf.getvalue()).decode(), "path": None}
    restricted = tmp_path / "rebuilt"
    restricted.mkdir()
    Image.new("RGB", (3, 3), (9, 9, 9)).save(restricted / "0007_unbiased.jpg")
    Image.new("RGB", (3, 3), (0, 0, 0)).save(restricted / "0007_biased.jpg")
    recs = [
        _paired_record(3, "text_dominance", "u.png", inline),
        _paired_record(5, "unnecessary_image", None, {"path": "u.png"}),
        _paired_record(6, "image_dominance", "u.png", "u.png", biased_instruction=""),
        _paired_record(7, "visual_transformation", None, None),
    ]
    (d / "test.json").write_text(json.dumps(recs))
    out = load_judge_dir(d, images_dir=restricted)
    assert [(s.sample_id, s.perturbation) for s in out] == [
        ("3", "original"), ("3", "text_dominance"), ("5", "original"), ("5", "unnecessary_image"),
        ("6", "original"), ("6", "image_dominance"), ("7", "original"), ("7", "visual_transformation")]
    assert not np.asarray(out[1].image).any() and out[0].image.getpixel((0, 0)) == (1, 2, 3)
    assert out[2].images == [] and len(out[3].images) == 1
    assert out[5].query == "" and out[4].query == "What animal is it?"
    assert out[6].image.size == (3, 3) and out[6].meta["image_paths"][0].endswith("0007_unbiased.jpg")
    assert all(s.gold_score is None and s.response == "A cat." for s in out)
    assert out[1].meta["role"] == "biased" and out[1].meta["task_type"] == "General"

    # a restricted-source null cell with no reconstructed file is an error naming file and row
    with pytest.raises(DataError, match=r"test\.json, row 3: field 'unbiased_image' is empty"):
        load_judge_dir(d)
    assert len(load_judge_dir(d, strict_images=False)) == 8
    (d / "test.json").write_text(json.dumps([_paired_record(1, "text_dominance", "missing.png", "u.png")]))
    with pytest.raises(DataError, match=r"test\.json, row 0, field 'unbiased_image': image file not found"):
        load_judge_dir(d)
    rec = _paired_record(1, "text_dominance", "u.png", "u.png")
    del rec["biased_instruction"]
    (d / "test.json").write_text(json.dumps([rec]))
    with pytest.raises(DataError, match=r"test\.json, row 0: missing field\(s\) \['biased_instruction'\]"):
        load_judge_dir(d)


def test_loader_reads_save_perturbed_sidecars_and_checks_hashes(tmp_path):
    samples = make_judge_set(3, 2, tmp_path / "set")
    outs = [apply_perturbation(n, samples[0], samples, seed=1) for n in ("text_dominance", "visual_transformation")]
    paths = [save_perturbed(o, tmp_path / "audit") for o in outs]
    back = load_judge_dir(tmp_path / "audit")
    assert sorted(b.perturbation for b in back) == ["text_dominance", "visual_transformation"]
    for o in outs:
        (b,) = [b for b in back if b.perturbation == o.perturbation]
        assert b.image.tobytes() == o.image.tobytes() and b.meta["operations"] == o.meta["operations"]
    # tampering with a saved PNG is detected
    png = tmp_path / "audit" / json.loads(paths[1].read_text())["images"][0]
    Image.new("RGB", Image.open(png).size, (1, 1, 1)).save(png)
    with pytest.raises(DataError, match=r"visual_transformation\.json, row 0: image pixels do not match"):
        load_judge_dir(paths[1])
