"""Figures for the three studies (one module each) and the helpers they share."""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable

import matplotlib

matplotlib.use("Agg")  # figures are written to files; notebooks still display the returned Figure

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402


def stamp_note(fig: Figure, note: str | None) -> Figure:
    """Write ``note`` (e.g. "random vision tower: not a real VLM") in small grey italics *below* everything
    already drawn, so it never overlaps tick or axis labels; ``save_figure`` (tight bbox) keeps it in view."""
    if not note:
        return fig
    fig.canvas.draw()
    bottom = fig.get_tightbbox(fig.canvas.get_renderer()).y0 / fig.get_figheight()
    fig.text(0.99, bottom - 0.01, note, ha="right", va="top", fontsize=7, color="#666666", style="italic")
    return fig


def save_figure(fig: Figure, path, dpi: int = 150) -> None:
    """Write ``fig`` (PNG/PDF by extension) with a tight bounding box and close it."""
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    plt.close(fig)


def figure_saver(folder: str | Path, dpi: int = 150) -> Callable[[Figure, str], Path]:
    """The notebooks' one ``save``: ``save(fig, name)`` writes ``fig`` as ``folder / name`` (:func:`save_figure`;
    the folder is created), says where, and returns the path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)

    def save(fig: Figure, name: str) -> Path:
        save_figure(fig, folder / name, dpi=dpi)
        print("saved", folder / name)
        return folder / name

    return save


@contextlib.contextmanager
def seeded_numpy(seed: int):
    """numpy's global generator seeded for the block (plotting libraries that draw from it: seaborn's jitter),
    then restored, so a figure does not change from run to run and the caller's random state is untouched."""
    import numpy as np

    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)
