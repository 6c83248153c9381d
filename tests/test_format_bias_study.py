"""Study 1 glue (mmfragile.studies.format_bias): column adapter, store loading, mitigation inputs, Tab. 7 layout,
CP-LN runs."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mmfragile.studies.format_bias import metrics as fb
from mmfragile.studies.format_bias import mitigation as mit
from mmfragile.errors import DataError
from mmfragile.store import ResultStore
from mmfragile.studies import format_bias as fbs

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------ hand-made run rows
def _run_rows(model="m", dataset="d", n_options=(3, 3), formats=("uppercase-dot-line_break", "numbers-colon-comma"),
              pick=lambda q, shift, fmt: 0, logit=lambda q, shift, pos: float(pos), standard=True):
    """Rows shaped like mmfragile.runner.run_items output (engine path): question q has n_options[q] options,
    its correct canonical option is 0, shown at position (0 - shift) % O; the model picks shown position
    ``pick(q, shift, fmt)`` (-1 = invalid output)."""
    from mmfragile.studies.format_bias.prompts import OPTION_ID_SETS, PromptFormat

    fmts = [(PromptFormat.from_name(f), f) for f in formats]
    if standard:
        fmts.append((PromptFormat("uppercase", "dot", "line_break"), "standard"))
    rows = []
    for q, o in enumerate(n_options):
        for fmt, fname in fmts:
            ids = list(OPTION_ID_SETS[fmt.option_ids][:o])
            for shift in range(o):
                ans_pos = (0 - shift) % o
                sel = pick(q, shift, fname)
                raw = ids[sel] if sel >= 0 else "???"
                rows.append(dict(model=model, dataset=dataset, question_id=f"q{q}", variant=f"{fname}|s{shift}",
                                 format=fname, option_id_set=fmt.option_ids, delimiter=fmt.delimiter,
                                 separator=fmt.separator, shift=shift, n_options=o, category="c", modality="image",
                                 raw_output=raw, option_ids=ids, answer_id=ids[ans_pos], covered=sel >= 0,
                                 correct=sel == ans_pos, selected_position=sel,
                                 option_logits=[logit(q, shift, p) for p in range(o)]))
    return pd.DataFrame(rows)


def test_adapter_renames_and_separates_the_standard_rows():
    raw = _run_rows(pick=lambda q, s, f: 0 if f != "numbers-colon-comma" else -1,
                    logit=lambda q, s, p: 10.0 * q + p)
    assert {"option_ids", "option_id_set"} <= set(raw.columns)
    # the raw frame does not fit the metrics module: option_ids holds ID lists, not the level
    pq = fbs.results_to_metrics_frame(raw)
    assert "standard" not in set(pq["format"]) and len(pq) == 2 * 3 * 2
    assert set(pq["option_ids"]) == {"uppercase", "numbers"}
    assert pq.loc[0, "option_labels"] == ["A", "B", "C"]
    # shift 1 of 3 options: correct option 0 is shown at position 2; answer_logit = logits[2] = 10 q + 2
    r = pq[(pq.question_id == "q1") & (pq["shift"] == 1) & (pq.option_ids == "uppercase")].iloc[0]
    assert r.answer_position == 2 and r.answer_logit == 12.0 and r.answer_id == "C"
    full = fbs.results_to_metrics_frame(raw, include_standard=True)
    assert len(full) == len(raw) and full["is_standard"].sum() == 6
    assert fbs.results_to_metrics_frame(full).equals(pq)  # idempotent on an adapted frame
    scores = fb.format_scores(pq)
    # always picks shown position 0: correct only at shift 0 -> 1 of 3 per question; numbers: never valid
    up = scores[scores.option_ids == "uppercase"].iloc[0]
    assert up.accuracy == pytest.approx(100 / 3) and up.coverage == 100 and up.n_questions == 6
    num = scores[scores.option_ids == "numbers"].iloc[0]
    assert num.accuracy == 0 and num.coverage == 0
    with pytest.raises(DataError, match="option_id_set"):
        fbs.results_to_metrics_frame(raw.drop(columns="option_id_set"))


def test_load_runs_reads_every_grid_store_and_not_the_cp_ln_store(tmp_path):
    for model in ("m1", "m2"):
        st = fbs.STUDY.stage_store(fbs.STUDY.folder(tmp_path, model, "syn"), "grid", fbs.run_config(model, "syn", 2))
        rows = _run_rows(model=model).to_dict("records")
        st.append(rows[:5])
        st.append(rows[5:])
    cp = fbs.STUDY.stage_store(tmp_path / "m1" / "syn", "cp_ln", fbs.run_config("m1", "syn", 2, stage="cp_ln"))
    cp.append([dict(model="m1", dataset="d", question_id="q0", variant=str(k), option=k, logprob=-1.0 - k,
                    n_tokens=1, answer=0, n_options=3) for k in range(3)])
    assert fbs.STUDY.folder(tmp_path, "m1", "syn") == tmp_path / "m1" / "syn"
    assert (cp.config["study"], cp.config["stage"]) == ("format-bias", "cp_ln")
    assert cp.root == tmp_path / "m1" / "syn" / "cp_ln"
    runs = fbs.load_runs(tmp_path)
    n = len(_run_rows())
    assert len(runs) == 2 * n and sorted(runs.model.unique()) == ["m1", "m2"]
    assert "logprob" not in runs.columns
    cps = fbs.load_cp_ln(tmp_path)
    assert len(cps) == 3 and set(cps.model) == {"m1"}
    data = fbs.load_study(tmp_path)
    assert data.models == ["m1", "m2"] and not data.published and len(data.cp_ln) == 3
    assert data.per_question["is_standard"].sum() == 2 * 6 and len(data.grid) == 2 * 12
    assert len(data.scores) == 2 * 2  # 2 models x 2 formats
    with pytest.raises(FileNotFoundError):
        fbs.load_runs(tmp_path / "nothing")
    with pytest.raises(FileNotFoundError):
        fbs.load_runs(tmp_path / "m1" / "syn" / "cp_ln")  # only a CP-LN store there


def test_mitigation_inputs_match_the_metrics_functions():
    logit = lambda q, s, p: [2.0, 0.5, -1.0][p] + 0.3 * q  # noqa: E731  position-0 prior
    pq = fbs.results_to_metrics_frame(_run_rows(pick=lambda q, s, f: 0, logit=logit), include_standard=True)
    inp = fbs.mitigation_inputs(pq)
    assert len(inp["pia"]) == 6 and set(inp["pia"].columns) >= {"question_id", "answer_position", "selected_position", "n_options"}
    van = fbs.vanilla_scores(pq)
    assert van.accuracy.iloc[0] == pytest.approx(100 / 3) and van.complexity.iloc[0] == 6
    pia = fbs.pia_scores(pq)
    # always position 0: C_0 = 2 (the shift-0 items), Pr_0 = 6, N = 2 questions, M = 3 -> (2/6)(2/2)/3
    assert pia.accuracy.iloc[0] == pytest.approx(100 * (2 / 6) * (2 / 2) / 3)
    pr = fbs.pride_scores(pq)
    cal = np.stack([np.stack([[logit(q, s, p) for p in range(3)] for s in range(3)]) for q in range(2)])
    direct = mit.pride(cal[:, 0, :], [0, 0], calibration=cal, logits=True)
    assert pr.accuracy.iloc[0] == pytest.approx(100 * direct.accuracy) and pr.complexity.iloc[0] == 2
    pg = fbs.pseudo_gt_scores(pq)
    assert pg.accuracy.iloc[0] == pytest.approx(100 / 3) and pg.complexity.iloc[0] == 12
    # mixed option counts: PIA and PriDe refuse with the metrics module's message, naming dataset and model
    mixed = fbs.results_to_metrics_frame(_run_rows(n_options=(2, 3)), include_standard=True)
    for fn in (fbs.pia_scores, fbs.pride_scores):
        with pytest.raises(ValueError, match=r"fixed number of options.*'d \(m\)'.*2, 3"):
            fn(mixed)
    with pytest.raises(ValueError, match="PIA needs a fixed number"):
        fbs.mitigation_scores(mixed)
    na = fbs.mitigation_scores(mixed, on_mixed="na")
    assert na[na.method.isin(["pia", "pride"])].accuracy.isna().all()
    assert na[na.method == "pride"].note.iloc[0].startswith("PriDe needs a fixed number")
    assert fbs.most_common_option_count(mixed) == 3  # tie 1:1 -> the larger count
    sub = fbs.subset_option_count(mixed, 3)
    assert set(sub.question_id) == {"q1"}
    assert set(fbs.mitigation_scores(sub).method) == {"pseudo_gt", "vanilla", "pia", "pride"}


def test_table7_comparison_on_a_hand_made_frame():
    acc = {"pseudo_gt": [80, 70, 60], "vanilla": [50, 70, 60], "pia": [90, 50, 50], "pride": [np.nan] * 3}
    rows = [dict(dataset="D", model=m, method=meth, accuracy=a, complexity={"pseudo_gt": 4800}.get(meth, 100))
            for meth, vals in acc.items() for m, a in zip(["A", "B", "C"], vals)]
    cmp = fbs.compare_mitigation(pd.DataFrame(rows))
    ranks = cmp.scores.set_index(["method", "model"])["rank"]
    assert [ranks["vanilla", m] for m in "ABC"] == [3, 1, 2]
    assert [ranks["pia", m] for m in "ABC"] == [1, 2, 2]  # competition ranks, ties share the smallest
    a = cmp.agreement.set_index("method")
    # vanilla ranks (3,1,2) vs (1,2,3): Pearson of the ranks = -0.5, nobody in place
    assert a.loc["vanilla", "spearman"] == pytest.approx(-0.5) and a.loc["vanilla", "correctly_ranked"] == 0
    # pia (1,2,2) vs (1,2,3): r = 1 / sqrt(4/3); B has rank 2 in both but is tied -> only A counts
    assert a.loc["pia", "spearman"] == pytest.approx(1 / math.sqrt(4 / 3))
    assert a.loc["pia", "correctly_ranked"] == 1 and a.loc["pia", "n_models"] == 3
    assert pd.isna(a.loc["pride", "correctly_ranked"])
    t = cmp.table
    assert list(t.columns.get_level_values(0).unique()) == ["Pseudo GT", "Vanilla", "PIA", "PriDe"]
    assert list(t.index.get_level_values(1)) == ["A", "B", "C", "Complexity [#]", "Ranking correlation",
                                                 "Correctly ranked"]
    assert t.loc[("D", "A"), ("Vanilla", "Acc. [%]")] == "50.00" and t.loc[("D", "A"), ("Vanilla", "Rank")] == "3"
    assert t.loc[("D", "Correctly ranked"), ("Vanilla", "Acc. [%]")] == "(0/3)"
    assert t.loc[("D", "Correctly ranked"), ("PIA", "Acc. [%]")] == "(1/3)"
    assert t.loc[("D", "Ranking correlation"), ("PIA", "Acc. [%]")] == "0.87"
    assert t.loc[("D", "Complexity [#]"), ("Pseudo GT", "Acc. [%]")] == "4,800"
    assert t.loc[("D", "B"), ("PriDe", "Acc. [%]")] == "NA" and t.loc[("D", "Correctly ranked"), ("PriDe", "Acc. [%]")] == "NA"


def test_table7_reproduces_the_published_footer():
    printed = fb.load_published_mitigation()
    footer = fb.load_published_mitigation_summary()
    cmp = fbs.compare_mitigation(printed, complexity=footer)
    m = cmp.scores.merge(printed, on=["dataset", "model", "method"], suffixes=("", "_printed")).dropna(subset=["rank_printed"])
    assert (m["rank"] == m["rank_printed"]).all()
    chk = cmp.agreement.merge(footer, on=["dataset", "method"], suffixes=("", "_p")).dropna(subset=["correctly_ranked_p"])
    assert (chk.correctly_ranked == chk.correctly_ranked_p).all()
    ok = chk[~((chk.dataset == "V*Bench") & (chk.method == "cp_ln"))]  # printed 0.93 is an erratum (README)
    assert np.allclose(ok.spearman.round(2), ok.ranking_correlation)
    assert cmp.table.loc[("A-OKVQA", "Correctly ranked"), ("Vanilla", "Acc. [%]")] == "(3/7)"
    assert cmp.table.loc[("V*Bench", "Gemma-3"), ("PIA", "Acc. [%]")] == "NA"


# ------------------------------------------------------------------------------------------ CP-LN on a model
def test_cp_ln_stage_picks_the_length_normalised_argmax_and_resumes(tiny_vlm, synthetic, tmp_path):
    from mmfragile.studies.format_bias.prompts import build_cloze_prompt
    from mmfragile.study import run_study

    qs = synthetic[synthetic.modality == "image"].head(2).reset_index(drop=True)

    def cp_ln_run():
        return run_study("format-bias", tiny_vlm, qs, out=tmp_path / "run", stages=["cp_ln"], cp_ln=True,
                         batch_size=3, progress=False)

    cp = cp_ln_run().table("cp_ln")
    assert len(cp) == sum(len(o) for o in qs.options)
    pred = fbs.cp_ln_predictions(cp).set_index("question_id")
    for rec in qs.to_dict("records"):
        cz = build_cloze_prompt(rec)
        lls = tiny_vlm.loglikelihood([cz.to_prompt()] * len(cz.continuations), cz.continuations)
        direct = int(np.argmax([ll.logprob / ll.n_tokens for ll in lls]))
        assert pred.loc[rec["question_id"], "predicted"] == direct
        assert pred.loc[rec["question_id"], "answer"] == rec["answer"]
        stored = cp[cp.question_id == rec["question_id"]].sort_values("option")
        np.testing.assert_allclose(stored.logprob, [ll.logprob for ll in lls], rtol=1e-4, atol=1e-4)
    parts = sorted((tmp_path / "run" / "cp_ln" / "parts").glob("*.parquet"))
    again = cp_ln_run()
    assert again.new_rows["cp_ln"] == 0 and len(again.table("cp_ln")) == len(cp)
    assert sorted((tmp_path / "run" / "cp_ln" / "parts").glob("*.parquet")) == parts
    info = ResultStore(tmp_path / "run" / "cp_ln").config["run_info"]
    assert info["provenance"]["tiny-vlm"]["model_spec"] == "tiny-vlm" and "tiny-vlm" in info["model_identity"]
    sc = fbs.cp_ln_scores(cp)
    assert sc.accuracy.iloc[0] == pytest.approx(100 * pred.correct.mean()) and sc.complexity.iloc[0] == len(cp)
