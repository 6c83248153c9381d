"""Embedded datasets and real-benchmark loaders, on tiny fixtures made here."""
from __future__ import annotations

import base64
import io
import json

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from mmfragile.data.easyvqa import load_easy_vqa
from mmfragile.data.loaders import (load_aokvqa, load_dataset, load_generic, load_mmbench, load_mmstar, load_vstar,
                                    parse_inline_options)
from mmfragile.data.synthetic import make_synthetic_vqa
from mmfragile.errors import DataError
from mmfragile.schema import QUESTION_COLUMNS


def _png_bytes(colour=(255, 0, 0), size=(8, 8)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format="PNG")
    return buf.getvalue()


def test_synthetic_is_deterministic_and_varied(tmp_path):
    a = make_synthetic_vqa(3, tmp_path / "a")
    b = make_synthetic_vqa(3, tmp_path / "b")
    c = make_synthetic_vqa(4, tmp_path / "c")
    cols = ["question_id", "question", "options", "answer"]
    pd.testing.assert_frame_equal(a[cols], b[cols])
    assert not a[cols].equals(c[cols])
    # same image bytes from the same seed
    for pa, pb in zip(a.images, b.images):
        assert [open(x, "rb").read() for x in pa] == [open(x, "rb").read() for x in pb]
    assert set(a.options.map(len)) == {2, 3, 4, 5}
    assert set(a.modality) == {"image", "text", "multi-image", "video"}
    assert (a[a.modality == "text"].images.map(len) == 0).all()
    assert (a[a.modality == "multi-image"].images.map(len) >= 2).all()
    assert (a[a.modality == "video"].images.map(len) == 6).all()
    assert all(0 <= r.answer < len(r.options) for r in a.itertuples())


def test_synthetic_answers_match_the_picture(tmp_path):
    """The 'shape' question asks which shape has a colour: that colour's pixels must be in the image."""
    from mmfragile.data.synthetic import COLOURS

    df = make_synthetic_vqa(0, tmp_path)
    for r in df[df.category == "shape"].itertuples():
        colour = r.question.split()[-1].rstrip("?")
        arr = np.asarray(Image.open(r.images[0]))
        assert (arr == np.array(COLOURS[colour])).all(-1).sum() > 20
    for r in df[df.category == "count"].itertuples():
        assert r.options[r.answer] in ("one", "two", "three", "four")


def test_easy_vqa_multiple_choice():
    df = load_easy_vqa(n=300, seed=1)
    assert len(df) == 300 and list(df.columns[:8]) == QUESTION_COLUMNS
    assert df.options.map(len).between(2, 5).all()
    yn = df[df.category == "yes/no"]
    assert (yn.options.map(sorted) == pd.Series([["no", "yes"]] * len(yn), index=yn.index)).all()
    assert (df[df.category == "shape"].options.map(len) <= 3).all()
    assert load_easy_vqa(n=50, seed=1).question_id.tolist() != load_easy_vqa(n=50, seed=2).question_id.tolist()


def test_aokvqa_loader_and_errors(tmp_path):
    coco = tmp_path / "val2017"
    coco.mkdir()
    (coco / "000000000042.jpg").write_bytes(_png_bytes())
    recs = [{"question_id": "q1", "question": "What?", "choices": ["a", "b", "c", "d"], "correct_choice_idx": 2, "image_id": 42}]
    ann = tmp_path / "aokvqa_v1p0_val.json"
    ann.write_text(json.dumps(recs))
    df = load_aokvqa(ann, coco)
    assert df.loc[0, "answer"] == 2 and df.loc[0, "images"][0].endswith("000000000042.jpg")
    recs.append({"question_id": "q2", "question": "Why?", "choices": ["x", "y"], "correct_choice_idx": 5, "image_id": 42})
    ann.write_text(json.dumps(recs))
    with pytest.raises(DataError, match=r"row 1.*correct_choice_idx 5"):
        load_aokvqa(ann, coco)
    recs[1] = {"question_id": "q2", "question": "Why?", "choices": ["x", "y"], "correct_choice_idx": 0, "image_id": 7}
    ann.write_text(json.dumps(recs))
    with pytest.raises(DataError, match=r"row 1.*image file not found.*000000000007.jpg"):
        load_aokvqa(ann, coco)


def test_mmbench_tsv_base64_and_bad_answer(tmp_path, monkeypatch):
    monkeypatch.setenv("MMFRAGILE_CACHE", str(tmp_path / "cache"))
    img = base64.b64encode(_png_bytes()).decode()
    rows = [
        {"index": 0, "question": "Colour?", "hint": "", "A": "red", "B": "blue", "C": "", "D": "", "answer": "A", "image": img, "category": "c"},
        {"index": 1, "question": "Shape?", "hint": "Look.", "A": "x", "B": "y", "C": "z", "D": "", "answer": "C", "image": img, "category": "c"},
    ]
    f = tmp_path / "mmbench.tsv"
    pd.DataFrame(rows).to_csv(f, sep="\t", index=False)
    df = load_mmbench(f)
    assert df.options.tolist() == [["red", "blue"], ["x", "y", "z"]]
    assert df.answer.tolist() == [0, 2] and df.question[1] == "Look.\nShape?"
    assert Image.open(df.images[0][0]).size == (8, 8)
    rows[1]["answer"] = "D"  # D is empty: not among the options
    pd.DataFrame(rows).to_csv(f, sep="\t", index=False)
    with pytest.raises(DataError, match=r"row 1 \(index=1\): answer 'D' is not among"):
        load_mmbench(f)
    rows[1]["answer"] = "A"
    # (a cell of <= 64 characters would name another row's index - VLMEvalKit's rule - so the payload is longer)
    rows[1]["image"] = base64.b64encode(b"not an image " * 8).decode()
    pd.DataFrame(rows).to_csv(f, sep="\t", index=False)
    with pytest.raises(DataError, match=r"row 1.*corrupt"):
        load_mmbench(f)


def test_mmstar_parquet(tmp_path, monkeypatch):
    monkeypatch.setenv("MMFRAGILE_CACHE", str(tmp_path / "cache"))
    df = pd.DataFrame([{"index": 7, "question": "Which animal?\nOptions: A: cat, B: dog, C: cow", "answer": "B",
                        "image": _png_bytes(), "category": "coarse perception", "l2_category": "x"}])
    f = tmp_path / "mmstar.parquet"
    df.to_parquet(f)
    out = load_mmstar(f)
    assert out.loc[0, "question"] == "Which animal?" and out.loc[0, "options"] == ["cat", "dog", "cow"]
    assert out.loc[0, "answer"] == 1 and out.loc[0, "question_id"] == "7"
    assert parse_inline_options("Q\nOptions: A. 1, B. 2", "w")[1] == ["1", "2"]
    with pytest.raises(DataError, match="no 'Options:'"):
        parse_inline_options("Q only", "w")


def test_vstar_folder_correct_option_first(tmp_path):
    for task in ("direct_attributes", "relative_position"):
        d = tmp_path / task
        d.mkdir()
        Image.new("RGB", (16, 16)).save(d / "sa_1.jpg")
        (d / "sa_1.json").write_text(json.dumps({"image": "sa_1.jpg", "question": "What colour?", "options": ["red", "blue", "green", "white"]}))
    df = load_vstar(tmp_path)
    assert len(df) == 2 and (df.answer == 0).all() and set(df.category) == {"direct_attributes", "relative_position"}


def test_generic_loader_text_answers_and_corrupt_image(tmp_path):
    (tmp_path / "ok.png").write_bytes(_png_bytes())
    (tmp_path / "bad.png").write_bytes(b"\x89PNG garbage")
    recs = [{"question_id": "a", "question": "Q1", "options": ["yes", "no"], "answer": "no", "image": "ok.png"},
            {"question_id": "b", "question": "Q2", "options": ["1", "2", "3"], "answer": 1, "image": None}]
    f = tmp_path / "d.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in recs))
    df = load_generic(f)
    assert df.answer.tolist() == [1, 1] and df.modality.tolist() == ["image", "text"]
    recs[0]["answer"] = "maybe"
    f.write_text("\n".join(json.dumps(r) for r in recs))
    with pytest.raises(DataError, match=r"row 0: answer 'maybe' is not among the options"):
        load_generic(f)
    recs[0]["answer"] = "no"
    recs[0]["image"] = "bad.png"
    f.write_text("\n".join(json.dumps(r) for r in recs))
    with pytest.raises(DataError, match=r"row 0.*corrupt or unreadable image.*bad.png"):
        load_generic(f)
    # HF datasets on-disk style: a folder of parquet shards
    shard = tmp_path / "hf" / "data"
    shard.mkdir(parents=True)
    pd.DataFrame([{"question": "Q", "options": ["a", "b"], "answer": 0, "image": {"bytes": _png_bytes(), "path": None}}]).to_parquet(shard / "test-00000.parquet")
    assert len(load_generic(tmp_path / "hf", dataset="hf")) == 1


def test_load_dataset_specs():
    assert set(load_dataset("synthetic-text").modality) == {"text"}
    with pytest.raises(DataError, match="unknown dataset"):
        load_dataset("nope")
