"""Interleaved image markers (<image k> -> Prompt.images[k-1]) for chat templates."""
import pytest

from mmfragile.models.base import split_interleaved, unnamed_images


def test_split_interleaved_hand_computed():
    assert split_interleaved("See <image 1> and <image 2>.", 2) == ["See ", 0, " and ", 1, "."]
    assert split_interleaved("<image 2> is a symbol of...", 2) == [1, " is a symbol of..."]
    assert split_interleaved("A <image 1><image 1>", 1) == ["A ", 0, 0]        # named twice: twice
    assert split_interleaved("no markers", 3) == ["no markers"]
    assert split_interleaved("", 0) == []
    assert split_interleaved("<image  3>", 3) == [2]                           # MMMU-Pro's regex allows spaces


def test_split_interleaved_round_trip_and_errors():
    text = "Compare <image 1> and <image 2>: which shows <image 2>?\nA. <image 1>\nB. <image 2>"
    parts = split_interleaved(text, 2)
    assert "".join(p if isinstance(p, str) else f"<image {p + 1}>" for p in parts) == text
    with pytest.raises(ValueError, match=r"'<image 3>' at character 4 names no image: the prompt has 2"):
        split_interleaved("See <image 3>", 2)
    with pytest.raises(ValueError, match="names no image"):
        split_interleaved("<image 0>", 2)


def test_unnamed_images():
    assert unnamed_images("<image 2> only", 3) == [0, 2]
    assert unnamed_images("no markers", 2) == [0, 1]
    assert unnamed_images("<image 1> <image 2>", 2) == []
