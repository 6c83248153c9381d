"""The noise floor as a figure: per alternative, the answer flip rate and the paired accuracy change with their
intervals (a forest plot per model), from :func:`~mmfragile.studies.numerics.metrics.floor_table`."""
from __future__ import annotations

import numpy as np
import pandas as pd

from mmfragile.figures import plt, stamp_note


def plot_floor(table: pd.DataFrame, note: str | None = None):
    """Two panels sharing the alternatives' axis: flip rate (%, Wilson) and accuracy change (pp, bootstrap over
    questions); one marker colour per model. The dashed line at 0 is the reference run."""
    alts = list(dict.fromkeys(table["alternative"]))
    models = list(dict.fromkeys(table["model"]))
    fig, axes = plt.subplots(1, 2, figsize=(10, 0.45 * len(alts) * max(1, len(models)) + 1.4), sharey=True)
    offsets = np.linspace(-0.2, 0.2, len(models)) if len(models) > 1 else [0.0]
    for (col, lo, hi, label), ax in zip((("flip_rate", "flip_lo", "flip_hi", "answers flipped (%)"),
                                         ("delta_acc", "delta_lo", "delta_hi", "accuracy change (pp)")), axes):
        for off, (model, g) in zip(offsets, table.groupby("model", sort=False)):
            y = np.array([alts.index(a) for a in g["alternative"]]) + off
            v = g[col].to_numpy(float)
            err = np.abs(np.vstack([v - g[lo].to_numpy(float), g[hi].to_numpy(float) - v]))
            ax.errorbar(v, y, xerr=np.nan_to_num(err), fmt="o", capsize=3, label=model)
        ax.axvline(0, color="#888888", ls="--", lw=1)
        ax.set_xlabel(label)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(range(len(alts)), alts)
    axes[0].invert_yaxis()
    axes[1].legend(fontsize=8, loc="best")
    fig.suptitle("The noise floor: answers under arithmetic-only changes, against the reference run")
    fig.tight_layout()
    return stamp_note(fig, note)
