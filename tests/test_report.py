"""`mmfragile report`: the numbers of report.json / report.html equal the metric functions on the same stores
(hand-made stores with planted, hand-computed score gaps), and the page renders in a real headless browser
(Debian's chromium: no console errors, every figure decoded and non-blank, numbers read back from the DOM)."""
from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mmfragile.studies.format_bias import metrics as fb
from mmfragile.studies.judgebias import metrics as jm
from mmfragile.studies.promptception import metrics as pm
from mmfragile.report import build_report, metric_key
from mmfragile.report.browser import console_errors, dump_dom, find_chromium, screenshot_page
from mmfragile.store import ResultStore
from mmfragile.studies import format_bias as fbs
from mmfragile.studies import judgebias as jb
from mmfragile.studies import promptception as pcs

N_BOOT = 200
# 5 formats: the LMM base (lowercase / bracket / comma), one change of each factor, and the standard format
FORMATS = ["uppercase-dot-line_break", "lowercase-bracket-comma", "uppercase-bracket-comma", "lowercase-dot-comma",
           "lowercase-bracket-line_break"]


# ------------------------------------------------------------------------------------------ hand-made stores
def _fb_rows(model, n_q=4, n_opt=3, pick=lambda q, s, f: 0, dataset="syn"):
    """Run rows (mmfragile.runner.run_items schema): correct canonical option 0, shown at (0 - shift) % O; the
    model picks shown position pick(q, shift, format) (-1 = not an option ID)."""
    from mmfragile.studies.format_bias.prompts import OPTION_ID_SETS, PromptFormat

    fmts = [(PromptFormat.from_name(f), f) for f in FORMATS] + [(PromptFormat("uppercase", "dot", "line_break"), "standard")]
    rows = []
    for q in range(n_q):
        for fmt, name in fmts:
            ids = list(OPTION_ID_SETS[fmt.option_ids][:n_opt])
            for s in range(n_opt):
                ans = (0 - s) % n_opt
                sel = pick(q, s, name)
                rows.append(dict(model=model, dataset=dataset, question_id=f"q{q}", variant=f"{name}|s{s}", format=name,
                                 option_id_set=fmt.option_ids, delimiter=fmt.delimiter, separator=fmt.separator,
                                 shift=s, n_options=n_opt, category="c", modality="image",
                                 raw_output=ids[sel] if sel >= 0 else "???", option_ids=ids, answer_id=ids[ans],
                                 covered=sel >= 0, correct=sel == ans, selected_position=sel,
                                 option_logits=[float(p == sel) for p in range(n_opt)]))
    return rows


def _good(q, s, f):
    """Right everywhere except lowercase-dot-comma (never an option ID) and, on question q3 (all shifts),
    uppercase-bracket-comma."""
    if f == "lowercase-dot-comma":
        return -1
    if f == "uppercase-bracket-comma" and q == 3:
        return (1 - s) % 3
    return (0 - s) % 3


def _make_format_stores(root: Path) -> dict[str, Path]:
    out = {}
    for model, pick in (("good", _good), ("first", lambda q, s, f: 0)):
        skipped = [{"file": "syn.tsv", "row": 7, "reason": "image missing"}] if model == "good" else []
        st = fbs.STUDY.stage_store(fbs.STUDY.folder(root, model, "syn"), "grid", fbs.run_config(model, "syn", 4),
                                   run_info={"n_questions": 4, "skipped_rows": skipped})
        st.pin_run_info("image_policy", {"max_pixels": None, "note": "test"})
        st.append(_fb_rows(model, pick=pick))
        out[model] = st.root
    return out


PROMPTS = ["1.1", "2.1", "5.2", "12.3"]


def _make_prompt_store(root: Path) -> Path:
    rows = []
    for q in range(4):
        for p in PROMPTS:
            ok = {"1.1": True, "2.1": True, "5.2": q < 2, "12.3": False}[p]
            rows.append(dict(model="pmodel", dataset="syn-mc", question_id=f"q{q}", variant=p, prompt_id=p,
                             modality="image", option_ids=["A", "B", "C", "D"], answer_id="A",
                             raw_output="A" if ok else "hmm", predicted="A" if ok else None, correct=ok,
                             covered=p != "12.3", refusal=False, extraction_stage="regex" if p != "12.3" else "none"))
    st = pcs.STUDY.stage_store(pcs.STUDY.folder(root, "pmodel", "syn-mc"), "prompts",
                               pcs.run_config("pmodel", "syn-mc"))
    st.append(rows)
    return st.root


# judge: original score 8 / 6 / 9 per sample, perturbed scores chosen so BD / BC are easy by hand
JUDGE_ORIG = {"s0": 8, "s1": 6, "s2": 9}
JUDGE_PERT = {"text_dominance": {"s0": 1, "s1": 6, "s2": 9},            # BD terms 1, 0, 0 -> 1/3
              "visual_transformation": {"s0": 8, "s1": None, "s2": 9}}   # BC 1, (unparseable), 1 -> 1


def _make_judge_store(root: Path, orig: dict = JUDGE_ORIG, pert: dict = JUDGE_PERT) -> Path:
    rows = []
    for pert, scores in [("original", orig), *pert.items()]:
        for sid, sc in scores.items():
            rows.append(dict(model="judge-a", dataset="synthetic-judge", question_id=sid, variant=f"{pert}|run0|original",
                             judge="judge-a", sample_id=sid, perturbation=pert, run=0, prompt_variant="original",
                             allow_na=False, generator="reference", kind="good", modality="image", gold_score=8.0,
                             raw_output="x", score=float("nan") if sc is None else float(sc),
                             status="unparseable" if sc is None else "ok", parse_error="no score" if sc is None else ""))
    scores_store = jb.STUDY.stage_store(root, "scores", {"seed": 0, "n_samples": 3})
    scores_store.append(rows)
    return scores_store.root


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("report_stores")
    fbs_paths = _make_format_stores(root / "format_bias")
    pstore = _make_prompt_store(root / "promptception")
    jstore = _make_judge_store(root / "judgebias")
    out = tmp_path_factory.mktemp("report_out")
    rep = build_report([root / "format_bias", pstore, jstore], out, n_boot=N_BOOT, seed=0)
    return {"root": root, "fb": fbs_paths, "prompt": pstore, "judge": jstore, "report": rep, "out": out}


# ------------------------------------------------------------------------------------------ numbers
def test_files_and_json(built):
    rep = built["report"]
    for p in (rep.html, rep.markdown, rep.json):
        assert p.exists() and p.stat().st_size > 0
    data = json.loads(rep.json.read_text())
    assert data["metrics"] == rep.metrics and data["seed"] == 0 and data["n_boot"] == N_BOOT
    assert all((built["out"] / f).exists() for f in data["figures"]) and len(data["figures"]) >= 5
    md = rep.markdown.read_text()
    assert "How to report this" in md and "| model | dataset |" in md


def test_format_numbers_equal_the_metric_functions_and_the_planted_values(built):
    m = built["report"].metrics
    raw = pd.concat([ResultStore(p).read() for p in built["fb"].values()], ignore_index=True)
    pq = fbs.results_to_metrics_frame(raw, include_standard=True)
    scores = fb.format_scores(fbs.grid_rows(pq))
    pg = fb.pseudo_gt(scores).set_index("model")
    van = fbs.vanilla_scores(pq).set_index("model")
    for model in ("good", "first"):
        k = metric_key("formats", model, "syn")
        acc = scores[scores.model == model]["accuracy"].to_numpy()
        assert m[f"{k}/mean"] == pytest.approx(pg.loc[model, "accuracy"], abs=1e-12)
        assert m[f"{k}/standard"] == pytest.approx(van.loc[model, "accuracy"], abs=1e-12)
        assert m[f"{k}/median"] == pytest.approx(np.median(acc))
        assert m[f"{k}/worst5"] == pytest.approx(np.percentile(acc, 5))
        assert m[f"{k}/spread"] == pytest.approx(acc.max() - acc.min())
        assert m[f"{k}/iqr"] == pytest.approx(np.percentile(acc, 75) - np.percentile(acc, 25))
        assert m[f"{k}/mean/ci_low"] - 1e-9 <= m[f"{k}/mean"] <= m[f"{k}/mean/ci_high"] + 1e-9
    # planted: "good" = 100 % in 3 formats, 0 % in lowercase-dot-comma, 9/12 in uppercase-bracket-comma (q3 wrong)
    g = metric_key("formats", "good", "syn")
    assert m[f"{g}/mean"] == pytest.approx((300 + 75) / 5)
    assert m[f"{g}/standard"] == 100 and m[f"{g}/max"] == 100 and m[f"{g}/min"] == 0 and m[f"{g}/spread"] == 100
    assert m[f"{g}/standard_minus_mean"] == pytest.approx(25)
    # "first" always answers shown position 0: right once in 3 shifts, in every format -> no spread, tight CI
    f = metric_key("formats", "first", "syn")
    assert m[f"{f}/mean"] == pytest.approx(100 / 3) and m[f"{f}/spread"] == pytest.approx(0)
    assert m[f"{f}/mean/ci_low"] == pytest.approx(100 / 3) and m[f"{f}/mean/ci_high"] == pytest.approx(100 / 3)
    # coverage collapses: lowercase (2 of 3 formats covered) = 66.7 %, dot 50 %
    cov = fb.coverage_by_factor(scores)
    c = cov[(cov.model == "good")].set_index(["factor", "level"])["coverage"]
    assert m[metric_key("coverage", "good", "syn", "option_ids", "lowercase")] == pytest.approx(c[("option_ids", "lowercase")])
    assert m[metric_key("coverage", "good", "syn", "option_ids", "lowercase")] == pytest.approx(200 / 3)
    assert m[metric_key("coverage", "good", "syn", "delimiter", "dot")] == pytest.approx(50)
    html = built["report"].html.read_text()
    assert 'class="collapse"' in html
    # ranking: good beats first on the mean in every bootstrap draw; first wins lowercase-dot-comma
    r = metric_key("ranking", "formats", "syn")
    assert m[f"{r}/good/rank"] == 1 and m[f"{r}/good/p_best"] == 1.0 and m[f"{r}/first/p_best"] == 0.0
    assert m[f"{r}/lowercase-dot-comma/first/rank"] == 1 and m[f"{r}/lowercase-dot-comma/first/p_best"] == 1.0
    assert m[f"{r}/good/share_rank1"] == pytest.approx(80)
    # mixed model: the same coefficients as fit_lmm_with_fallback on the same scores
    lmm = fbs.fit_lmm_with_fallback(scores, alpha=0.05)
    for t in lmm.itertuples():
        assert m[metric_key("lmm", t.factor, t.level or "intercept", "coef")] == pytest.approx(t.coef)


def test_bootstrap_is_deterministic(built, tmp_path):
    again = build_report([built["root"] / "format_bias", built["prompt"], built["judge"]], tmp_path, n_boot=N_BOOT, seed=0)
    assert again.metrics == built["report"].metrics


def test_prompt_numbers(built):
    m = built["report"].metrics
    rows = pcs.load_results(built["prompt"].parent.parent)
    acc = pcs.accuracy_frame(rows, benchmark_by="dataset")
    k = metric_key("prompts", "pmodel", "syn-mc")
    assert m[f"{k}/baseline"] == pytest.approx(float(pm.baseline_accuracy(acc).baseline.iloc[0])) == 100
    assert m[f"{k}/trimmed_mean"] == pytest.approx(float(pm.trimmed_means(acc).trimmed_mean.iloc[0]))
    assert m[f"{k}/mean"] == pytest.approx(62.5) and m[f"{k}/median"] == pytest.approx(75)
    assert m[f"{k}/spread"] == 100 and m[f"{k}/min"] == 0
    assert m[metric_key("coverage", "pmodel", "syn-mc", "category", 12)] == 0


def _table_lines(md: str, title: str) -> list[str]:
    """The markdown lines of the report table titled ``title`` (its header row first)."""
    lines = md.splitlines()
    i = lines.index(f"**{title}**")
    out = []
    for ln in lines[i + 2:]:
        if not ln.startswith("|"):
            break
        out.append(ln)
    return out


def test_prompt_categories_are_named(built):
    """Study 2's coverage table names the categories of Promptception's Table 1, and so does its collapse line
    (category 12, where prompt 12.3 never yields a letter: 0 %)."""
    from mmfragile.studies.promptception.metrics import CATEGORY_NAMES

    md = built["report"].markdown.read_text()
    header = _table_lines(md, "Answer extracted (%) by prompt category")[0]
    assert [c.strip() for c in header.strip("|").split("|")][2:] == [f"{c} {CATEGORY_NAMES[c]}" for c in (1, 2, 5, 12)]
    assert "pmodel / syn-mc: category 12 Answer Handling (0 %)" in md


def _overlapping_texts(fig) -> list[tuple[str, str]]:
    """Pairs of drawn texts of ``fig`` whose boxes overlap (titles, axis and tick labels, annotations)."""
    from matplotlib.text import Text

    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    shown = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()
             and (t.axes is None or t.axes.get_visible())]
    boxes = [(t.get_text(), t.get_window_extent(r)) for t in shown]
    return [(a, b) for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1:] if ba.overlaps(bb)]


def test_coverage_heatmap_titles_do_not_overlap_labels():
    """The report's coverage heatmap (format_bias.plots.plot_coverage_heatmap): the figure title, each panel's
    dataset title and the factor labels above the columns are drawn without overlapping any other text."""
    import matplotlib.pyplot as plt

    from mmfragile.studies.format_bias import plots as fbp

    rows = pd.DataFrame(_fb_rows("good", pick=_good) + _fb_rows("first", pick=lambda q, s, f: 0))
    grid = fbs.grid_rows(fbs.results_to_metrics_frame(rows, include_standard=True))
    fig = fbp.plot_coverage_heatmap(fb.coverage_by_factor(fb.format_scores(grid)))
    texts = {t.get_text() for t in fig.findobj(lambda o: hasattr(o, "get_text"))}
    assert {"syn", "Option IDs", "Option delimiter", "Option separator"} <= texts
    assert _overlapping_texts(fig) == []
    plt.close(fig)


def test_no_best_format_advice_when_every_format_ties(tmp_path):
    """A model right on every format (all 100 %): the report says that every format scores the same instead of
    warning that the best format 'overstates the mean by 0.0 pp'; a model with a spread still gets the warning."""
    for model, pick in (("tied", lambda q, s, f: (0 - s) % 3), ("spread", _good)):
        st = fbs.STUDY.stage_store(fbs.STUDY.folder(tmp_path / "s", model, "syn"), "grid",
                                   fbs.run_config(model, "syn", 4))
        st.append(_fb_rows(model, pick=pick))
    md = build_report([tmp_path / "s"], tmp_path / "out", n_boot=20).markdown.read_text()
    how = {ln.split(" on ")[0]: ln for ln in md.splitlines() if ln.startswith(("tied on", "spread on"))}
    assert "Do not quote the best" not in how["tied"] and "overstates" not in how["tied"]
    assert "All 5 formats score the same here (to 0.1 pp): there is no best format to single out." in how["tied"]
    assert "Do not quote the best format" in how["spread"]


def test_no_chart_when_no_judgment_parsed(tmp_path):
    """Every judge output unparseable: no BD / BC value, so no (empty) chart - the report says so instead."""
    nothing = {"s0": None, "s1": None, "s2": None}
    st = _make_judge_store(tmp_path / "j", orig=nothing, pert={p: nothing for p in JUDGE_PERT})
    rep = build_report([st], tmp_path / "out", n_boot=20)
    assert not any("judge-bias" in f for f in rep.figures)
    assert "No judgment parsed for judge-a: no BD / BC to plot" in rep.markdown.read_text()
    assert rep.metrics[metric_key("judge", "judge-a", "text_dominance", "value")] is None


def test_judge_numbers(built):
    m = built["report"].metrics
    rows = ResultStore(built["judge"]).read()
    bs = jm.bias_scores(jb.judgment_table(rows)).set_index("perturbation")
    td = metric_key("judge", "judge-a", "text_dominance")
    assert m[f"{td}/value"] == pytest.approx(bs.loc["text_dominance", "value"]) == pytest.approx(1 / 3)
    vt = metric_key("judge", "judge-a", "visual_transformation")
    assert m[f"{vt}/value"] == pytest.approx(1.0) and m[f"{vt}/n_unparseable"] == 1 and m[f"{vt}/n_pairs"] == 2
    assert m[f"{td}/value/ci_low"] - 1e-9 <= 1 / 3 <= m[f"{td}/value/ci_high"] + 1e-9


def test_provenance_records_or_says_not_recorded(built):
    good = next(p for p in built["report"].provenance if "good" in p["store"])
    assert good["model spec"] == "good" and good["dataset"] == "syn"
    assert good["skipped rows"].startswith("1: image missing")
    assert "max_pixels" in good["image policy"]
    assert good["checkpoint hash"] == "not recorded" and good["version"] == "not recorded"
    judge = next(p for p in built["report"].provenance if p["study"] == "judge/scores")
    assert judge["image policy"] == "not recorded" and "judge-a" in judge["model spec"]
    assert len(built["report"].provenance) == 4


def test_budgeted_store_is_estimated(tmp_path):
    rows = pd.DataFrame(_fb_rows("bud", n_q=4, pick=_good))
    rows = rows[rows.format != "standard"].iloc[::3]          # a third of the grid: an incomplete / budgeted run
    st = fbs.STUDY.stage_store(fbs.STUDY.folder(tmp_path / "s", "bud", "syn"), "grid",
                               fbs.run_config("bud", "syn", 4))
    st.append(rows)
    rep = build_report([st.root], tmp_path / "out", n_boot=50, budget_draws=50)
    b = metric_key("budget", "formats", "bud", "syn")
    assert rep.metrics[f"{b}/n_observed"] == len(rows)
    assert rep.metrics[f"{b}/n_cells"] == 48 * 4 * 3
    assert rep.metrics[f"{b}/mean/ci_low"] - 1e-9 <= rep.metrics[f"{b}/mean"] <= rep.metrics[f"{b}/mean/ci_high"] + 1e-9
    assert metric_key("formats", "bud", "syn", "mean") not in rep.metrics


def test_cli(built, tmp_path):
    from mmfragile.cli import main

    assert main(["report", str(built["prompt"]), "--out", str(tmp_path), "--n-boot", "50"]) == 0
    assert (tmp_path / "report.html").exists()
    data = json.loads((tmp_path / "report.json").read_text())
    assert metric_key("prompts", "pmodel", "syn-mc", "mean") in data["metrics"]


# ------------------------------------------------------------------------------------------ browser
class _DomReader(HTMLParser):
    def __init__(self):
        super().__init__()
        self.metrics: list[tuple[str, str]] = []
        self.figures: list[dict] = []
        self.body: dict = {}
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "data-metric" in a:
            self.metrics.append((a["data-metric"], a.get("data-value", "")))
        if tag == "figure" and "data-figure" in a:
            self.figures.append(a)
        if tag == "body":
            self.body = a
        for k in ("src", "href"):
            if k in a and not a[k].startswith(("data:", "#")):
                self.urls.append(a[k])


needs_browser = pytest.mark.skipif(find_chromium() is None,
                                   reason="no headless chromium (/usr/bin/chromium): run scripts/install_browser.sh")


@needs_browser
def test_page_in_headless_chromium(built, tmp_path):
    from PIL import Image

    rep = built["report"]
    dom, log = dump_dom(rep.html)
    assert console_errors(log) == [], console_errors(log)
    r = _DomReader()
    r.feed(dom)
    assert r.body.get("data-loaded") == "1"
    assert json.loads(r.body["data-errors"]) == []
    assert r.urls == [], f"the page loads something besides itself: {r.urls}"
    # every number on the page equals report.json (and so the metric functions, tests above)
    data = json.loads(rep.json.read_text())["metrics"]
    assert len(r.metrics) >= len(data) * 0.9
    for key, value in r.metrics:
        assert key in data, key
        if data[key] is None:
            assert value == ""
        else:
            assert float(value) == pytest.approx(data[key], rel=1e-12, abs=1e-12), key
    assert {k for k, _ in r.metrics} == set(data)
    # every figure decoded, with a box; its part of the screenshot is not blank
    assert len(r.figures) == len(data and json.loads(rep.json.read_text())["figures"])
    assert all(f.get("data-rendered") == "1" for f in r.figures), r.figures
    height = int(r.body["data-height"])
    shot = screenshot_page(rep.html, tmp_path / "page.png", height=height)
    img = Image.open(shot).convert("L")
    assert img.size[0] >= 1000 and np.asarray(img).std() > 5
    for f in r.figures:
        x, y, w, h = map(int, f["data-box"].split(","))
        assert w > 50 and h > 50
        crop = np.asarray(img.crop((x, y, x + w, min(y + h, img.size[1]))), float)
        assert crop.size and crop.std() > 5, f"figure {f['data-figure']} looks blank"
