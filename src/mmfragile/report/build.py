"""Compute and render the fragility report (see :mod:`mmfragile.report`).

Numbers come from the metric functions - :func:`mmfragile.studies.format_bias.metrics.format_scores`,
:func:`~mmfragile.studies.format_bias.metrics.coverage_by_factor`, :func:`~mmfragile.studies.format_bias.metrics.format_ranks`,
:func:`~mmfragile.studies.format_bias.metrics.rank_distribution`, :func:`~mmfragile.studies.format_bias.metrics.pseudo_gt`,
:func:`mmfragile.studies.format_bias.fit_lmm_with_fallback`, :func:`mmfragile.studies.promptception.accuracy_frame`,
:func:`~mmfragile.studies.promptception.metrics.baseline_accuracy`, :func:`~mmfragile.studies.promptception.metrics.trimmed_means`,
:func:`mmfragile.studies.judgebias.metrics.bias_scores`, :func:`mmfragile.studies.judgebias.parse_failure_table`,
:func:`mmfragile.budget.estimate_store` - and only the intervals are added here: a percentile bootstrap that
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
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from mmfragile.store import ResultStore

DEFAULT_N_BOOT = 1000
DEFAULT_SEED = 0
LEVEL = 0.95
NOT_RECORDED = "not recorded"


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


def _weights(n_q: int, n_boot: int, seed: int) -> np.ndarray:
    """Bootstrap draws of ``n_q`` questions as multiplicities (n_boot x n_q)."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n_q, np.full(n_q, 1.0 / n_q), size=n_boot).astype(float)


def _ratio(W: np.ndarray, hits: np.ndarray, n: np.ndarray) -> np.ndarray:
    """100 x resampled hits / resampled counts: W (boot x q) with hits / n (variants x q) -> boot x variants."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return 100.0 * (W @ hits.T) / (W @ n.T)


def _ci(draws: np.ndarray, level: float = LEVEL, axis: int = 0) -> tuple[Any, Any]:
    a = 100 * (1 - level) / 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        lo, hi = np.nanpercentile(draws, [a, 100 - a], axis=axis)
    return lo, hi


def _f(v: Any) -> float | None:
    if v is None:
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) or math.isinf(x) else x


def _matrix(df: pd.DataFrame, variant: str, questions: Sequence[str], variants: Sequence[str],
            hit_col: str = "correct", n_col: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(hits, counts) as variants x questions arrays from per-row outcomes."""
    d = pd.DataFrame({"v": df[variant].astype(str).to_numpy(), "q": df["question_id"].astype(str).to_numpy(),
                      "h": df[hit_col].astype(float).to_numpy(),
                      "n": np.ones(len(df)) if n_col is None else df[n_col].astype(float).to_numpy()})
    g = d.groupby(["v", "q"], sort=False)[["h", "n"]].sum()
    hits = g["h"].unstack("q").reindex(index=list(variants), columns=list(questions)).fillna(0.0).to_numpy()
    n = g["n"].unstack("q").reindex(index=list(variants), columns=list(questions)).fillna(0.0).to_numpy()
    return hits, n


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


def _txt(s: str) -> Cell:
    return Cell([(str(s), None, None)])


class _Doc:
    """Collects numbers (with their keys) and blocks while the sections are computed."""

    def __init__(self, digits: int = 1):
        self.metrics: dict[str, float | None] = {}
        self.digits = digits
        self.sections: list[Section] = []
        self.notes: list[str] = []
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
        v = _f(value)
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


def _figure(doc: _Doc, sec: Section, fid: str, title: str, make, caption: str = "") -> None:
    """Add a figure; a figure that fails to draw is reported in the notes, not raised."""
    try:
        fig = make()
    except Exception as e:  # noqa: BLE001 - a figure must not sink the report
        doc.notes.append(f"figure '{title}' could not be drawn: {type(e).__name__}: {e}")
        return
    if fig is None:
        return
    sec.blocks.append(Figure(doc.uid("fig-" + fid), title, _png(fig), caption))


def _distribution_figure(groups: list[dict], xlabel: str, title: str, std_label: str):
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
        found = [p] if _is_store(p) else sorted(c.parent for c in p.rglob("config.json") if _is_store(c.parent))
        if not found:
            raise FileNotFoundError(f"{p}: no result store (a folder with config.json and parts/) in it")
        for s in found:
            out.setdefault(s.resolve(), ResultStore(s))
    return list(out.values())


def _study(store: ResultStore) -> str:
    return str(store.config.get("study", "format-bias"))


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


def _store_rows(store: ResultStore, labels: Mapping[tuple[Path, str], str]) -> pd.DataFrame:
    """The store's rows, the model relabelled where :func:`model_labels` says."""
    df = store.read()
    mine = {name: label for (root, name), label in labels.items() if root == store.root}
    if mine and "model" in df:
        df["model"] = df["model"].astype(str).replace(mine)
    return df


def _read(stores: Sequence[ResultStore]) -> pd.DataFrame:
    frames = []
    labels = model_labels(stores)[0]
    for st in stores:
        df = _store_rows(st, labels)
        if len(df):
            frames.append(df.assign(_store=str(st.root)))
    if not frames:
        return pd.DataFrame()
    df = pd.concat(frames, ignore_index=True)
    key = [c for c in ("model", "dataset", "question_id", "variant") if c in df.columns]
    return df[~df[key].astype(str).duplicated(keep="first")].reset_index(drop=True)


# ================================================================================================ shared pieces
def _stats_row(doc: _Doc, prefix: str, point: Mapping[str, Any], boot: Mapping[str, np.ndarray],
               level: float) -> list[Cell]:
    cells = []
    for s in ("mean", "median", "iqr", "worst5", "spread"):
        lo, hi = _ci(boot[s], level)
        cells.append(doc.ci(f"{prefix}/{s}", point[s], lo, hi))
    return cells


def _ranking(doc: _Doc, sec: Section, kind: str, ds: str, per_model: dict[str, dict], unit_name: str,
             n_boot: int, seed: int, level: float, point_rank_by_unit: pd.DataFrame,
             point_mean_rank: Mapping[str, int], rank_dist: pd.DataFrame) -> dict[str, dict]:
    """Model ranking within dataset ``ds``: rank by the mean over variants (with a bootstrap interval and the
    probability of being best) and per variant. ``per_model[m]`` = {"frame", "variant", ...} outcomes."""
    models = list(per_model)
    common_q = sorted(set.intersection(*(set(v["frame"]["question_id"].astype(str)) for v in per_model.values())))
    common_v = sorted(set.intersection(*(set(v["frame"][v["variant"]].astype(str)) for v in per_model.values())))
    if not common_q or not common_v:
        sec.blocks.append(Paragraph([_txt(f"{ds}: the models share no questions / {unit_name}s; no ranking.")]))
        return {}
    W = _weights(len(common_q), n_boot, seed)
    boot = []
    for m in models:
        pm_ = per_model[m]
        hits, n = _matrix(pm_["frame"], pm_["variant"], common_q, common_v, pm_.get("hit", "correct"), pm_.get("n"))
        boot.append(_ratio(W, hits, n))                                   # boot x variants
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
        out[m] = {"rank": point_mean_rank.get(m), "p_best": p_best, "share_rank1": share1}
        rows.append([_txt(m), doc.count(f"{base}/rank", point_mean_rank.get(m)),
                     Cell([("[", None, None), doc.span(f"{base}/rank_lo", lo, 0), (", ", None, None),
                           doc.span(f"{base}/rank_hi", hi, 0), ("]", None, None)]),
                     doc.num(f"{base}/p_best", p_best, 2),
                     doc.num(f"{base}/share_rank1", 100 * share1, 0, " %"),
                     doc.num(f"{base}/median_rank", med, 1),
                     Cell([doc.span(f"{base}/min_rank", rmin, 0), ("-", None, None), doc.span(f"{base}/max_rank", rmax, 0)])])
    sec.blocks.append(Table(doc.uid(f"rank-{kind}-{ds}"), f"Model ranking on {ds} (by the mean over {unit_name}s)",
                            ["model", "rank", f"{int(level * 100)} % rank interval", "P(best)",
                             f"{unit_name}s ranked 1st", f"median rank over {unit_name}s",
                             f"rank range over {unit_name}s"], rows,
                            note=f"Rank intervals and P(best): bootstrap over the {len(common_q)} questions all models "
                                 f"share ({n_boot} draws, seed {seed}); ranks are competition ranks, 1 = best."))
    # per variant, collapsed
    prow = []
    pr = point_rank_by_unit.set_index(["unit", "model"])["rank"]
    for j, u in enumerate(common_v):
        for i, m in enumerate(models):
            base = metric_key("ranking", kind, ds, u, m)
            lo, hi = np.quantile(r_unit[i, :, j], [a, 1 - a], method="inverted_cdf")
            rk = pr.get((u, m), np.nan)
            prow.append([_txt(u), _txt(m), doc.count(f"{base}/rank", rk),
                         Cell([("[", None, None), doc.span(f"{base}/rank_lo", lo, 0), (", ", None, None),
                               doc.span(f"{base}/rank_hi", hi, 0), ("]", None, None)]),
                         doc.num(f"{base}/p_best", float((r_unit[i, :, j] == 1).mean()), 2)])
    sec.blocks.append(Table(doc.uid(f"rank-{kind}-{ds}-per-unit"), f"Ranking per {unit_name} on {ds}",
                            [unit_name, "model", "rank", f"{int(level * 100)} % rank interval", "P(best)"], prow,
                            collapsed=True))
    return out


# ================================================================================================ study 1
def _format_section(doc: _Doc, stores: list[ResultStore], n_boot: int, seed: int, level: float,
                    budget_draws: int | None) -> tuple[Section | None, list[dict]]:
    from mmfragile.studies.format_bias import metrics as fb
    from mmfragile.studies.format_bias import plots as fbp
    from mmfragile.studies import format_bias as fbs

    raw = _read(stores)
    if raw.empty:
        return None, []
    sec = Section("format-bias", "Study 1 - prompt-format bias in MC-VQA")
    pq = fbs.results_to_metrics_frame(raw, include_standard=True)
    grid = fbs.grid_rows(pq)
    groups = list(dict.fromkeys(zip(pq["model"].astype(str), pq["dataset"].astype(str))))
    complete, budgeted = [], []
    for m, ds in groups:
        g = grid[(grid["model"].astype(str) == m) & (grid["dataset"].astype(str) == ds)]
        n_fmt = g["format"].nunique()
        per_q = g.groupby("question_id")["n_options"].agg(["size", "first"])
        (budgeted if (per_q["size"] < n_fmt * per_q["first"]).any() else complete).append((m, ds))
    how: list[dict] = []
    sel = lambda df, keys: df[[(str(a), str(b)) in keys for a, b in zip(df["model"], df["dataset"])]]  # noqa: E731
    scores = fb.format_scores(sel(grid, set(complete))) if complete else pd.DataFrame()
    if complete:
        rows, dist_groups = [], []
        for m, ds in complete:
            g = grid[(grid["model"].astype(str) == m) & (grid["dataset"].astype(str) == ds)]
            s = scores[(scores["model"].astype(str) == m) & (scores["dataset"].astype(str) == ds)]
            st = fbs.standard_rows(sel(pq, {(m, ds)}))
            fmt_names = [f"{a}-{b}-{c}" for a, b, c in zip(s["option_ids"], s["delimiter"], s["separator"])]
            g = g.assign(_fmt=g["option_ids"].astype(str) + "-" + g["delimiter"].astype(str) + "-" + g["separator"].astype(str))
            questions = sorted(g["question_id"].astype(str).unique())
            hits, n = _matrix(g, "_fmt", questions, fmt_names)
            W = _weights(len(questions), n_boot, seed)
            B = _ratio(W, hits, n)                                        # boot x formats
            point = variant_statistics(s["accuracy"].to_numpy())
            boot = variant_statistics(B, axis=1)
            prefix = metric_key("formats", m, ds)
            std_acc = float(st["correct"].mean() * 100) if len(st) else float("nan")
            if len(st):
                sh, sn = _matrix(st.assign(_v="standard"), "_v", questions, ["standard"])
                std_boot = _ratio(W, sh, sn)[:, 0]
            else:
                std_boot = np.full(n_boot, np.nan)
            ibest, iworst = int(np.argmax(s["accuracy"].to_numpy())), int(np.argmin(s["accuracy"].to_numpy()))
            lo, hi = _ci(std_boot, level)
            gap_lo, gap_hi = _ci(std_boot - boot["mean"], level)
            row = [_txt(m), _txt(ds), doc.count(f"{prefix}/n_questions", len(questions)),
                   doc.count(f"{prefix}/n_formats", len(fmt_names)), doc.ci(f"{prefix}/standard", std_acc, lo, hi, cls="std")]
            row += _stats_row(doc, prefix, point, boot, level)
            row += [Cell([doc.span(f"{prefix}/max", point["max"]), (f" ({fmt_names[ibest]})", None, None)]),
                    Cell([doc.span(f"{prefix}/min", point["min"]), (f" ({fmt_names[iworst]})", None, None)]),
                    doc.ci(f"{prefix}/standard_minus_mean", std_acc - point["mean"], gap_lo, gap_hi)]
            for k in ("q25", "q75"):
                doc.put(f"{prefix}/{k}", point[k])
            rows.append(row)
            dist_groups.append({"label": f"{m}\n{ds}", "values": s["accuracy"].to_numpy(),
                                "standard": None if math.isnan(std_acc) else std_acc})
            how.append({"study": "formats", "model": m, "dataset": ds, "prefix": prefix, "n_variants": len(fmt_names),
                        "best_name": fmt_names[ibest], "standard_is_variant": bool(st["is_standard"].any()) if len(st) else False})
        sec.blocks.append(Table(doc.uid("formats-scores"), "Accuracy (%): standard format beside the distribution over formats",
                                ["model", "dataset", "questions", "formats", "standard format", "mean", "median", "IQR",
                                 "worst 5 %", "spread (max-min)", "best format", "worst format",
                                 "standard - mean (pp)"], rows,
                                note=f"[{int(level * 100)} % bootstrap interval over questions, {n_boot} draws, seed "
                                     f"{seed}; all circular shifts of a question drawn together.] Standard format: the "
                                     "'standard' variant where it was run, else the dataset's standard format in the "
                                     "grid (Tab. 5). Accuracy per format = circular evaluation (each shift counts)."))
        _figure(doc, sec, "formats-distribution", "Accuracy over prompt formats",
                lambda: _distribution_figure(dist_groups, "accuracy (%)", "Accuracy over the prompt formats "
                                             "(one dot per format)", "standard format"),
                "Quote the distribution (mean, IQR, worst 5 %), not the best format.")
        _figure(doc, sec, "formats-ci", "Accuracy per format with bootstrap intervals",
                lambda: fbp.plot_format_accuracy_ci(fb.format_accuracy_ci(sel(grid, set(complete)), level=level,
                                                                           n_boot=n_boot, seed=seed)))
        # ---- coverage by factor
        cov = fb.coverage_by_factor(scores)
        levels = [(f, l) for f in fb.FACTORS for l in fb.LEVELS[f] if ((cov["factor"] == f) & (cov["level"] == l)).any()]
        crow, collapses = [], []
        for m, ds in complete:
            c = cov[(cov["model"].astype(str) == m) & (cov["dataset"].astype(str) == ds)].set_index(["factor", "level"])
            r = [_txt(m), _txt(ds)]
            for f, l in levels:
                v = c["coverage"].get((f, l), np.nan)
                low = _f(v) is not None and v < fb.COVERAGE_THRESHOLD
                r.append(doc.num(metric_key("coverage", m, ds, f, l), v, 0, cls="collapse" if low else ""))
                if low:
                    collapses.append(f"{m} / {ds}: {fb.FACTOR_LABELS[f]} = {fb.LEVEL_LABELS.get(l, l)} ({v:.0f} %)")
            crow.append(r)
        sec.blocks.append(Table(doc.uid("formats-coverage"), "Coverage (%) by factor level: where answers stop being option IDs",
                                ["model", "dataset"] + [f"{fb.FACTOR_LABELS[f].replace('Option ', '')}: "
                                                        f"{fb.LEVEL_LABELS.get(l, l)}" for f, l in levels], crow,
                                note=f"Mean coverage over the formats with that level (coverage_by_factor). Red: below "
                                     f"{fb.COVERAGE_THRESHOLD:.0f} % (a collapse: accuracy there measures instruction "
                                     "following, not the task)."))
        sec.blocks.append(Paragraph([_txt("Coverage collapses: " + ("; ".join(collapses) if collapses else
                                                                    f"none (every factor level >= {fb.COVERAGE_THRESHOLD:.0f} %)."))]))
        for h in how:
            h["collapses"] = [c for c in collapses if c.startswith(f"{h['model']} / {h['dataset']}:")]
        _figure(doc, sec, "formats-coverage", "Coverage per factor level", lambda: fbp.plot_coverage_heatmap(cov))
        # ---- ranking
        ranks = fb.format_ranks(scores)
        rd = fb.rank_distribution(ranks)
        pg = fb.pseudo_gt(scores)
        for ds in dict.fromkeys(d for _, d in complete):
            ms = [m for m, d in complete if d == ds]
            if len(ms) < 2:
                continue
            r_ds = ranks[ranks["dataset"].astype(str) == ds]
            unit_rank = pd.DataFrame({"unit": r_ds["option_ids"].astype(str) + "-" + r_ds["delimiter"].astype(str) + "-"
                                      + r_ds["separator"].astype(str), "model": r_ds["model"].astype(str),
                                      "rank": r_ds["rank"]})
            per_model = {}
            for m in ms:
                g = grid[(grid["model"].astype(str) == m) & (grid["dataset"].astype(str) == ds)]
                per_model[m] = {"frame": g.assign(_fmt=g["option_ids"].astype(str) + "-" + g["delimiter"].astype(str)
                                                  + "-" + g["separator"].astype(str)), "variant": "_fmt"}
            pg_ds = pg[pg["dataset"].astype(str) == ds]
            res = _ranking(doc, sec, "formats", ds, per_model, "format", n_boot, seed, level, unit_rank,
                           dict(zip(pg_ds["model"].astype(str), pg_ds["rank"].astype(int))),
                           rd[rd["dataset"].astype(str) == ds])
            for h in how:
                if h["dataset"] == ds and h["model"] in res:
                    h["ranking"] = res
        if any(len([m for m, d in complete if d == ds]) > 1 for ds in {d for _, d in complete}):
            _figure(doc, sec, "formats-ranks", "Model ranks across formats",
                    lambda: fbp.plot_rank_distribution(ranks, include_ideal=False))
        # ---- mixed model
        try:
            lmm = fbs.fit_lmm_with_fallback(scores, alpha=1 - level)
        except (ValueError, KeyError) as e:
            sec.blocks.append(Paragraph([_txt(f"Mixed model not fitted: {e}")]))
            lmm = None
        if lmm is not None:
            lrow, sig = [], []
            for t in lmm.itertuples():
                base = metric_key("lmm", t.factor, t.level or "intercept")
                name = "intercept" if t.factor == "intercept" else f"{fb.FACTOR_LABELS.get(t.factor, t.factor)}: {fb.LEVEL_LABELS.get(t.level, t.level)}"
                lrow.append([_txt(name), doc.ci(f"{base}/coef", t.coef, t.ci_low, t.ci_high, 2),
                             doc.num(f"{base}/p_value", t.p_value, 4), _txt("yes" if t.significant else "no")])
                if t.significant and t.factor != "intercept":
                    sig.append((name, base, t.coef))
            method = lmm.attrs.get("method", "")
            fb_reason = lmm.attrs.get("fallback")
            sec.blocks.append(Table(doc.uid("formats-lmm"), "Mixed model: accuracy ~ option IDs + delimiter + separator + (1 | model:dataset)",
                                    ["term (vs lowercase / bracket / comma)", f"coefficient, pp [{int(level * 100)} % CI]",
                                     "p", f"significant (p < {1 - level:.2f})"], lrow,
                                    note=f"{method}; {lmm.attrs.get('n_groups')} model x dataset group(s), "
                                         f"{lmm.attrs.get('n_obs')} format scores"
                                         + (f"; fallback to pooled OLS: {fb_reason}" if fb_reason else "")))
            sec.blocks.append(Paragraph([Cell([("Significant factors: ", None, None)] + (
                [p for k, (name, base, coef) in enumerate(sig) for p in
                 ([(", ", None, None)] if k else []) + [(f"{name} (", None, None), doc.span(f"{base}/coef", coef, 2),
                                                         (" pp)", None, None)]]
                if sig else [("none at this sample size.", None, None)]))]))
            for h in how:
                h["lmm_sig"] = sig
            _figure(doc, sec, "formats-lmm", "Mixed-model coefficients", lambda: fbp.plot_lmm_coefficients(lmm))
    if budgeted:
        _budget_block(doc, sec, sel(raw, set(budgeted)), "format-bias", "formats", "format", budget_draws, how)
    return sec, how


# ================================================================================================ budgets
def _budget_block(doc: _Doc, sec: Section, rows: pd.DataFrame, study: str, kind: str, unit: str,
                  n_draws: int | None, how: list[dict]) -> None:
    """The budgeted / incomplete grids of a study: :func:`mmfragile.budget.estimate_store` with its own settings
    (level, draws, seed - not the report's bootstrap seed), so the numbers equal ``mmfragile run --budget``'s."""
    from mmfragile.budget import STORE_DRAWS, STORE_SEED, estimate_store
    from mmfragile.budget.estimator import STATISTICS
    from mmfragile.budget.plots import plot_unit_estimates

    n_draws = STORE_DRAWS if n_draws is None else n_draws
    try:
        est = estimate_store(rows.drop(columns=["_store"], errors="ignore"), study, n_draws=n_draws)
    except Exception as e:  # noqa: BLE001
        sec.blocks.append(Paragraph([_txt(f"Budgeted / incomplete grid: estimate failed ({type(e).__name__}: {e})")]))
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
        r = [_txt(m), _txt(ds), Cell([doc.span(f"{prefix}/n_observed", bm["n_observed"], 0), (" / ", None, None),
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
        how.append({"study": kind, "model": m, "dataset": ds, "prefix": prefix, "budgeted": True, "level": est.level,
                    "n_variants": int(est.units[np.logical_and.reduce([est.units[c].astype(str) == str(v)
                                                                       for c, v in gd.items()])].shape[0])})
        u = est.units[np.logical_and.reduce([est.units[c].astype(str) == str(v) for c, v in gd.items()])]
        _figure(doc, sec, f"budget-{kind}-{m}-{ds}", f"Budgeted estimate per {unit}: {m} on {ds}",
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
            rrows.append([_txt(getattr(t, "dataset", "")), _txt(getattr(t, est.spec.unit)), _txt(t.model),
                          doc.count(f"{base}/rank", t.rank),
                          Cell([("[", None, None), doc.span(f"{base}/rank_lo", t.rank_lo, 0), (", ", None, None),
                                doc.span(f"{base}/rank_hi", t.rank_hi, 0), ("]", None, None)]),
                          doc.num(f"{base}/p_best", t.p_rank1, 2)])
        sec.blocks.append(Table(doc.uid(f"budget-{kind}-ranks"), f"Budgeted: model ranking per {unit}",
                                ["dataset", unit, "model", "rank", "rank interval", "P(best)"], rrows, collapsed=True))


# ================================================================================================ study 2
def _prompt_section(doc: _Doc, stores: list[ResultStore], n_boot: int, seed: int, level: float,
                    budget_draws: int | None) -> tuple[Section | None, list[dict]]:
    from mmfragile.studies.promptception import metrics as pm
    from mmfragile.studies.promptception.prompts import get_prompt_type
    from mmfragile.studies import promptception as pcs

    frames = []
    labels = model_labels(stores)[0]
    for st in stores:
        df = _store_rows(st, labels)
        if len(df):
            frames.append(df.assign(exclude_refusals=bool(st.config.get("exclude_refusals", False)), _store=str(st.root)))
    if not frames:
        return None, []
    raw = pd.concat(frames, ignore_index=True)
    sec = Section("promptception", "Study 2 - Promptception: prompt sensitivity")
    how: list[dict] = []
    raw["prompt_id"] = raw["prompt_id"].astype(str)
    groups = list(dict.fromkeys(zip(raw["model"].astype(str), raw["dataset"].astype(str))))
    complete, budgeted = [], []
    for m, ds in groups:
        g = raw[(raw["model"].astype(str) == m) & (raw["dataset"].astype(str) == ds)]
        pids = sorted(set(g["prompt_id"]) - {pm.BASELINE_LABEL})
        missing = False
        for q, gq in g.groupby("question_id"):
            mod = str(gq["modality"].iloc[0]) if "modality" in gq else "image"
            expected = {p for p in pids if _supports(get_prompt_type, p, mod)}
            if not expected <= set(gq["prompt_id"]):
                missing = True
                break
        (budgeted if missing else complete).append((m, ds))
    sel = lambda df, keys: df[[(str(a), str(b)) in keys for a, b in zip(df["model"], df["dataset"])]]  # noqa: E731
    if complete:
        rc = sel(raw, set(complete))
        acc = pcs.accuracy_frame(rc.drop(columns=["_store"]), benchmark_by="dataset")
        base = pm.baseline_accuracy(acc)
        tm = pm.trimmed_means(acc)
        rows, dist_groups = [], []
        for m, ds in complete:
            a = pm._prompts_only(acc[(acc["model"].astype(str) == m) & (acc["benchmark"].astype(str) == ds)])
            a = a[a["n"] > 0]
            g = rc[(rc["model"].astype(str) == m) & (rc["dataset"].astype(str) == ds)]
            excl = g["exclude_refusals"].astype(bool) & g.get("refusal", pd.Series(False, index=g.index)).astype(bool)
            g = g.assign(_h=(g["correct"].astype(bool) & ~excl).astype(float), _n=(~excl).astype(float))
            questions = sorted(g["question_id"].astype(str).unique())
            pids = list(a["prompt_id"])
            hits, n = _matrix(g, "prompt_id", questions, pids, "_h", "_n")
            W = _weights(len(questions), n_boot, seed)
            B = _ratio(W, hits, n)
            point = variant_statistics(a["accuracy"].to_numpy())
            boot = variant_statistics(B, axis=1)
            prefix = metric_key("prompts", m, ds)
            b_id = pm.BASELINE_LABEL if (g["prompt_id"] == pm.BASELINE_LABEL).any() else pm.BASELINE_PROMPT
            bh, bn = _matrix(g, "prompt_id", questions, [b_id], "_h", "_n")
            b_boot = _ratio(W, bh, bn)[:, 0]
            b_val = float(base[(base["model"].astype(str) == m) & (base["benchmark"].astype(str) == ds)]["baseline"].iloc[0])
            t_val = float(tm[(tm["model"].astype(str) == m) & (tm["benchmark"].astype(str) == ds)]["trimmed_mean"].iloc[0])
            t_boot = np.array([pm.trimmed_mean(r[~np.isnan(r)]) if (~np.isnan(r)).any() else np.nan for r in B])
            lo, hi = _ci(b_boot, level)
            tlo, thi = _ci(t_boot, level)
            ibest, iworst = int(np.argmax(a["accuracy"].to_numpy())), int(np.argmin(a["accuracy"].to_numpy()))
            row = [_txt(m), _txt(ds), doc.count(f"{prefix}/n_questions", len(questions)),
                   doc.count(f"{prefix}/n_prompts", len(pids)), doc.ci(f"{prefix}/baseline", b_val, lo, hi, cls="std"),
                   doc.ci(f"{prefix}/trimmed_mean", t_val, tlo, thi)]
            row += _stats_row(doc, prefix, point, boot, level)
            row += [Cell([doc.span(f"{prefix}/max", point["max"]), (f" ({pids[ibest]})", None, None)]),
                    Cell([doc.span(f"{prefix}/min", point["min"]), (f" ({pids[iworst]})", None, None)])]
            for k in ("q25", "q75"):
                doc.put(f"{prefix}/{k}", point[k])
            rows.append(row)
            dist_groups.append({"label": f"{m}\n{ds}", "values": a["accuracy"].to_numpy(), "standard": b_val})
            how.append({"study": "prompts", "model": m, "dataset": ds, "prefix": prefix, "n_variants": len(pids),
                        "best_name": pids[ibest]})
        sec.blocks.append(Table(doc.uid("prompts-scores"), "Accuracy (%): base prompt beside the distribution over prompts",
                                ["model", "benchmark", "questions", "prompts", "base prompt (1.1)", "trimmed mean (10 %)",
                                 "mean", "median", "IQR", "worst 5 %", "spread (max-min)", "best prompt", "worst prompt"],
                                rows, note=f"[{int(level * 100)} % bootstrap interval over questions, {n_boot} draws, seed "
                                           f"{seed}.] Unresolved answers count as wrong (App. E); refusals are left out "
                                           "only for stores run with exclude_refusals."))
        _figure(doc, sec, "prompts-distribution", "Accuracy over prompts",
                lambda: _distribution_figure(dist_groups, "accuracy (%)", "Accuracy over the prompt types (one dot per "
                                             "prompt)", "base prompt 1.1"))
        # coverage (answer extracted) by category
        crow, collapses = [], []
        cats = sorted({pm.prompt_category(p) for p in rc["prompt_id"] if p != pm.BASELINE_LABEL})
        for m, ds in complete:
            g = rc[(rc["model"].astype(str) == m) & (rc["dataset"].astype(str) == ds) & (rc["prompt_id"] != pm.BASELINE_LABEL)]
            cov = (g.assign(_c=g["prompt_id"].map(pm.prompt_category))
                   .groupby("_c")["covered"].apply(lambda s: 100 * s.astype(bool).mean()))
            r = [_txt(m), _txt(ds)]
            for c in cats:
                v = cov.get(c, np.nan)
                low = _f(v) is not None and v < 75
                r.append(doc.num(metric_key("coverage", m, ds, "category", c), v, 0, cls="collapse" if low else ""))
                if low:
                    collapses.append(f"{m} / {ds}: category {_category(c)} ({v:.0f} %)")
            crow.append(r)
        sec.blocks.append(Table(doc.uid("prompts-coverage"), "Answer extracted (%) by prompt category",
                                ["model", "benchmark"] + [_category(c) for c in cats], crow,
                                note="Share of responses from which a letter was extracted (stage 1 regex / option-text "
                                     "match, or stage 2). Red: below 75 %."))
        sec.blocks.append(Paragraph([_txt("Coverage collapses: " + ("; ".join(collapses) if collapses else "none."))]))
        for h in how:
            h["collapses"] = [c for c in collapses if c.startswith(f"{h['model']} / {h['dataset']}:")]
        for ds in dict.fromkeys(d for _, d in complete):
            ms = [m for m, d in complete if d == ds]
            if len(ms) < 2:
                continue
            a_ds = pm._prompts_only(acc[acc["benchmark"].astype(str) == ds])
            a_ds = a_ds.assign(rank=a_ds.groupby("prompt_id")["accuracy"].rank(method="min", ascending=False))
            mean_acc = a_ds.groupby("model")["accuracy"].mean()
            mean_rank = mean_acc.rank(method="min", ascending=False).astype(int)
            rd = []
            for mm, gg in a_ds.groupby("model"):
                counts = gg["rank"].astype(int).value_counts()
                rd.append(dict(model=mm, rank=1, share=counts.get(1, 0) / len(gg), median_rank=gg["rank"].median(),
                               min_rank=int(gg["rank"].min()), max_rank=int(gg["rank"].max())))
            per_model = {}
            for m in ms:
                g = rc[(rc["model"].astype(str) == m) & (rc["dataset"].astype(str) == ds) & (rc["prompt_id"] != pm.BASELINE_LABEL)]
                excl = g["exclude_refusals"].astype(bool) & g.get("refusal", pd.Series(False, index=g.index)).astype(bool)
                per_model[m] = {"frame": g.assign(_h=(g["correct"].astype(bool) & ~excl).astype(float),
                                                  _n=(~excl).astype(float)), "variant": "prompt_id", "hit": "_h", "n": "_n"}
            res = _ranking(doc, sec, "prompts", ds, per_model, "prompt", n_boot, seed, level,
                           a_ds.rename(columns={"prompt_id": "unit"})[["unit", "model", "rank"]].astype({"model": str}),
                           {str(k): int(v) for k, v in mean_rank.items()}, pd.DataFrame(rd).astype({"model": str}))
            for h in how:
                if h["dataset"] == ds and h["model"] in res:
                    h["ranking"] = res
        sec.blocks.append(Paragraph([_txt("The mixed model of the format factors applies to study 1; for prompts the "
                                          "category-level spread is in the coverage and distribution tables above.")]))
    if budgeted:
        _budget_block(doc, sec, sel(raw, set(budgeted)), "promptception", "prompts", "prompt", budget_draws, how)
    return sec, how


def _category(c: int) -> str:
    """A Promptception category as '<number> <name>' (Table 1)."""
    from mmfragile.studies.promptception.metrics import CATEGORY_NAMES

    return f"{c} {CATEGORY_NAMES[int(c)]}"


def _supports(get_prompt_type, pid: str, modality: str) -> bool:
    try:
        return bool(get_prompt_type(pid).supports(modality))
    except Exception:  # noqa: BLE001 - an unknown prompt id: expected everywhere
        return True


# ================================================================================================ study 3
def _judge_section(doc: _Doc, stores: list[ResultStore], n_boot: int, seed: int,
                   level: float) -> tuple[Section | None, list[dict]]:
    from mmfragile.studies.judgebias import metrics as jm
    from mmfragile.studies import judgebias as jb

    score_stores = [s for s in stores if s.config.get("kind", "scores") != "pairwise"]
    pair_stores = [s for s in stores if s.config.get("kind") == "pairwise"]
    rows = _read(score_stores)
    if rows.empty:
        return None, []
    jt = jb.judgment_table(rows)
    if jt.empty:
        return None, []
    sec = Section("judgebias", "Study 3 - MM-JudgeBias: judge perturbations")
    bs = jm.bias_scores(jt)
    pairs = jm.paired_scores(jt)
    pf = jb.parse_failure_table(jb.main_rows(rows[rows["prompt_variant"] == "original"])
                                if "prompt_variant" in rows else jb.main_rows(rows), by=("judge", "perturbation"))
    pf_idx = pf.set_index(["judge", "perturbation"]) if len(pf) else None
    how: list[dict] = []
    unparsed: list[str] = []       # judges without one BD / BC value: no judgment pair parsed
    for judge, g in bs.groupby("judge", sort=False):
        trows, vals = [], {}
        for t in g.itertuples():
            p = pairs[(pairs["judge"] == judge) & (pairs["perturbation"] == t.perturbation) & (pairs["status"] == "ok")]
            terms = (jm.bd_terms(p["y"], p["y_hat"]) if t.metric == "BD" else jm.bc_terms(p["y"], p["y_hat"]))
            d = pd.DataFrame({"s": p["sample_id"].astype(str).to_numpy(), "t": np.nan_to_num(terms),
                              "n": (~np.isnan(terms)).astype(float)}).groupby("s")[["t", "n"]].sum()
            if len(d) and d["n"].sum() > 0:
                W = _weights(len(d), n_boot, seed)
                with np.errstate(invalid="ignore", divide="ignore"):
                    boot = (W @ d["t"].to_numpy()) / (W @ d["n"].to_numpy())
                lo, hi = _ci(boot, level)
            else:
                lo = hi = float("nan")
            base = metric_key("judge", judge, t.perturbation)
            vals[t.perturbation] = t.value
            pr = pf_idx.loc[(judge, t.perturbation)] if pf_idx is not None and (judge, t.perturbation) in pf_idx.index else None
            trows.append([_txt(t.perturbation), _txt(t.dimension), _txt(t.metric),
                          doc.ci(f"{base}/value", t.value, lo, hi, 3), doc.count(f"{base}/n_pairs", t.n_pairs),
                          doc.count(f"{base}/n_unparseable", t.n_unparseable), doc.count(f"{base}/n_abstained", t.n_abstained),
                          doc.num(f"{base}/parse_failure_pct", None if pr is None else 100 * pr["parse_failure_rate"], 1)])
        if pf_idx is not None and (judge, "original") in pf_idx.index:
            pr = pf_idx.loc[(judge, "original")]
            trows.append([_txt("original (unbiased)"), _txt(""), _txt(""), _txt(""),
                          doc.count(metric_key("judge", judge, "original", "n"), pr["n"]),
                          doc.count(metric_key("judge", judge, "original", "n_unparseable"), pr["n_unparseable"]),
                          doc.count(metric_key("judge", judge, "original", "n_abstained"), pr["n_abstained"]),
                          doc.num(metric_key("judge", judge, "original", "parse_failure_pct"), 100 * pr["parse_failure_rate"], 1)])
        agg = jm.aggregate_reliability(pd.Series(vals))
        if all(_f(v) is None for v in vals.values()):
            unparsed.append(str(judge))
        sec.blocks.append(Table(doc.uid(f"judge-{judge}"), f"Judge {judge}: BD / BC per perturbation",
                                ["perturbation", "dimension", "metric", f"value [{int(level * 100)} % CI]", "pairs",
                                 "unparseable", "abstained", "parse failures (%)"], trows,
                                note=f"BD (Integrality, Congruity; higher = notices the disruption) and BC (Robustness; "
                                     f"higher = stable). Interval: bootstrap over samples ({n_boot} draws, seed {seed}). "
                                     "Unparseable outputs are never defaulted: their pairs are dropped and counted."))
        sec.blocks.append(Paragraph([Cell([("Reliability (unweighted means of the types): ", None, None)] + [
            p for k, c in enumerate(jm.AGGREGATE_COLUMNS) for p in
            ([("; ", None, None)] if k else []) + [(f"{c} ", None, None),
                                                   doc.span(metric_key("judge", judge, "aggregate", c), agg.get(c), 3)]])]))
        how.append({"study": "judge", "judge": judge, "n_pert": len(g), "agg": agg})
    if unparsed:  # an empty chart would look like a judge that scored 0
        sec.blocks.append(Paragraph([_txt(f"No judgment parsed for {', '.join(unparsed)}: no BD / BC to plot "
                                          "(every pair has an unparseable score - see the parse failures above).")]))
    drawn = bs[~bs["judge"].astype(str).isin(unparsed)]
    if len(drawn):
        _figure(doc, sec, "judge-bias", "BD / BC per perturbation", lambda: _judge_figure(drawn, pairs, doc.metrics))
    if pair_stores:
        prs = _read(pair_stores)
        if len(prs) and "experiment" in prs.columns:
            pft = jb.parse_failure_table(prs, by=("judge", "experiment"))
            r2 = [[_txt(t.judge), _txt(t.experiment), doc.count(metric_key("judge", t.judge, t.experiment, "n"), t.n),
                   doc.count(metric_key("judge", t.judge, t.experiment, "n_unparseable"), t.n_unparseable),
                   doc.num(metric_key("judge", t.judge, t.experiment, "parse_failure_pct"), 100 * t.parse_failure_rate, 1)]
                  for t in pft.itertuples()]
            sec.blocks.append(Table(doc.uid("judge-pairwise"), "Pairwise judgments (position / verbosity): parse failures",
                                    ["judge", "experiment", "judgments", "unparseable", "parse failures (%)"], r2))
    return sec, how


def _judge_figure(bs: pd.DataFrame, pairs: pd.DataFrame, metrics: Mapping[str, float | None]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    judges = list(dict.fromkeys(bs["judge"]))
    perts = list(dict.fromkeys(bs["perturbation"]))
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(perts) + 2), 3.8))
    off = np.linspace(-0.2, 0.2, len(judges)) if len(judges) > 1 else [0.0]
    for o, j in zip(off, judges):
        x, y, lo, hi = [], [], [], []
        for i, p in enumerate(perts):
            k = metric_key("judge", j, p, "value")
            v = metrics.get(k)
            if v is None:
                continue
            x.append(i + o)
            y.append(v)
            lo.append(v - (metrics.get(k + "/ci_low") if metrics.get(k + "/ci_low") is not None else v))
            hi.append((metrics.get(k + "/ci_high") if metrics.get(k + "/ci_high") is not None else v) - v)
        ax.errorbar(x, y, yerr=[lo, hi], fmt="o", capsize=3, label=j)
    metric_of = dict(zip(bs["perturbation"], bs["metric"]))
    ax.set_xticks(range(len(perts)), [f"{p}\n({metric_of[p]})" for p in perts], rotation=30, ha="right", fontsize=7)
    ax.set_ylim(-0.05, 1.05)
    ax.set_ylabel("BD / BC (higher = better)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    ax.set_title("Bias-Deviation / Bias-Conformity per perturbation (bootstrap interval over samples)", fontsize=9)
    fig.tight_layout()
    return fig


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
    fields["study"] = str(cfg.get("study", NOT_RECORDED)) + (f" ({cfg['kind']})" if cfg.get("kind") else "")
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
def _how_section(doc: _Doc, how: list[dict], level: float) -> Section:
    sec = Section("how-to-report", "How to report this")
    L = f"{int(level * 100)} % CI"
    m_ = doc.metrics

    def sp(key: str, digits: int = 1, suffix: str = ""):
        v = m_.get(key)
        return ("n/a" if v is None else f"{v:.{digits}f}{suffix}", key, v)

    for h in how:
        p = h.get("prefix")
        if h["study"] in ("formats", "prompts") and not h.get("budgeted"):
            unit = "format" if h["study"] == "formats" else "prompt"
            std = "standard format" if unit == "format" else "base prompt (1.1)"
            std_key = f"{p}/standard" if unit == "format" else f"{p}/baseline"
            parts = [(f"{h['model']} on {h['dataset']}: quote the distribution over the {h['n_variants']} {unit}s - "
                      "mean ", None, None), sp(f"{p}/mean"), (f" % ({L} ", None, None), sp(f"{p}/mean/ci_low"),
                     ("-", None, None), sp(f"{p}/mean/ci_high"), ("), median ", None, None), sp(f"{p}/median"),
                     (", IQR ", None, None), sp(f"{p}/q25"), ("-", None, None), sp(f"{p}/q75"),
                     (", worst 5 % ", None, None), sp(f"{p}/worst5"), (", spread ", None, None), sp(f"{p}/spread"),
                     (" pp", None, None)]
            if unit == "prompt":
                parts += [(", and the 10 % trimmed mean ", None, None), sp(f"{p}/trimmed_mean"), (" %", None, None)]
            parts += [(f" - beside the {std} (", None, None), sp(std_key), (" %).", None, None)]
            if sp(f"{p}/max")[0] == sp(f"{p}/mean")[0]:  # best = mean as shown: every variant scores the same
                parts += [(f" All {h['n_variants']} {unit}s score the same here (to 0.1 pp): there is no best {unit} to "
                           "single out.", None, None)]
            else:
                parts += [(f" Do not quote the best {unit} ({h['best_name']}, ", None, None), sp(f"{p}/max"),
                          (" %): it was picked after the fact and overstates the mean by ", None, None),
                          (f"{(m_[f'{p}/max'] or 0) - (m_[f'{p}/mean'] or 0):.1f}", None, None), (" pp.", None, None)]
            if unit == "format":
                parts += [(" The standard format differs from the mean by ", None, None),
                          sp(f"{p}/standard_minus_mean"), (f" pp ({L} ", None, None),
                          sp(f"{p}/standard_minus_mean/ci_low"), (" to ", None, None),
                          sp(f"{p}/standard_minus_mean/ci_high"), (").", None, None)]
            if h.get("collapses"):
                parts += [(" Report coverage with accuracy: it collapses for " + "; ".join(
                    c.split(": ", 1)[1] for c in h["collapses"]) + ".", None, None)]
            r = (h.get("ranking") or {}).get(h["model"])
            if r:
                rk = metric_key("ranking", h["study"], h["dataset"], h["model"])
                parts += [(" Rank by the mean: ", None, None), sp(f"{rk}/rank", 0), (" (P(best) ", None, None),
                          sp(f"{rk}/p_best", 2), ("; ranked 1st on ", None, None), sp(f"{rk}/share_rank1", 0),
                          (f" % of the {unit}s) - give the rank interval, not one rank.", None, None)]
            if h.get("lmm_sig"):
                parts += [(" Significant format factors (mixed model): " + ", ".join(n for n, _, _ in h["lmm_sig"])
                           + ".", None, None)]
            sec.blocks.append(Paragraph([Cell(parts)], "how"))
        elif h.get("budgeted"):
            parts = [(f"{h['model']} on {h['dataset']} (budgeted: ", None, None), sp(f"{p}/budget_pct", 1),
                     (" % of the grid run): quote the estimated mean ", None, None), sp(f"{p}/mean"),
                     (f" % ({int(h['level'] * 100)} % interval ", None, None), sp(f"{p}/mean/ci_low"), ("-", None, None),
                     sp(f"{p}/mean/ci_high"), ("), 5th percentile ", None, None), sp(f"{p}/q05"),
                     (" % and the budget spent, and say that the rest of the grid is estimated.", None, None)]
            sec.blocks.append(Paragraph([Cell(parts)], "how"))
        elif h["study"] == "judge":
            j = h["judge"]
            parts = [(f"Judge {j}: report BD (Integrality, Congruity) and BC (Robustness) per perturbation with their "
                      "intervals and the parse failures, not only the overall reliability (", None, None),
                     sp(metric_key("judge", j, "aggregate", "overall"), 3),
                     ("); a BC near 1 can come from a judge that gives every sample the same score, so give the "
                      "inter-sample variance beside it (MM-JudgeBias, Table 2).", None, None)]
            sec.blocks.append(Paragraph([Cell(parts)], "how"))
    sec.blocks.append(Paragraph([_txt(
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


def _render_html(doc: _Doc, title: str, meta: str, prov: list[dict]) -> str:
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


def _render_md(doc: _Doc, title: str, meta: str, prov: list[dict], fig_paths: dict[str, str]) -> str:
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
    by_study: dict[str, list[ResultStore]] = {}
    for st in found:
        by_study.setdefault(_study(st), []).append(st)
    doc = _Doc()
    for group in by_study.values():
        doc.notes += model_labels(group)[1]
    how: list[dict] = []
    for study, fn in (("format-bias", _format_section), ("promptception", _prompt_section)):
        if study in by_study:
            sec, h = fn(doc, by_study[study], n_boot, seed, level, budget_draws)
            if sec is not None:
                doc.sections.append(sec)
                how += h
    if "judgebias" in by_study:
        sec, h = _judge_section(doc, by_study["judgebias"], n_boot, seed, level)
        if sec is not None:
            doc.sections.append(sec)
            how += h
    other = sorted(set(by_study) - {"format-bias", "promptception", "judgebias"})
    if other:
        doc.notes.append(f"stores of {', '.join(other)} are listed under provenance but not summarised "
                         "(e.g. CP-LN log-likelihoods: see notebook 34 for the mitigation comparison)")
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
    html_path.write_text(_render_html(doc, title, meta, prov), encoding="utf-8")
    md_path.write_text(_render_md(doc, title, meta, prov, fig_paths), encoding="utf-8")
    payload = {"title": title, "mmfragile_version": __version__, "n_boot": n_boot, "seed": seed, "level": level,
               "stores": [_rel(s.root) for s in found], "metrics": doc.metrics,
               "figures": list(fig_paths.values()), "provenance": prov, "notes": doc.notes}
    json_path.write_text(json.dumps(payload, indent=1, sort_keys=True, default=str), encoding="utf-8")
    return Report(out, html_path, md_path, json_path, doc.metrics, list(fig_paths.values()), prov, doc.notes)


def report_for_profile(pipeline: str | Path, profile: str = "default", screenshot: bool = True) -> Report | None:
    """The report entry of a pipeline file (``report: {default: {stores: [...], out: ..., screenshot: ...}}``)
    for ``profile``: build it from the stores that exist (None if the profile has no entry or no store)."""
    import yaml

    from mmfragile.grid import REPO_ROOT, _for_profile

    spec = yaml.safe_load(Path(pipeline).read_text())
    entry = _for_profile(spec.get("report"), profile) if isinstance(spec, dict) else None
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
