"""Benchmark loaders on tiny copies of the published releases (mmfragile.data.fixtures), bad rows included."""
from __future__ import annotations

import base64
import io
import json
import re
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from mmfragile.data import fixtures as fx
from mmfragile.data.images import check_image_bytes, image_field, store_image_bytes
from mmfragile.data.loaders import (MVBENCH_TASKS, load_aokvqa, load_dataset, load_hrbench, load_mme_realworld_lite,
                                    load_mmbench, load_mmmu_pro, load_mmstar, load_mvbench, load_vstar, skipped_rows)
from mmfragile.errors import DataError
from mmfragile.schema import QUESTION_COLUMNS, check_image


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MMFRAGILE_CACHE", str(tmp_path / "cache"))


def _noise_jpeg(size=(512, 512), seed=0) -> bytes:
    arr = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def _mmbench_rows(img: str) -> list[dict]:
    return [{"index": 0, "question": "Colour?", "hint": "", "A": "red", "B": "blue", "C": "green", "D": "",
             "answer": "C", "image": img, "category": "c"},
            {"index": 1, "question": "Shape?", "hint": "Look.", "A": "x", "B": "y", "C": "", "D": "", "answer": "B",
             "image": img, "category": "c"}]


# ---------------------------------------------------------------------------------------------- MMBench
def test_mmbench_realistic_base64_jpeg_loads_as_a_file(tmp_path):
    """Regression: a real-size base64 image was first tried as a path -> OSError 'File name too long'."""
    data = _noise_jpeg()
    assert len(base64.b64encode(data)) > 300_000  # a 512x512 noise JPEG: far beyond any file-name limit
    f = tmp_path / "MMBench_DEV_EN_V11.tsv"
    pd.DataFrame(_mmbench_rows(base64.b64encode(data).decode())).to_csv(f, sep="\t", index=False)
    df = load_dataset(f"mmbench:{f}")
    assert list(df.columns[:8]) == QUESTION_COLUMNS
    assert df.options.tolist() == [["red", "blue", "green"], ["x", "y"]] and df.answer.tolist() == [2, 1]
    assert df.question.tolist() == ["Colour?", "Look.\nShape?"]
    assert df.source_row.tolist() == [0, 1] and set(df.source_file) == {str(f)}
    p = Path(df.images[0][0])
    assert p.read_bytes() == data and Image.open(p).size == (512, 512)
    assert df.images[1] == df.images[0]  # content-addressed: the same image is written once


def test_mmbench_bad_rows_name_file_and_row_and_can_be_skipped(tmp_path):
    good = base64.b64encode(_noise_jpeg((64, 64))).decode()
    truncated = base64.b64encode(_noise_jpeg((64, 64), seed=1)[:600]).decode()
    rows = _mmbench_rows(good) + [
        {**_mmbench_rows(good)[0], "index": 2, "image": good[:100] + "*" + good[101:]},  # not base64
        {**_mmbench_rows(good)[0], "index": 3, "image": truncated},                      # JPEG cut short
        {**_mmbench_rows(good)[0], "index": 4, "answer": "D"},                           # D is empty
        {**_mmbench_rows(good)[0], "index": 5, "C": "", "D": "blue"},                    # a gap in the options
    ]
    f = tmp_path / "mmbench.tsv"
    pd.DataFrame(rows).to_csv(f, sep="\t", index=False)
    with pytest.raises(DataError, match=rf"{f}, row 2 \(index=2\): image field is not valid base64"):
        load_mmbench(f)
    df = load_mmbench(f, skip_bad_rows=True)
    assert df.question_id.tolist() == ["0", "1"]
    bad = skipped_rows(df)
    assert [(b["file"], b["row"]) for b in bad] == [(str(f), 2), (str(f), 3), (str(f), 4), (str(f), 5)]
    assert "not valid base64" in bad[0]["reason"] and "truncated" in bad[1]["reason"].lower()
    assert "answer 'D' is not among" in bad[2]["reason"] and "option C is empty but a later option" in bad[3]["reason"]


def test_mmbench_circular_copies_and_image_references(tmp_path):
    spec = fx.write_mmbench(tmp_path)
    f = Path(spec.split(":", 1)[1])
    main = load_dataset(spec)
    assert main.question_id.tolist() == ["0", "1", "2"] and main.options[2] == ["red", "green"]
    both = load_mmbench(f, circular_copies=True)
    copy = both[both.question_id == "1000000"].iloc[0]
    assert copy.options == ["green", "blue", "yellow", "red"] and copy.answer == 3  # rotated, answer still "red"
    assert copy.images == main.images[0]  # image "0" = the image of the row whose index is 0
    # a reference to a row that comes later in the file is resolved too
    rows = pd.read_csv(f, sep="\t", dtype=str, keep_default_na=False)
    rows = pd.concat([rows.iloc[[3]], rows.iloc[:3]]).assign(index=["5", "0", "1", "2"])
    rows.to_csv(f, sep="\t", index=False)
    assert load_mmbench(f).images[0] == main.images[0]
    rows.assign(image=lambda d: d["image"].where(d["index"] != "5", "7")).to_csv(f, sep="\t", index=False)
    with pytest.raises(DataError, match=r"row 0 \(index=5\): image field '7' names no row"):
        load_mmbench(f)


# ---------------------------------------------------------------------------------------------- A-OKVQA
def test_aokvqa_accepts_the_coco_root_and_the_split_folder(tmp_path):
    spec = fx.write_aokvqa(tmp_path)
    ann = tmp_path / "aokvqa_v1p0_val.json"
    by_root = load_dataset(spec)  # aokvqa:<json>::<coco root>
    assert by_root.images[0] == [str(tmp_path / "coco" / "val2017" / "000000001000.jpg")]
    by_split = load_aokvqa(ann, tmp_path / "coco" / "val2017")
    assert by_split.images.tolist() == by_root.images.tolist()
    assert by_root.answer.tolist() == [0, 1, 2] and by_root.question_id.tolist() == ["q0", "q1", "q2"]
    bad = fx.write_aokvqa(tmp_path / "bad", bad_rows=True)
    with pytest.raises(DataError, match=r"aokvqa_v1p0_val.json, row 3: correct_choice_idx 7"):
        load_dataset(bad)
    df = load_dataset(bad, skip_bad_rows=True)
    assert len(df) == 3 and [r["row"] for r in skipped_rows(df)] == [3, 4]
    assert "image file not found" in skipped_rows(df)[1]["reason"]


# ---------------------------------------------------------------------------------------------- HR-Bench
def test_hrbench_keeps_the_first_cycle_by_default(tmp_path):
    spec = fx.write_hrbench(tmp_path, "4k")
    df = load_dataset(spec)
    assert df.dataset.unique().tolist() == ["hrbench-4k"] and len(df) == 2
    assert df.cycle_category.unique().tolist() == ["cycle1"] and df.category.tolist() == ["single", "cross"]
    every = load_hrbench(spec.split(":", 1)[1], cycles="all")
    assert len(every) == 8
    # the four cycles of a question rotate its options: the correct option text stays the same
    truth = {q: {r.options[r.answer] for r in g.itertuples()} for q, g in every.groupby(every.index % 2)}
    assert all(len(v) == 1 for v in truth.values())
    parquet = fx.write_hrbench(tmp_path / "pq", "8k", fmt="parquet")
    p8 = load_dataset(parquet)
    assert p8.dataset.unique().tolist() == ["hrbench-8k"]
    assert p8[["options", "answer"]].equals(df[["options", "answer"]])
    bad = fx.write_hrbench(tmp_path / "bad", "4k", bad_rows=True)
    with pytest.raises(DataError, match=r"hr_bench_4k.tsv, row 2 \(index=100\): corrupt or unreadable"):
        load_dataset(bad)
    assert [r["row"] for r in skipped_rows(load_dataset(bad, skip_bad_rows=True))] == [2, 3]


def test_n_stops_reading_early(tmp_path):
    spec = fx.write_hrbench(tmp_path, "4k", bad_rows=True)  # bad rows are rows 2 and 3
    assert load_dataset(spec, n=1).question_id.tolist() == ["0"]   # never reaches them
    assert len(load_dataset(spec, n=2, skip_bad_rows=True)) == 2
    with pytest.raises(DataError, match="unknown dataset prefix 'nope'.*mvbench"):
        load_dataset("nope:/x")


# ---------------------------------------------------------------------------------------------- MMStar, V*Bench
def test_mmstar_parquet_and_vlmevalkit_tsv_give_the_same_questions(tmp_path):
    spec = fx.write_mmstar(tmp_path)
    pq = load_dataset(spec)
    assert pq.question[0] == "What colour is the square in the middle?"
    assert pq.options[0] == ["red", "green", "blue", "yellow"] and pq.answer.tolist() == [0, 1, 2]
    rows = [{"index": i, "question": q, **dict(zip("ABCD", o)), "answer": "ABCD"[a], "category": "c",
             "l2-category": "x", "image": base64.b64encode(Path(p[0]).read_bytes()).decode()}
            for i, (q, o, a, p) in enumerate(zip(pq.question, pq.options, pq.answer, pq.images))]
    tsv = tmp_path / "MMStar.tsv"
    pd.DataFrame(rows).to_csv(tsv, sep="\t", index=False)
    t = load_mmstar(tsv)
    assert t[["question", "options", "answer", "images"]].equals(pq[["question", "options", "answer", "images"]])
    bad = load_dataset(fx.write_mmstar(tmp_path / "bad", bad_rows=True), skip_bad_rows=True)
    assert [r["row"] for r in skipped_rows(bad)] == [3, 4] and "no 'Options:' block" in skipped_rows(bad)[0]["reason"]


def test_vstar_reads_only_the_two_benchmark_folders(tmp_path):
    spec = fx.write_vstar(tmp_path)  # also writes OCR/, which is not part of the benchmark
    df = load_dataset(spec)
    assert len(df) == 4 and set(df.category) == {"direct_attributes", "relative_position"}
    assert (df.answer == 0).all() and df.options.map(len).tolist() == [4, 4, 2, 2]
    bad = fx.write_vstar(tmp_path / "b", bad_rows=True)
    with pytest.raises(DataError, match=r"sa_9.json.*image file not found.*sa_9.jpg"):
        load_vstar(Path(bad.split(":", 1)[1]))


# ---------------------------------------------------------------------------------------------- MME-RealWorld-Lite
def test_mme_realworld_lite_tsv_parquet_and_official_json(tmp_path):
    tsv = load_dataset(fx.write_mme_realworld_lite(tmp_path / "t"))
    assert tsv.options[0] == ["red", "green", "blue", "yellow", "The image does not feature the square."]
    assert tsv.options[2] == tsv.options[0]  # full-width brackets "（C）" stripped the same way
    assert tsv.answer.tolist() == [0, 1, 2] and tsv.l2_category[0] == "color"
    pq = load_dataset(fx.write_mme_realworld_lite(tmp_path / "p", fmt="parquet"))
    assert pq[["options", "answer", "images"]].equals(tsv[["options", "answer", "images"]])
    # the official JSON (Question_id, Image, Text, Answer choices, Ground truth) with an image folder
    (tmp_path / "img" / "monitoring").mkdir(parents=True)
    Image.open(tsv.images[1][0]).save(tmp_path / "img" / "monitoring" / "a.jpg")
    recs = [{"Question_id": "perception/monitoring/0001", "Image": "monitoring/a.jpg", "Text": "Colour?",
             "Question Type": "Multiple Choice", "Answer choices": ["(A) red", "(B) green", "(C) blue"],
             "Ground truth": "B", "Task": "Perception", "Subtask": "Monitoring", "Category": "color"}]
    (tmp_path / "MME_RealWorld.json").write_text(json.dumps(recs))
    off = load_mme_realworld_lite(tmp_path / "MME_RealWorld.json", images_dir=tmp_path / "img")
    assert off.options[0] == ["red", "green", "blue"] and off.answer[0] == 1
    assert off.question_id[0] == "perception/monitoring/0001" and off.category[0] == "Perception/Monitoring"
    bad = fx.write_mme_realworld_lite(tmp_path / "b", bad_rows=True)
    with pytest.raises(DataError, match=r"row 3 \(index=3\): option 1 'red' does not start with \(A\)"):
        load_dataset(bad)
    assert [r["row"] for r in skipped_rows(load_dataset(bad, skip_bad_rows=True))] == [3, 4]


# ---------------------------------------------------------------------------------------------- MMMU-Pro
def test_mmmu_pro_settings_keep_markers_and_image_order(tmp_path):
    spec = fx.write_mmmu_pro(tmp_path)
    s4 = load_dataset(spec)
    assert s4.dataset.unique().tolist() == ["mmmu-pro-s4"] and s4.options.map(len).tolist() == [4, 4, 4]
    q = s4.iloc[1]
    assert q.question == "Compare <image 1> and <image 2>: which one shows the colour of <image 2>?"  # as published
    assert q.options[:2] == ["<image 1>", "<image 2>"] and q.modality == "multi-image"
    cells = pd.read_parquet(tmp_path / "standard (4 options)" / "test-00000-of-00001.parquet")
    assert [Path(p).read_bytes() for p in q.images] == [cells.image_1[1]["bytes"], cells.image_2[1]["bytes"]]
    # images named only in the options are kept too, in image_k order
    assert len(s4.images[2]) == 2 and s4.answer.tolist() == [0, 1, 2]
    s10 = load_dataset(f"mmmu-pro:{tmp_path / 'standard (10 options)'}")  # setting from the folder name
    assert s10.dataset[0] == "mmmu-pro-s10" and s10.options.map(len).tolist() == [10, 10, 10]
    vis = load_dataset(spec.replace("-s4:", "-vision:"))
    assert vis.question.tolist() == ["", "", ""] and vis.options_in_image.all() and vis.images.map(len).eq(1).all()
    bad = fx.write_mmmu_pro(tmp_path / "bad", bad_rows=True)
    shard = tmp_path / "bad" / "standard (4 options)" / "test-00000-of-00001.parquet"
    msg = rf"{re.escape(str(shard))}, row 3 \(index=test_Art_9\): the text names <image 3>"
    with pytest.raises(DataError, match=msg):
        load_dataset(bad)
    skipped = skipped_rows(load_dataset(bad, skip_bad_rows=True))
    assert [(r["file"], r["row"]) for r in skipped] == [(str(shard), 3), (str(shard), 4)]
    assert "image_1 is empty but image_2 is not" in skipped[1]["reason"]


def test_mmmu_pro_json_with_image_folder(tmp_path):
    """The layout the Promptception authors released (Datasets/MMMU-Pro/*.json + an image folder)."""
    (tmp_path / "imgs").mkdir()
    for k in (1, 2):
        fx.noise_image(k).save(tmp_path / "imgs" / f"t_{k}.png")
    recs = [{"id": "test_History_1", "question": "Which trend does <image 1> show, compared to <image 2>?",
             "options": ["a", "b", "c", "d"], "explanation": "?", "image_1": "t_1.png", "image_2": "t_2.png",
             **{f"image_{k}": None for k in range(3, 8)}, "img_type": "['Diagrams']", "answer": "B",
             "topic_difficulty": "Medium", "subject": "History"}]
    f = tmp_path / "MMMU-Pro_standard_4options.json"
    f.write_text(json.dumps(recs))
    df = load_mmmu_pro(f, images_dir=tmp_path / "imgs")
    assert df.dataset[0] == "mmmu-pro-s4" and df.images[0] == [str(tmp_path / "imgs" / f"t_{k}.png") for k in (1, 2)]
    with pytest.raises(DataError, match="cannot tell the MMMU-Pro setting"):
        load_mmmu_pro(tmp_path / "imgs" / "t_1.png")


# ---------------------------------------------------------------------------------------------- MVBench
def test_mvbench_all_twenty_tasks(tmp_path):
    spec = fx.write_mvbench(tmp_path)
    df = load_dataset(spec)
    assert df.category.tolist() == list(MVBENCH_TASKS) and (df.modality == "video").all()
    assert df.question_id[0] == "action_sequence/0"
    for r in df.itertuples():
        prefix, dtype, bounded = MVBENCH_TASKS[r.category]
        assert Path(r.images[0]).exists() and prefix in r.images[0]
        assert r.video_type == dtype and (r.video_start == 1.0 if bounded else np.isnan(r.video_start))
        cands = json.loads((tmp_path / "json" / f"{r.category}.json").read_text())[0]
        assert r.options[r.answer] == cands["answer"]
    ep = df.set_index("category").loc["episodic_reasoning"]
    assert Path(ep.images[0]).is_dir() and ep.video_fps == 3.0 and ep.video_end == 3.0
    assert "data0613" in df.set_index("category").loc["moving_count"].images[0]  # CLEVRER as the HF zip unpacks
    assert load_mvbench(tmp_path, tasks=["state_change"]).question_id.tolist() == ["state_change/0"]
    (tmp_path / "json" / "scene_transition.json").unlink()
    with pytest.raises(DataError, match=r"missing task file\(s\) \['scene_transition.json'\]"):
        load_mvbench(tmp_path)


def test_mvbench_bad_rows(tmp_path):
    spec = fx.write_mvbench(tmp_path, bad_rows=True)
    jf = tmp_path / "json" / "action_antonym.json"
    with pytest.raises(DataError, match=rf"{jf}, row 1: video not found: .*missing_clip.webm"):
        load_dataset(spec)
    df = load_dataset(spec, skip_bad_rows=True)
    assert [(r["file"], r["row"]) for r in skipped_rows(df)] == [(str(jf), 1), (str(jf), 2)]
    assert "answer 'not a candidate' is not among the options" in skipped_rows(df)[1]["reason"]
    assert "unexpected_action/1" in set(df.question_id)  # a broken video file loads; decoding it fails later


# ---------------------------------------------------------------------------------------------- large images
def test_8k_images_pass_without_the_decompression_bomb_guard(tmp_path, monkeypatch):
    big = Image.new("RGB", (7680, 4320), (40, 90, 200))
    buf = io.BytesIO()
    big.save(buf, format="JPEG", quality=80)
    data = buf.getvalue()
    del big
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no DecompressionBombWarning either
        p = store_image_bytes(data, "row 0", "hr")
        check_image(p)
    assert Image.open(p).size == (7680, 4320)
    # an image above PIL's limit is still valid input: the loaders check integrity, not size
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    assert check_image_bytes(_noise_jpeg((64, 64)), "w") == "jpeg"
    check_image(p)
    assert Image.MAX_IMAGE_PIXELS == 1000  # lifted only inside the check
    with pytest.raises(DataError, match="w: corrupt or unreadable embedded image"):
        check_image_bytes(data[: len(data) // 3], "w")


def test_image_field_forms(tmp_path):
    png = tmp_path / "a.png"
    fx.noise_image(0).save(png)
    b = png.read_bytes()
    assert image_field("a.png", tmp_path, "w", "d") == [str(png)]
    assert image_field(str(png), None, "w", "d") == [str(png)]
    from_bytes = image_field({"bytes": b, "path": None}, None, "w", "d")
    assert Path(from_bytes[0]).read_bytes() == b
    assert image_field(base64.b64encode(b).decode(), None, "w", "d") == from_bytes
    two = image_field(str([base64.b64encode(b).decode()] * 2), None, "w", "d")  # VLMEvalKit multi-image cell
    assert two == from_bytes * 2
    assert image_field(None, None, "w", "d") == [] and image_field("", None, "w", "d") == []
    with pytest.raises(DataError, match="w: image field is not valid base64"):
        image_field("x" * 70 + "?", None, "w", "d")


def test_a_studys_own_data_loads_through_its_record_and_is_refused_as_a_question_table(tmp_path):
    """Benchmark.load on the judge release's record raised TypeError (it called the study's loader with a
    question-table loader's arguments); it now gives the study's records, as the built-in judge set's record
    does, and load_dataset still refuses both in one line naming the command that reads them."""
    from mmfragile.data.benchmarks import benchmark
    from mmfragile.studies.judgebias.data import JudgeSample, load_judge_dataset

    release = benchmark("mm-judgebias")
    spec = release.write_fixture(tmp_path / "release")
    samples = release.load(spec.partition(":")[2], n=2)
    assert samples and all(isinstance(s, JudgeSample) for s in samples)
    assert [s.sample_id for s in samples] == [s.sample_id for s in load_judge_dataset(spec, n=2)]
    built = benchmark("easy-vqa-judge").load(n=2, seed=0, out_dir=tmp_path / "judge")
    assert len(built) >= 2 and all(isinstance(s, JudgeSample) for s in built)
    with pytest.raises(TypeError, match="skipped="):
        release.load(spec.partition(":")[2], n=2, skip_bad_rows=True)
    for name in (spec, "easy-vqa-judge"):
        with pytest.raises(DataError, match=r"judge study's data.*python -m mmfragile run judge --dataset "):
            load_dataset(name, n=2)
