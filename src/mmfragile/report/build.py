"""Compute and render the fragility report (see :mod:`mmfragile.report`).

The shared layer: stores, the document model, bootstrap helpers, rankings, budgeted grids, provenance, "How to
report this" and the rendering. Each study writes its own section (its ``report`` callable, in its package's
``report.py``, found through :func:`mmfragile.study.store_stage`): numbers come from the study's metric functions
and :func:`mmfragile.budget.estimate_store`, and only the intervals are added: a percentile bootstrap that
resamples *questions* (all circular shifts / prompts of a drawn question go together; one set of draws per
model x dataset, shared by all its formats, and shared by all models of a dataset for the rank intervals), with
a fixed seed, so the same stores always give the same report.

Metric keys (``data-metric`` in the HTML, ``metrics`` in report.json) are ``/``-joined paths, e.g.
``formats/<model>/<dataset>/mean``, ``formats/<model>/<dataset>/mean/ci_low``, ``prompts/<model>/<benchmark>/
trimmed_mean``, ``ranking/formats/<dataset>/<model>/p_best``, ``lmm/<factor>/<level>/coef``,
``budget/formats/<model>/<dataset>/mean``, ``judge/<judge>/<perturbation>/value``; ``/`` inside a name is
written ``_`` (:func:`metric_key`).
"""
from __future__ import annotations

import base64
import html
import io
import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from mmfragile.redaction import redact
from mmfragile.store import ResultStore, store_folders, store_tag
from mmfragile.study import budget_grid, get_study, study_names

DEFAULT_N_BOOT = 1000
DEFAULT_SEED = 0
LEVEL = 0.95
NOT_RECORDED = "not recorded"


@dataclass(frozen=True)
class ReportOptions:
    """What every study section is computed with: bootstrap draws and seed, interval level, posterior draws of
    budgeted grids (None: the store estimate's)."""

    n_boot: int = DEFAULT_N_BOOT
    seed: int = DEFAULT_SEED
    level: float = LEVEL
    budget_draws: int | None = None


# ================================================================================================ helpers
def metric_key(*parts: Any) -> str:
    """The key of a number: its parts joined by ``/`` (a ``/`` inside a part becomes ``_``)."""
    return "/".join(str(p).replace("/", "_") for p in parts)


def variant_statistics(acc: Any, axis: int = -1) -> dict[str, Any]:
    """Statistics of the accuracies over prompt variants (formats / prompts) along ``axis``: mean, median,
    25th / 75th percentile, IQR, worst 5 % (5th percentile, numpy's linear rule), min, max, spread (max - min)."""
    a = np.asarray(acc, float)
    q05, q25, q50, q75 = np.percentile(a, [5, 25, 50, 75], axis=axis)
    mx, mn = a.max(axis=axis), a.min(axis=axis)
    return {"mean": a.mean(axis=axis), "median": q50, "q25": q25, "q75": q75, "iqr": q75 - q25, "worst5": q05,
            "min": mn, "max": mx, "spread": mx - mn}


def boot_weights(n_q: int, n_boot: int, seed: int) -> np.ndarray:
    """Bootstrap draws of ``n_q`` questions as multiplicities (n_boot x n_q)."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n_q, np.full(n_q, 1.0 / n_q), size=n_boot).astype(float)


def boot_ratio(W: np.ndarray, hits: np.ndarray, n: np.ndarray) -> np.ndarray:
    """100 x resampled hits / resampled counts: W (boot x q) with hits / n (variants x q) -> boot x variants."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return 100.0 * (W @ hits.T) / (W @ n.T)


def interval(draws: np.ndarray, level: float = LEVEL, axis: int = 0) -> tuple[Any, Any]:
    a = 100 * (1 - level) / 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        lo, hi = np.nanpercentile(draws, [a, 100 - a], axis=axis)
    return lo, hi


def finite(v: Any) -> float | None:
    if v is None:
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) or math.isinf(x) else x


def outcome_matrix(df: pd.DataFrame, variant: str, questions: Sequence[str], variants: Sequence[str],
            hit_col: str = "correct", n_col: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(hits, counts) as variants x questions arrays from per-row outcomes."""
    d = pd.DataFrame({"v": df[variant].astype(str).to_numpy(), "q": df["question_id"].astype(str).to_numpy(),
                      "h": df[hit_col].astype(float).to_numpy(),
                      "n": np.ones(len(df)) if n_col is None else df[n_col].astype(float).to_numpy()})
    g = d.groupby(["v", "q"], sort=False)[["h", "n"]].sum()
    hits = g["h"].unstack("q").reindex(index=list(variants), columns=list(questions)).fillna(0.0).to_numpy()
    n = g["n"].unstack("q").reindex(index=list(variants), columns=list(questions)).fillna(0.0).to_numpy()
    return hits, n


def of_group(df: pd.DataFrame, model: str, dataset: str, column: str = "dataset") -> pd.DataFrame:
    """The rows of one model and dataset (``column``: where the dataset is named), compared as strings."""
    return df[(df["model"].astype(str) == model) & (df[column].astype(str) == dataset)]


def of_groups(df: pd.DataFrame, keys: set[tuple[str, str]]) -> pd.DataFrame:
    """The rows whose ``(model, dataset)``, as strings, is one of ``keys``."""
    return df[[(str(a), str(b)) in keys for a, b in zip(df["model"], df["dataset"])]]


# ================================================================================================ document model
@dataclass
class Cell:
    """A table cell / paragraph run: spans of ``(text, metric key or None, value)``."""

    parts: list[tuple[str, str | None, float | None]]
    cls: str = ""

    @property
    def text(self) -> str:
        return "".join(p[0] for p in self.parts)


@dataclass
class Table:
    id: str
    title: str
    columns: list[str]
    rows: list[list[Cell]]
    note: str = ""
    collapsed: bool = False


@dataclass
class Figure:
    id: str
    title: str
    png: bytes
    caption: str = ""


@dataclass
class Paragraph:
    cells: list[Cell]
    cls: str = ""


@dataclass
class Section:
    id: str
    title: str
    blocks: list = field(default_factory=list)


@dataclass
class Report:
    """What :func:`build_report` wrote: the three files and the numbers (``metrics``: key -> value, the
    same as report.json's ``metrics`` and the page's ``data-metric`` elements)."""

    out: Path
    html: Path
    markdown: Path
    json: Path
    metrics: dict[str, float | None]
    figures: list[str]
    provenance: list[dict[str, Any]]
    notes: list[str]


def txt(s: str) -> Cell:
    return Cell([(str(s), None, None)])


class Doc:
    """Collects numbers (with their keys) and blocks while the sections are computed."""

    def __init__(self, digits: int = 1):
        self.metrics: dict[str, float | None] = {}
        self.digits = digits
        self.sections: list[Section] = []
        self.notes: list[str] = []
        #: model label -> its numerical noise floor in pp (a study's ``report_floors``), before any section
        self.floors: dict[str, float] = {}
        self._ids: set[str] = set()

    def uid(self, base: str) -> str:
        import re

        s = re.sub(r"[^A-Za-z0-9_-]+", "-", base).strip("-") or "x"
        out, k = s, 1
        while out in self._ids:
            k += 1
            out = f"{s}-{k}"
        self._ids.add(out)
        return out

    def put(self, key: str, value: Any) -> float | None:
        v = finite(value)
        if key in self.metrics and self.metrics[key] != v:
            raise AssertionError(f"report: metric {key} given two values ({self.metrics[key]} and {v})")
        self.metrics[key] = v
        return v

    def span(self, key: str, value: Any, digits: int | None = None, suffix: str = "") -> tuple[str, str, float | None]:
        v = self.put(key, value)
        d = self.digits if digits is None else digits
        return ("n/a" if v is None else f"{v:.{d}f}{suffix}", key, v)

    def num(self, key: str, value: Any, digits: int | None = None, suffix: str = "", cls: str = "") -> Cell:
        return Cell([self.span(key, value, digits, suffix)], cls)

    def ci(self, key: str, value: Any, lo: Any, hi: Any, digits: int | None = None, cls: str = "") -> Cell:
        """``value [lo, hi]`` with keys ``key``, ``key/ci_low``, ``key/ci_high``."""
        return Cell([self.span(key, value, digits), (" [", None, None), self.span(f"{key}/ci_low", lo, digits),
                     (", ", None, None), self.span(f"{key}/ci_high", hi, digits), ("]", None, None)], cls)

    def count(self, key: str, value: Any) -> Cell:
        return self.num(key, value, digits=0)


def _png(fig) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def add_figure(doc: Doc, sec: Section, fid: str, title: str, make, caption: str = "") -> None:
    """Add a figure; a figure that fails to draw is reported in the notes, not raised."""
    try:
        fig = make()
    except Exception as e:  # noqa: BLE001 - a figure must not sink the report
        doc.notes.append(f"figure '{title}' could not be drawn: {type(e).__name__}: {e}")
        return
    if fig is None:
        return
    sec.blocks.append(Figure(doc.uid("fig-" + fid), title, _png(fig), caption))


def distribution_figure(groups: list[dict], xlabel: str, title: str, std_label: str):
    """Per model x dataset: the accuracy of every variant (dots), the IQR (box), the mean (bar) and the
    standard format / base prompt (red diamond)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch, Rectangle

    fig, ax = plt.subplots(figsize=(8.5, 0.75 * len(groups) + 1.7))
    rng = np.random.default_rng(0)
    for i, g in enumerate(groups):
        v = np.asarray(g["values"], float)
        q25, q75 = np.percentile(v, [25, 75])
        ax.add_patch(Rectangle((q25, i - 0.32), q75 - q25, 0.64, color="#c6dbef", zorder=1))
        ax.scatter(v, i + rng.uniform(-0.22, 0.22, len(v)), s=12, color="#2b8cbe", alpha=0.8, zorder=2)
        ax.plot([v.mean()] * 2, [i - 0.38, i + 0.38], color="black", lw=2, zorder=3)
        if g.get("standard") is not None:
            ax.scatter([g["standard"]], [i], marker="D", s=55, color="#d7301f", edgecolor="white", zorder=4)
    ax.set_yticks(range(len(groups)), [g["label"] for g in groups], fontsize=8)
    ax.set_ylim(len(groups) - 0.5, -0.5)
    ax.set_xlim(-2, 102)
    ax.set_xlabel(xlabel)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(handles=[Line2D([], [], marker="o", ls="", color="#2b8cbe", label="one variant"),
                       Patch(color="#c6dbef", label="IQR"), Line2D([], [], color="black", lw=2, label="mean"),
                       Line2D([], [], marker="D", ls="", color="#d7301f", label=std_label)],
              fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


# ================================================================================================ stores
def _is_store(p: Path) -> bool:
    return (p / "config.json").is_file() and (p / "parts").is_dir()


def collect_stores(paths: Iterable[str | Path]) -> list[ResultStore]:
    """The result stores named by ``paths``: a store folder itself, or every store below a folder."""
    out: dict[Path, ResultStore] = {}
    for p in map(Path, paths):
        if not p.exists():
            raise FileNotFoundError(f"{p}: no such store or folder")
        found = [p] if _is_store(p) else sorted(store_folders(p))
        if not found:
            raise FileNotFoundError(f"{p}: no result store (a folder with config.json and parts/) in it")
        for s in found:
            out.setdefault(s.resolve(), ResultStore(s))
    return list(out.values())


def _identities(store: ResultStore) -> dict[str, dict]:
    """Model name -> the identity of the model whose rows the store holds (``run_info.model_identity``; a store
    made before identities were pinned: its provenance's spec and checkpoint hash)."""
    info = store.config.get("run_info") or {}
    if info.get("model_identity"):
        return dict(info["model_identity"])
    return {m: {"model_spec": p.get("model_spec"), "checkpoint_sha256": p.get("checkpoint_sha256")}
            for m, p in (info.get("provenance") or {}).items() if isinstance(p, Mapping)}


def _same(a: dict, b: dict) -> bool:
    """:func:`~mmfragile.provenance.same_model`; with an older store's provenance (``model_spec``, all arguments):
    the same spec string and checkpoint if both are older, the same checkpoint hash if one is."""
    from mmfragile.provenance import same_model

    if "model_spec" not in a and "model_spec" not in b:
        return same_model(a, b)
    return a == b if "model_spec" in a and "model_spec" in b else a["checkpoint_sha256"] == b["checkpoint_sha256"]


def _describe(ident: dict) -> str:
    from mmfragile.provenance import describe_identity

    return (f"{ident['model_spec']} (checkpoint sha256 {str(ident['checkpoint_sha256'])[:12]})"
            if "model_spec" in ident else describe_identity(ident))


def model_labels(stores: Sequence[ResultStore]) -> tuple[dict[tuple[Path, str], str], list[str]]:
    """Stores that share a model name but not the model (another spec or checkpoint): ``(store root, name) ->
    "name [spec]"`` for their rows, so that they are shown apart and never merged into one row, and a note each."""
    by_name: dict[str, list[tuple[Path, dict]]] = {}
    for st in stores:
        for name, ident in _identities(st).items():
            by_name.setdefault(name, []).append((st.root, ident))
    labels, notes = {}, []
    for name, held in by_name.items():
        distinct: list[dict] = []
        for _, ident in held:
            if not any(_same(ident, d) for d in distinct):
                distinct.append(ident)
        if len(distinct) > 1:
            labels.update({(root, name): f"{name} [{_describe(ident)}]" for root, ident in held})
            notes.append(f"WARNING: {len(distinct)} different models are named {name!r} "
                         f"({'; '.join(map(_describe, distinct))}); their stores are shown apart, each labelled "
                         "with its spec - name them apart with --model-args name=NEW")
    return labels, notes


def store_rows(store: ResultStore, labels: Mapping[tuple[Path, str], str],
               read: Callable[[ResultStore], pd.DataFrame] = ResultStore.read) -> pd.DataFrame:
    """The store's rows (``read``: a study's own reader, e.g. answers joined with their second stage), the model
    relabelled where :func:`model_labels` says."""
    df = read(store)
    mine = {name: label for (root, name), label in labels.items() if root == store.root}
    if mine and "model" in df:
        df["model"] = df["model"].astype(str).replace(mine)
    return df


def read_stores(stores: Sequence[ResultStore]) -> pd.DataFrame:
    frames = []
    labels = model_labels(stores)[0]
    for st in stores:
        df = store_rows(st, labels)
        if len(df):
            frames.append(df.assign(_store=str(st.root)))
    if not frames:
        return pd.DataFrame()
    df = pd.concat(frames, ignore_index=True)
    key = [c for c in ("model", "dataset", "question_id", "variant") if c in df.columns]
    return df[~df[key].astype(str).duplicated(keep="first")].reset_index(drop=True)


# ================================================================================================ shared pieces
def stats_row(doc: Doc, prefix: str, point: Mapping[str, Any], boot: Mapping[str, np.ndarray],
               level: float) -> list[Cell]:
    cells = []
    for s in ("mean", "median", "iqr", "worst5", "spread"):
        lo, hi = interval(boot[s], level)
        cells.append(doc.ci(f"{prefix}/{s}", point[s], lo, hi))
    return cells


def ranking_tables(doc: Doc, sec: Section, kind: str, ds: str, per_model: dict[str, dict], unit_name: str,
             n_boot: int, seed: int, level: float, point_rank_by_unit: pd.DataFrame,
             point_mean_rank: Mapping[str, int], rank_dist: pd.DataFrame) -> dict[str, dict]:
    """Model ranking within dataset ``ds``: rank by the mean over variants (with a bootstrap interval and the
    probability of being best) and per variant. ``per_model[m]`` = {"frame", "variant", ...} outcomes."""
    models = list(per_model)
    common_q = sorted(set.intersection(*(set(v["frame"]["question_id"].astype(str)) for v in per_model.values())))
    common_v = sorted(set.intersection(*(set(v["frame"][v["variant"]].astype(str)) for v in per_model.values())))
    if not common_q or not common_v:
        sec.blocks.append(Paragraph([txt(f"{ds}: the models share no questions / {unit_name}s; no ranking.")]))
        return {}
    W = boot_weights(len(common_q), n_boot, seed)
    boot, means = [], {}
    for m in models:
        pm_ = per_model[m]
        hits, n = outcome_matrix(pm_["frame"], pm_["variant"], common_q, common_v, pm_.get("hit", "correct"), pm_.get("n"))
        boot.append(boot_ratio(W, hits, n))                                   # boot x variants
        with np.errstate(invalid="ignore", divide="ignore"):
            means[m] = float(np.nanmean(100.0 * hits.sum(axis=1) / n.sum(axis=1)))
    gaps = rank_gaps(doc, kind, ds, means) if set(models) & set(doc.floors) else None
    B = np.stack(boot)                                                    # models x boot x variants
    Bm = np.nanmean(B, axis=2)                                            # models x boot (mean over variants)
    r_mean = 1 + (Bm[None, :, :] > Bm[:, None, :]).sum(axis=1)            # models x boot
    r_unit = 1 + (B[None] > B[:, None]).sum(axis=1)                      # models x boot x variants
    a = (1 - level) / 2
    out = {}
    rows = []
    for i, m in enumerate(models):
        base = metric_key("ranking", kind, ds, m)
        lo, hi = np.quantile(r_mean[i], [a, 1 - a], method="inverted_cdf")
        p_best = float((r_mean[i] == 1).mean())
        rd = rank_dist[rank_dist["model"] == m]
        share1 = float(rd.loc[rd["rank"] == 1, "share"].sum()) if len(rd) else float("nan")
        med = float(rd["median_rank"].iloc[0]) if len(rd) else float("nan")
        rmin = rd["min_rank"].iloc[0] if len(rd) else float("nan")
        rmax = rd["max_rank"].iloc[0] if len(rd) else float("nan")
        out[m] = {"rank": point_mean_rank.get(m), "p_best": p_best, "share_rank1": share1,
                  "gap_verdict": gaps[m][1] if gaps else None}
        rows.append([txt(m), doc.count(f"{base}/rank", point_mean_rank.get(m)),
                     Cell([("[", None, None), doc.span(f"{base}/rank_lo", lo, 0), (", ", None, None),
                           doc.span(f"{base}/rank_hi", hi, 0), ("]", None, None)]),
                     doc.num(f"{base}/p_best", p_best, 2),
                     doc.num(f"{base}/share_rank1", 100 * share1, 0, " %"),
                     doc.num(f"{base}/median_rank", med, 1),
                     Cell([doc.span(f"{base}/min_rank", rmin, 0), ("-", None, None), doc.span(f"{base}/max_rank", rmax, 0)])]
                    + ([gaps[m][0]] if gaps else []))
    sec.blocks.append(Table(doc.uid(f"rank-{kind}-{ds}"), f"Model ranking on {ds} (by the mean over {unit_name}s)",
                            ["model", "rank", f"{int(level * 100)} % rank interval", "P(best)",
                             f"{unit_name}s ranked 1st", f"median rank over {unit_name}s",
                             f"rank range over {unit_name}s"] + (["mean - next model's (pp)"] if gaps else []), rows,
                            note=f"Rank intervals and P(best): bootstrap over the {len(common_q)} questions all models "
                                 f"share ({n_boot} draws, seed {seed}); ranks are competition ranks, 1 = best."
                                 + (" A gap inside the floor (the larger of the two models' numerical floors) cannot "
                                    "be told from arithmetic noise." if gaps else "")))
    # per variant, collapsed
    prow = []
    pr = point_rank_by_unit.set_index(["unit", "model"])["rank"]
    for j, u in enumerate(common_v):
        for i, m in enumerate(models):
            base = metric_key("ranking", kind, ds, u, m)
            lo, hi = np.quantile(r_unit[i, :, j], [a, 1 - a], method="inverted_cdf")
            rk = pr.get((u, m), np.nan)
            prow.append([txt(u), txt(m), doc.count(f"{base}/rank", rk),
                         Cell([("[", None, None), doc.span(f"{base}/rank_lo", lo, 0), (", ", None, None),
                               doc.span(f"{base}/rank_hi", hi, 0), ("]", None, None)]),
                         doc.num(f"{base}/p_best", float((r_unit[i, :, j] == 1).mean()), 2)])
    sec.blocks.append(Table(doc.uid(f"rank-{kind}-{ds}-per-unit"), f"Ranking per {unit_name} on {ds}",
                            [unit_name, "model", "rank", f"{int(level * 100)} % rank interval", "P(best)"], prow,
                            collapsed=True))
    return out


# ================================================================================================ the noise floor
def floor_verdict(effect_pp: float, floor_pp: float) -> str:
    """An effect against the model's numerical floor: inside it (cannot be told from arithmetic noise) or above."""
    return "inside the floor" if abs(effect_pp) <= floor_pp else "above the floor"


def floor_block(doc: Doc, sec: Section, kind: str, model: str, ds: str, unit_name: str, names: Sequence[str],
                accuracy: Sequence[float], how: dict) -> None:
    """Where ``model`` has a numerical floor (``doc.floors``): each variant's deviation from the mean over the
    variants beside it, labelled inside or above; the count goes into ``how`` (``floor``) for "How to report this"."""
    floor = doc.floors.get(model)
    if floor is None:
        return
    acc = np.asarray(accuracy, float)
    dev = acc - acc.mean()
    base = metric_key(kind, model, ds)
    rows, inside = [], 0
    for j in np.argsort(-np.abs(dev), kind="stable"):
        verdict = floor_verdict(dev[j], floor)
        inside += verdict.startswith("inside")
        rows.append([txt(names[j]), doc.num(metric_key(kind, model, ds, "deviation", names[j]), dev[j]), txt(verdict)])
    doc.put(f"{base}/floor_pp", floor)
    how["floor"] = {"floor": floor, "inside": doc.put(f"{base}/inside_floor", inside), "of": len(names)}
    sec.blocks.append(Table(doc.uid(f"{kind}-floor-{model}-{ds}"), f"{model} on {ds}: each {unit_name}'s deviation "
                            f"from the mean over {unit_name}s beside the numerical floor ({floor:.1f} pp)",
                            [unit_name, "accuracy - mean (pp)", "verdict"], rows, collapsed=True,
                            note=f"{inside} of {len(names)} {unit_name}s deviate from the mean by no more than the "
                                 "model's numerical floor (the numerics store: the largest accuracy change an "
                                 "arithmetic-only change made); those cannot be told from noise."))


def rank_gaps(doc: Doc, kind: str, ds: str, means: Mapping[str, float]) -> dict[str, tuple[Cell, str | None]]:
    """Per model: its mean's gap to the next-ranked model's (pp) as a cell, and its verdict against the larger of
    the two models' floors where either has one (``doc.floors``; else None)."""
    order = sorted(means, key=lambda m: -means[m])
    out: dict[str, tuple[Cell, str | None]] = {}
    for m, nxt in zip(order, order[1:] + [None]):
        if nxt is None:
            out[m] = txt("-"), None
            continue
        gap = means[m] - means[nxt]
        floors = [doc.floors[x] for x in (m, nxt) if x in doc.floors]
        verdict = floor_verdict(gap, max(floors)) if floors else None
        out[m] = Cell([doc.span(metric_key("ranking", kind, ds, m, "gap_to_next"), gap),
                       (f" ({verdict}, vs {nxt})" if verdict else f" (vs {nxt})", None, None)]), verdict
    return out


# ================================================================================================ study 1
# ================================================================================================ budgets
def _grid_units(rows: pd.DataFrame) -> dict[str, list[str]]:
    """Per model (as labelled in ``rows``), the units its budgeted runs sampled from (the stores' run_info)."""
    from mmfragile.budget import grid_units

    units: dict[str, list[str]] = {}
    for root, g in rows.groupby("_store", sort=False) if "_store" in rows else ():
        own = grid_units([ResultStore(root).config])
        for label in g["model"].astype(str).unique():   # a label is the model's name, or "name [spec]"
            name = label.split(" [")[0]
            if name in own:
                units[label] = sorted({*units.get(label, []), *own[name]})
    return units


def budget_block(doc: Doc, sec: Section, rows: pd.DataFrame, study: str, kind: str, unit: str,
                  n_draws: int | None, how: list[dict]) -> None:
    """The budgeted / incomplete grids of a study: :func:`mmfragile.budget.estimate_store` with its own settings
    (level, draws, seed - not the report's bootstrap seed), so the numbers equal ``mmfragile run --budget``'s."""
    from mmfragile.budget import STORE_DRAWS, STORE_SEED, estimate_store
    from mmfragile.budget.estimator import STATISTICS
    from mmfragile.budget.plots import plot_unit_estimates

    n_draws = STORE_DRAWS if n_draws is None else n_draws
    units = _grid_units(rows)
    try:
        est = estimate_store(rows.drop(columns=["_store"], errors="ignore"), budget_grid(study), n_draws=n_draws,
                             units=units)
    except Exception as e:  # noqa: BLE001
        sec.blocks.append(Paragraph([txt(f"Budgeted / incomplete grid: estimate failed ({type(e).__name__}: {e})")]))
        return
    gcols = [c for c in ("dataset", "model") if c in est.summary.columns]
    trows, notes = [], []
    for key, g in est.summary.groupby(gcols, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        gd = dict(zip(gcols, key))
        m, ds = str(gd.get("model", "")), str(gd.get("dataset", ""))
        prefix = metric_key("budget", kind, m, ds)
        b = est.budget
        bm = b[np.logical_and.reduce([b[c].astype(str) == str(v) for c, v in gd.items()])].iloc[0]
        r = [txt(m), txt(ds), Cell([doc.span(f"{prefix}/n_observed", bm["n_observed"], 0), (" / ", None, None),
                                      doc.span(f"{prefix}/n_cells", bm["n_cells"], 0), (" (", None, None),
                                      doc.span(f"{prefix}/budget_pct", 100 * bm["fraction"], 1, " %"), (")", None, None)])]
        gi = g.set_index("statistic")
        for stname in STATISTICS:
            x = gi.loc[stname]
            c = doc.ci(f"{prefix}/{stname}", x["estimate"], x["lo"], x["hi"])
            if stname in ("best", "worst") and x["unit"] is not None:
                c.parts.append((f" ({x['unit']})", None, None))
            r.append(c)
        trows.append(r)
        if bm.get("note"):
            notes.append(f"{m} / {ds}: {bm['note']}.")
        how.append({"kind": kind, "model": m, "dataset": ds, "prefix": prefix, "budgeted": True, "level": est.level,
                    "n_variants": int(est.units[np.logical_and.reduce([est.units[c].astype(str) == str(v)
                                                                       for c, v in gd.items()])].shape[0])})
        u = est.units[np.logical_and.reduce([est.units[c].astype(str) == str(v) for c, v in gd.items()])]
        add_figure(doc, sec, f"budget-{kind}-{m}-{ds}", f"Budgeted estimate per {unit}: {m} on {ds}",
                lambda u=u: plot_unit_estimates(u, None, est.spec.unit, title=f"{m} / {ds}: per-{unit} estimates"))
    sec.blocks.append(Table(doc.uid(f"budget-{kind}"), f"Budgeted / incomplete grids: estimated accuracy (%) over {unit}s",
                            ["model", "dataset", "cells run / grid (budget)"] + [
                                {"mean": "mean", "best": "best", "worst": "worst"}.get(s, s.replace("q", "") + "th pct")
                                for s in STATISTICS], trows,
                            note=f"PromptEval-style IRT estimate of the whole grid from the cells run "
                                 f"(mmfragile.budget.estimate_store): plug-in estimate [{int(est.level * 100)} % "
                                 f"posterior-predictive interval, {n_draws} draws, seed {STORE_SEED}]. The intervals of "
                                 "the extremes (best / worst, 5th / 95th pct) under-cover (notebooks 35 / 42)."
                                 + "".join(f" {n}" for n in notes)))
    if len(est.ranks):
        rrows = []
        for t in est.ranks.itertuples():
            base = metric_key("budget", "ranking", kind, getattr(t, "dataset", ""), getattr(t, est.spec.unit), t.model)
            rrows.append([txt(getattr(t, "dataset", "")), txt(getattr(t, est.spec.unit)), txt(t.model),
                          doc.count(f"{base}/rank", t.rank),
                          Cell([("[", None, None), doc.span(f"{base}/rank_lo", t.rank_lo, 0), (", ", None, None),
                                doc.span(f"{base}/rank_hi", t.rank_hi, 0), ("]", None, None)]),
                          doc.num(f"{base}/p_best", t.p_rank1, 2)])
        sec.blocks.append(Table(doc.uid(f"budget-{kind}-ranks"), f"Budgeted: model ranking per {unit}",
                                ["dataset", unit, "model", "rank", "rank interval", "P(best)"], rrows, collapsed=True))


# ================================================================================================ provenance
def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(d, Mapping):
        for k, v in d.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            out[key] = v
            if isinstance(v, Mapping) and v:
                out.update(_flatten(v, key))
    return out


def _lookup(flat: Mapping[str, Any], pred) -> tuple[str, Any] | None:
    for k, v in flat.items():
        if pred(k.lower()) and v not in (None, "", [], {}):
            return k, v
    return None


def _short(v: Any, n: int = 160) -> str:
    s = v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str)
    return s if len(s) <= n else s[: n - 3] + "..."


def _rel(path: str | Path) -> str:
    """``path`` relative to the working folder when inside it (reports must not name the machine's folders)."""
    try:
        return Path(path).resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return str(path)


def _provenance(store: ResultStore) -> dict[str, Any]:
    cfg = store.config
    info = cfg.get("run_info") or {}
    flat_info, flat_cfg = _flatten(info), _flatten({k: v for k, v in cfg.items() if k != "run_info"})
    both = {**{f"run_info.{k}": v for k, v in flat_info.items()}, **flat_cfg}
    hashy = lambda k: any(t in k for t in ("hash", "sha", "digest", "md5", "fingerprint"))  # noqa: E731
    fields: dict[str, Any] = {}
    try:
        rows = store.read()
    except Exception:  # noqa: BLE001
        rows = pd.DataFrame()
    models = sorted(map(str, rows["model"].unique())) if "model" in rows else (
        sorted(map(str, rows["judge"].unique())) if "judge" in rows else [])
    datasets = sorted(map(str, rows["dataset"].unique())) if "dataset" in rows else []
    fields["store"] = _rel(store.root)
    fields["study"] = "/".join(store_tag(cfg, store.root)) if cfg.get("study") else NOT_RECORDED
    fields["rows"] = int(len(rows))
    prov = info.get("provenance") if isinstance(info.get("provenance"), Mapping) else {}
    specs = [str(p.get("model_spec")) for p in prov.values() if isinstance(p, Mapping) and p.get("model_spec")]
    fields["model spec"] = (", ".join(specs) if specs else cfg.get("model")) or \
        (", ".join(models) + " (from the rows)" if models else NOT_RECORDED)
    if prov:  # what mmfragile.study.run_study records per model (mmfragile.provenance)
        per = {m: p for m, p in prov.items() if isinstance(p, Mapping)}
        fields["checkpoint hash"] = "; ".join(f"{m}: sha256 {_short(p.get('checkpoint_sha256', NOT_RECORDED), 72)}"
                                              for m, p in per.items())
        fields["dataset"] = cfg.get("dataset") or ", ".join(sorted({str(p.get("dataset")) for p in per.values()}))
        fields["dataset / file hash"] = "; ".join(sorted({
            f"{p.get('dataset')}: sha256 {_short(p.get('dataset_sha256', NOT_RECORDED), 72)}"
            + (f" ({p['dataset_hash_method']})" if p.get("dataset_hash_method") else "") for p in per.values()}))
        fields["version"] = "; ".join(sorted({", ".join(f"{k.removesuffix('_version')} {v}" for k, v in p.items()
                                                        if k.endswith("_version")) for p in per.values()}))
    else:  # stores written by other means: whatever their config says, or "not recorded"
        ck = _lookup(both, lambda k: hashy(k) and any(t in k for t in ("checkpoint", "model", "weight")))
        fields["checkpoint hash"] = f"{_short(ck[1])} ({ck[0]})" if ck else NOT_RECORDED
        fields["dataset"] = cfg.get("dataset") or (", ".join(datasets) + " (from the rows)" if datasets else NOT_RECORDED)
        dh = _lookup(both, lambda k: hashy(k) and any(t in k for t in ("dataset", "data", "file", "question")))
        fields["dataset / file hash"] = f"{_short(dh[1])} ({dh[0]})" if dh else NOT_RECORDED
        ver = _lookup(both, lambda k: "version" in k)
        fields["version"] = f"{_short(ver[1])} ({ver[0]})" if ver else NOT_RECORDED
    ip = _lookup(both, lambda k: "image_policy" in k or "image policy" in k)
    fields["image policy"] = _short(ip[1]) if ip else NOT_RECORDED
    if "skipped_rows" in info:
        sk = info.get("skipped_rows") or []
        fields["skipped rows"] = f"{len(sk)}" + (": " + "; ".join(_short(r.get("reason", r) if isinstance(r, Mapping)
                                                                        else r, 90) for r in sk[:5]) if sk else "")
        if len(sk) > 5:
            fields["skipped rows"] += f"; ... ({len(sk) - 5} more)"
    else:
        fields["skipped rows"] = NOT_RECORDED
    try:
        chk = store.check()
        fields["completeness"] = (f"{chk.n_stored} rows, {chk.n_expected} expected by the manifests - "
                                  + ("complete" if chk.complete else ("no manifest" if chk.n_expected == 0 else
                                                                      f"INCOMPLETE ({len(chk.missing)} missing)")))
    except Exception as e:  # noqa: BLE001
        fields["completeness"] = f"{NOT_RECORDED} ({type(e).__name__})"
    fields["config"] = {k: v for k, v in cfg.items() if k != "run_info"}
    fields["run_info"] = info
    return fields


# ================================================================================================ how to report
def how_value(doc: Doc, key: str, digits: int = 1, suffix: str = "") -> tuple[str, str, float | None]:
    """A number of ``doc`` as a part of a "How to report this" paragraph ("n/a" if it was not computed)."""
    v = doc.metrics.get(key)
    return ("n/a" if v is None else f"{v:.{digits}f}{suffix}", key, v)


def _how_grid(doc: Doc, h: dict, level: float) -> Paragraph:
    """A complete grid's entry: quote the distribution over its variants (``unit``), beside the standard one."""
    p, unit, m_ = h["prefix"], h["unit"], doc.metrics
    L = f"{int(level * 100)} % CI"
    sp = lambda key, digits=1, suffix="": how_value(doc, key, digits, suffix)  # noqa: E731
    parts = [(f"{h['model']} on {h['dataset']}: quote the distribution over the {h['n_variants']} {unit}s - "
              "mean ", None, None), sp(f"{p}/mean"), (f" % ({L} ", None, None), sp(f"{p}/mean/ci_low"),
             ("-", None, None), sp(f"{p}/mean/ci_high"), ("), median ", None, None), sp(f"{p}/median"),
             (", IQR ", None, None), sp(f"{p}/q25"), ("-", None, None), sp(f"{p}/q75"),
             (", worst 5 % ", None, None), sp(f"{p}/worst5"), (", spread ", None, None), sp(f"{p}/spread"),
             (" pp", None, None)]
    if h.get("trimmed_mean"):
        parts += [(", and the 10 % trimmed mean ", None, None), sp(f"{p}/trimmed_mean"), (" %", None, None)]
    parts += [(f" - beside the {h['standard_label']} (", None, None), sp(h["standard_key"]), (" %).", None, None)]
    if sp(f"{p}/max")[0] == sp(f"{p}/mean")[0]:  # best = mean as shown: every variant scores the same
        parts += [(f" All {h['n_variants']} {unit}s score the same here (to 0.1 pp): there is no best {unit} to "
                   "single out.", None, None)]
    else:
        parts += [(f" Do not quote the best {unit} ({h['best_name']}, ", None, None), sp(f"{p}/max"),
                  (" %): it was picked after the fact and overstates the mean by ", None, None),
                  (f"{(m_[f'{p}/max'] or 0) - (m_[f'{p}/mean'] or 0):.1f}", None, None), (" pp.", None, None)]
    if h.get("standard_gap"):
        parts += [(f" The {h['standard_label']} differs from the mean by ", None, None),
                  sp(f"{p}/standard_minus_mean"), (f" pp ({L} ", None, None),
                  sp(f"{p}/standard_minus_mean/ci_low"), (" to ", None, None),
                  sp(f"{p}/standard_minus_mean/ci_high"), (").", None, None)]
    if h.get("collapses"):
        parts += [(" Report coverage with accuracy: it collapses for " + "; ".join(
            c.split(": ", 1)[1] for c in h["collapses"]) + ".", None, None)]
    r = (h.get("ranking") or {}).get(h["model"])
    if r:
        rk = metric_key("ranking", h["kind"], h["dataset"], h["model"])
        parts += [(" Rank by the mean: ", None, None), sp(f"{rk}/rank", 0), (" (P(best) ", None, None),
                  sp(f"{rk}/p_best", 2), ("; ranked 1st on ", None, None), sp(f"{rk}/share_rank1", 0),
                  (f" % of the {unit}s) - give the rank interval, not one rank.", None, None)]
        if (r.get("gap_verdict") or "").startswith("inside"):
            parts += [(" Its gap to the next model is inside the numerical floor: the order of the two cannot be "
                       "told from arithmetic noise.", None, None)]
    fl = h.get("floor")
    if fl:
        parts += [(" Numerical floor: ", None, None), sp(f"{p}/floor_pp"), (" pp; ", None, None),
                  sp(f"{p}/inside_floor", 0), (f" of the {fl['of']} {unit}s deviate from the mean by no more - "
                                               f"report those {unit} effects as inside the floor, not as effects.",
                                               None, None)]
        if h.get("standard_gap") and abs(m_.get(f"{p}/standard_minus_mean") or 0) <= fl["floor"]:
            parts += [(f" The {h['standard_label']}'s gap to the mean is inside it too.", None, None)]
    if h.get("lmm_sig"):
        parts += [(" Significant format factors (mixed model): " + ", ".join(n for n, _, _ in h["lmm_sig"])
                   + ".", None, None)]
    return Paragraph([Cell(parts)], "how")


def _how_budgeted(doc: Doc, h: dict, level: float) -> Paragraph:
    """A budgeted grid's entry: the estimated mean and the budget spent."""
    p = h["prefix"]
    sp = lambda key, digits=1: how_value(doc, key, digits)  # noqa: E731
    parts = [(f"{h['model']} on {h['dataset']} (budgeted: ", None, None), sp(f"{p}/budget_pct", 1),
             (" % of the grid run): quote the estimated mean ", None, None), sp(f"{p}/mean"),
             (f" % ({int(h['level'] * 100)} % interval ", None, None), sp(f"{p}/mean/ci_low"), ("-", None, None),
             sp(f"{p}/mean/ci_high"), ("), 5th percentile ", None, None), sp(f"{p}/q05"),
             (" % and the budget spent, and say that the rest of the grid is estimated.", None, None)]
    return Paragraph([Cell(parts)], "how")


def _how_section(doc: Doc, how: list[dict], level: float) -> Section:
    """One paragraph per entry a section returned: a complete grid's (``grid``), a budgeted one's (``budgeted``)
    or the study's own (``paragraph(doc, entry, level)``)."""
    sec = Section("how-to-report", "How to report this")
    for h in how:
        if h.get("budgeted"):
            sec.blocks.append(_how_budgeted(doc, h, level))
        elif h.get("grid"):
            sec.blocks.append(_how_grid(doc, h, level))
        elif h.get("paragraph"):
            sec.blocks.append(h["paragraph"](doc, h, level))
    sec.blocks.append(Paragraph([txt(
        "After the seeds: 'Unexplored Flaws in Multiple-Choice VQA Evaluations' asks model providers to disclose how "
        "prompt formats affect their model (performance on varying prompt formats) - i.e. the distribution over "
        "formats with coverage, not the best format; Promptception reports the 10 % trimmed mean over all prompts "
        "beside the baseline prompt because 'models often report their best-case performance using carefully "
        "selected prompts'; MM-JudgeBias reports BD / BC per bias type over several runs with inter-run and "
        "inter-sample variance. Intervals here are over questions (the models and prompts are fixed), so they do not "
        "cover other datasets or prompt sets.")], "seed"))
    return sec


# ================================================================================================ rendering
_CSS = """
body{font-family:DejaVu Sans,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1250px;color:#222;
line-height:1.4;padding:0 12px}
h1{font-size:1.6em;margin-bottom:0}h2{border-bottom:2px solid #ddd;padding-bottom:4px;margin-top:2em}
h3{font-size:1.05em;margin:1.2em 0 .3em}
table{border-collapse:collapse;margin:.4em 0 1em;font-size:.82em}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:right;vertical-align:top}
th{background:#f2f2f2;text-align:center}td:first-child,td:nth-child(2){text-align:left}
td.std{background:#fff4e5}td.collapse{background:#f8d7da;color:#721c24;font-weight:bold}
.note{font-size:.78em;color:#555;margin:-.6em 0 1em}figure{margin:1em 0}figcaption{font-size:.82em;color:#555}
figure img{max-width:100%;border:1px solid #eee}.how{background:#eef6ee;padding:6px 10px;border-left:4px solid #4c9a4c}
.seed{font-size:.85em;color:#444}.meta{color:#666;font-size:.85em}pre{font-size:.75em;white-space:pre-wrap}
nav ul{columns:2;font-size:.9em}.ci{color:#666}
"""

# Runs once the page has loaded: marks every figure as rendered (image decoded, non-zero size) and records its
# box, the page height and any script error, so a headless browser's DOM dump can be checked (no network use).
_JS_HEAD = ("window.__reportErrors=[];window.addEventListener('error',function(e){window.__reportErrors.push("
            "String(e.message||e));});")
_JS_LOAD = """
window.addEventListener('load',function(){
  var figs=document.querySelectorAll('figure[data-figure]');
  for(var i=0;i<figs.length;i++){var im=figs[i].querySelector('img');var r=im.getBoundingClientRect();
    figs[i].setAttribute('data-rendered',(im.complete&&im.naturalWidth>0&&r.width>0&&r.height>0)?'1':'0');
    figs[i].setAttribute('data-box',[Math.round(r.left+window.scrollX),Math.round(r.top+window.scrollY),
      Math.round(r.width),Math.round(r.height)].join(','));}
  var b=document.body;b.setAttribute('data-height',String(Math.ceil(document.documentElement.scrollHeight)));
  b.setAttribute('data-width',String(Math.ceil(document.documentElement.scrollWidth)));
  b.setAttribute('data-errors',JSON.stringify(window.__reportErrors));b.setAttribute('data-loaded','1');
});
"""


def _esc(s: Any) -> str:
    return html.escape(str(s), quote=True)


def _cell_html(c: Cell) -> str:
    out = []
    for text, key, value in c.parts:
        if key is None:
            out.append(_esc(text))
        else:
            out.append(f'<span data-metric="{_esc(key)}" data-value="{"" if value is None else repr(float(value))}">'
                       f"{_esc(text)}</span>")
    return "".join(out)


def _table_html(t: Table) -> str:
    head = "".join(f"<th>{_esc(c)}</th>" for c in t.columns)
    body = "".join("<tr>" + "".join(f'<td{f" class={chr(34)}{c.cls}{chr(34)}" if c.cls else ""}>{_cell_html(c)}</td>'
                                    for c in r) + "</tr>" for r in t.rows)
    tab = f'<table id="{t.id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
    note = f'<p class="note">{_esc(t.note)}</p>' if t.note else ""
    if t.collapsed:
        return f"<details><summary>{_esc(t.title)} ({len(t.rows)} rows)</summary>{tab}{note}</details>"
    return f"<h3>{_esc(t.title)}</h3>{tab}{note}"


def _render_html(doc: Doc, title: str, meta: str, prov: list[dict]) -> str:
    parts = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{_esc(title)}</title>",
             f"<style>{_CSS}</style><script>{_JS_HEAD}</script></head><body>", f"<h1>{_esc(title)}</h1>",
             f'<p class="meta">{_esc(meta)}</p>', "<nav><ul>"]
    parts += [f'<li><a href="#{s.id}">{_esc(s.title)}</a></li>' for s in doc.sections]
    parts.append("</ul></nav>")
    for s in doc.sections:
        parts.append(f'<section id="{s.id}"><h2>{_esc(s.title)}</h2>')
        for b in s.blocks:
            if isinstance(b, Table):
                parts.append(_table_html(b))
            elif isinstance(b, Figure):
                src = "data:image/png;base64," + base64.b64encode(b.png).decode("ascii")
                parts.append(f'<figure id="{b.id}" data-figure="{b.id}"><img alt="{_esc(b.title)}" src="{src}">'
                             f"<figcaption>{_esc(b.title)}{(' - ' + _esc(b.caption)) if b.caption else ''}"
                             "</figcaption></figure>")
            elif isinstance(b, Paragraph):
                parts.append(f'<p class="{b.cls}">' + "".join(_cell_html(c) for c in b.cells) + "</p>")
        parts.append("</section>")
    parts.append('<section id="provenance"><h2>Provenance</h2>')
    keys = ["store", "study", "rows", "model spec", "checkpoint hash", "dataset", "dataset / file hash", "image policy",
            "version", "skipped rows", "completeness"]
    for i, p in enumerate(prov):
        parts.append(f"<h3>{_esc(p['store'])}</h3><table class=\"prov\"><tbody>")
        parts += [f'<tr><th>{_esc(k)}</th><td data-prov="{_esc(k)}" style="text-align:left">{_esc(p[k])}</td></tr>'
                  for k in keys]
        parts.append("</tbody></table><details><summary>config.json</summary><pre>"
                     + _esc(json.dumps({**p["config"], "run_info": p["run_info"]}, indent=1, sort_keys=True, default=str))
                     + "</pre></details>")
    parts.append("</section>")
    if doc.notes:
        parts.append('<section id="notes"><h2>Notes</h2><ul>' + "".join(f"<li>{_esc(n)}</li>" for n in doc.notes)
                     + "</ul></section>")
    parts.append(f"<script>{_JS_LOAD}</script></body></html>")
    return "\n".join(parts)


def _md_cell(c: Cell) -> str:
    return c.text.replace("|", "\\|").replace("\n", " ")


def _render_md(doc: Doc, title: str, meta: str, prov: list[dict], fig_paths: dict[str, str]) -> str:
    out = [f"# {title}", "", f"_{meta}_", ""]
    for s in doc.sections:
        out += [f"## {s.title}", ""]
        for b in s.blocks:
            if isinstance(b, Table):
                out += [f"**{b.title}**", "", "| " + " | ".join(b.columns) + " |",
                        "|" + "|".join("---" for _ in b.columns) + "|"]
                out += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in b.rows]
                out += (["", f"_{b.note}_"] if b.note else []) + [""]
            elif isinstance(b, Figure):
                out += [f"![{b.title}]({fig_paths[b.id]})", ""]
            elif isinstance(b, Paragraph):
                out += ["".join(_md_cell(c) for c in b.cells), ""]
    out += ["## Provenance", ""]
    for p in prov:
        out += [f"**{p['store']}**", "", "| field | value |", "|---|---|"]
        out += [f"| {k} | {str(p[k]).replace('|', '/')} |" for k in ("study", "rows", "model spec", "checkpoint hash",
                                                                      "dataset", "dataset / file hash", "image policy",
                                                                      "version", "skipped rows", "completeness")]
        out.append("")
    if doc.notes:
        out += ["## Notes", ""] + [f"- {n}" for n in doc.notes] + [""]
    return "\n".join(out)


# ================================================================================================ entry point
def build_report(stores: Sequence[str | Path] | str | Path, out: str | Path, *, n_boot: int = DEFAULT_N_BOOT,
                 seed: int = DEFAULT_SEED, level: float = LEVEL, budget_draws: int | None = None,
                 title: str | None = None) -> Report:
    """Write ``report.html``, ``report.md``, ``report.json`` (and ``figures/*.png``) for ``stores`` into ``out``.

    ``stores``: store folders, or folders holding stores (any study; a results folder of several models counts as
    all of them). ``n_boot`` bootstrap draws over questions with ``seed`` (deterministic), ``level`` the interval
    coverage; ``budget_draws`` posterior draws for budgeted / incomplete grids (default: the store estimate's,
    :data:`mmfragile.budget.STORE_DRAWS`, so the numbers equal ``mmfragile run --budget``'s)."""
    from mmfragile import __version__

    if isinstance(stores, (str, Path)):
        stores = [stores]
    found = collect_stores(stores)
    by_study: dict[str, dict[str, list[ResultStore]]] = {}
    for st in found:
        study, stage = store_tag(st.config, st.root / "config.json")
        by_study.setdefault(study, {}).setdefault(stage, []).append(st)
    doc = Doc()
    for stages in by_study.values():
        doc.notes += model_labels([st for group in stages.values() for st in group])[1]
    how: list[dict] = []
    opts = ReportOptions(n_boot, seed, level, budget_draws)
    unsummarised = []
    known = study_names()
    for name in [n for n in known if n in by_study]:   # the floors first: every section holds its effects against them
        study = get_study(name)
        if study.report_floors is not None:
            doc.floors.update(study.report_floors({k: v for k, v in by_study[name].items()
                                                   if k in study.report_stages}, opts))
    for name in [n for n in known if n in by_study] + sorted(set(by_study) - set(known)):
        study, stages = get_study(name) if name in known else None, by_study[name]
        unsummarised += [f"{name}/{stage}" if stage else name for stage in stages
                         if study is None or study.report is None or stage not in study.report_stages]
        if study is not None and study.report is not None:
            sec, h = study.report(doc, {k: v for k, v in stages.items() if k in study.report_stages}, opts)
            if sec is not None:
                doc.sections.append(sec)
                how += h
    for name in known:   # what a study not in this report would have measured (the numerics study's floor)
        absent = get_study(name).report_absent if name not in by_study else None
        doc.notes += absent(sorted(by_study)) if absent is not None and by_study else []
    if unsummarised:
        doc.notes.append(f"stores of {', '.join(unsummarised)} are listed under provenance but not summarised "
                         "in a section (their study's notebooks analyse them)")
    if not doc.sections:
        doc.notes.append("no stored rows to summarise")
    doc.sections.insert(0, _how_section(doc, how, level))
    prov = [_provenance(st) for st in found]
    title = title or "Fragility report"
    meta = (f"mmfragile {__version__} (version that wrote this report); {len(found)} store(s); bootstrap over questions: "
            f"{n_boot} draws, seed {seed}, {int(level * 100)} % intervals.")
    out = Path(out)
    (out / "figures").mkdir(parents=True, exist_ok=True)
    fig_paths = {}
    for s in doc.sections:
        for b in s.blocks:
            if isinstance(b, Figure):
                (out / "figures" / f"{b.id}.png").write_bytes(b.png)
                fig_paths[b.id] = f"figures/{b.id}.png"
    html_path, md_path, json_path = out / "report.html", out / "report.md", out / "report.json"
    # the report is the file users send to co-authors: no secret in it, whatever the stores held (redaction)
    html_path.write_text(redact(_render_html(doc, title, meta, prov)), encoding="utf-8")
    md_path.write_text(redact(_render_md(doc, title, meta, prov, fig_paths)), encoding="utf-8")
    payload = {"title": title, "mmfragile_version": __version__, "n_boot": n_boot, "seed": seed, "level": level,
               "stores": [_rel(s.root) for s in found], "metrics": doc.metrics,
               "figures": list(fig_paths.values()), "provenance": prov, "notes": doc.notes}
    json_path.write_text(redact(json.dumps(payload, indent=1, sort_keys=True, default=str)), encoding="utf-8")
    return Report(out, html_path, md_path, json_path, doc.metrics, list(fig_paths.values()), prov, doc.notes)


def report_for_profile(pipeline: str | Path, profile: str = "default", screenshot: bool = True) -> Report | None:
    """The report entry of a pipeline file (``report: {default: {stores: [...], out: ..., screenshot: ...}}``)
    for ``profile``: build it from the stores that exist (None if the profile has no entry or no store)."""
    import yaml

    from mmfragile.grid import REPO_ROOT, for_profile

    spec = yaml.safe_load(Path(pipeline).read_text())
    entry = for_profile(spec.get("report"), profile) if isinstance(spec, dict) else None
    if not entry:
        return None
    root = Path(REPO_ROOT)
    paths = [root / p for p in entry.get("stores", []) if (root / p).exists()]
    if not paths:
        print(f"report: none of the stores {entry.get('stores')} exist; no report written")
        return None
    rep = build_report(paths, root / entry["out"], title=entry.get("title"))
    print(f"report: {rep.html}")
    shot = entry.get("screenshot")
    if screenshot and shot:
        from mmfragile.report.browser import BrowserUnavailable, screenshot_page

        try:
            screenshot_page(rep.html, root / shot, height=entry.get("screenshot_height", 2200))
            print(f"report screenshot: {root / shot}")
        except BrowserUnavailable as e:
            print(f"report: no screenshot ({e})")
    return rep
