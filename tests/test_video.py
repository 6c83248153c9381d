"""Video frames decoded with PyAV from tiny real clips (MP4 / WebM / AVI), frame folders, time windows."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from mmfragile.data import fixtures as fx
from mmfragile.data.loaders import load_dataset
from mmfragile.data.video import question_frames, sample_frames, window_indices
from mmfragile.errors import DataError


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MMFRAGILE_CACHE", str(tmp_path / "cache"))


def _grey(path) -> int:
    return int(np.asarray(Image.open(path).convert("L")).mean().round())


def test_window_indices_hand_computed():
    assert window_indices(16, 3, source_fps=4, bound=(1.0, 3.0)) == [4, 8, 12]   # frames 4..12, 3 of 9
    assert window_indices(16, None, source_fps=4, bound=(1.0, 3.0)) == list(range(4, 13))
    assert window_indices(16, 4) == [0, 5, 10, 15]                               # no window: frame_indices
    assert window_indices(10, 3, source_fps=4, bound=(2.0, 9.0)) == [8, 9]        # clipped to the video
    with pytest.raises(ValueError, match="outside the video"):
        window_indices(10, 2, source_fps=4, bound=(5.0, 6.0))
    with pytest.raises(ValueError, match="source frame rate"):
        window_indices(10, 2, bound=(0.0, 1.0))


@pytest.mark.parametrize("suffix", [".mp4", ".webm", ".avi"])
def test_decoded_frames_are_the_sampled_ones(tmp_path, suffix):
    clip = fx.write_video(tmp_path / f"clip{suffix}", n_frames=16, fps=4, seed=1)  # frame i: grey 37 + 25 i
    got = sample_frames(clip, 4, out_dir=tmp_path / "f")
    assert [_grey(p) for p in got] == pytest.approx([(37 + 25 * i) % 256 for i in (0, 5, 10, 15)], abs=4)
    # start/end window in seconds: 1 s - 3 s at 4 fps = frames 4..12
    win = sample_frames(clip, 3, bound=(1.0, 3.0), out_dir=tmp_path / "w")
    assert [_grey(p) for p in win] == pytest.approx([(37 + 25 * i) % 256 for i in (4, 8, 12)], abs=4)
    # 1 fps from a 4 fps clip: every 4th frame
    assert [p.rsplit("_", 1)[1] for p in sample_frames(clip, fps=1, out_dir=tmp_path / "r")] == [
        f"{i:06d}.png" for i in (0, 4, 8, 12)]


def test_frame_folder_with_rate_and_window(tmp_path):
    d = tmp_path / "clip"
    d.mkdir()
    for j in range(1, 13):  # MVBench's TVQA frames: 00001.jpg ... at 3 fps
        Image.new("RGB", (8, 8), (j * 20, 0, 0)).save(d / f"{j:05d}.jpg")
    got = sample_frames(d, 3, source_fps=3, bound=(1.0, 3.0))
    assert [p.rsplit("/", 1)[1] for p in got] == ["00004.jpg", "00007.jpg", "00010.jpg"]
    with pytest.raises(DataError, match="source frame rate"):
        sample_frames(d, 3, bound=(1.0, 3.0))  # a folder carries no frame rate


def test_unreadable_video_names_file_and_row(tmp_path):
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"\x00\x00\x00\x18ftypmp42 not really a video")
    with pytest.raises(DataError, match=r"^data.json, row 7: .*broken.mp4: unreadable video"):
        sample_frames(broken, 4, where="data.json, row 7")
    rec = {"images": [str(tmp_path / "gone.mp4")], "source_file": "t.json", "source_row": 3, "question_id": "q"}
    with pytest.raises(DataError, match=r"t.json, row 3 \(question_id='q'\): sample_frames: video / frames not found"):
        question_frames(rec, 4)
    with pytest.raises(DataError, match=r"t.json, row 3 .*needs n_frames or fps"):
        question_frames({**rec, "images": [str(broken)]}, require_budget=True)


def test_mvbench_rows_sample_inside_their_window(tmp_path):
    df = load_dataset(fx.write_mvbench(tmp_path, bad_rows=True), skip_bad_rows=True).set_index("category")
    seq = df.loc["action_sequence"].to_dict() | {"question_id": "action_sequence/0"}
    inside = question_frames(seq, 3, use_bounds=True)     # 16 frames at 4 fps, window 1-3 s: frames 4, 8, 12
    whole = question_frames(seq, 3, use_bounds=False)     # frames 0, 7, 15
    grey = lambda i: (25 * i) % 256  # noqa: E731 - the first task's clip has seed 0
    assert [_grey(p) for p in inside] == pytest.approx([grey(i) for i in (4, 8, 12)], abs=4)
    assert [_grey(p) for p in whole] == pytest.approx([grey(i) for i in (0, 7, 15)], abs=4)
    ep = df.loc["episodic_reasoning"].to_dict()           # frame folder, 3 fps, window 1-3 s
    assert [p.rsplit("/", 1)[1] for p in question_frames(ep, 3)] == ["00004.jpg", "00007.jpg", "00010.jpg"]
    broken = df[df.images.map(lambda i: i[0].endswith("broken.mp4"))].iloc[0].to_dict()
    with pytest.raises(DataError, match=r"unexpected_action.json, row 1 .*broken.mp4: unreadable video"):
        question_frames(broken, 2)
