"""Study 4, the noise floor (mmfragile.studies.numerics), against known answers.

* the reference settings rerun change nothing: flip rate and accuracy change exactly 0, option logits bit-equal;
* planted noise: seeded N(0, sigma^2) on every option logit (PlantedNoise) - each cell's flip probability follows
  from its logits - gives a measured flip rate whose interval holds the planted one, for sigma 0.01 / 0.1 / 0.5;
* bf16 against fp32 on a zoo model: the reported flips equal a hand count from the store;
* the metrics by hand (Wilson, McNemar, rank changes, |delta logit|), the CLI, resume, shards and the report.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from mmfragile.cli import main
from mmfragile.store import ResultStore
from mmfragile.study import run_study
from mmfragile.studies.numerics import metrics as nm
from mmfragile.studies.numerics.alternatives import ALTERNATIVES, UnknownAlternative, recompose, resolve, sample_cells
from mmfragile.studies.numerics.planted import PlantedNoise, flip_probability

N, PER_QUESTION = 2, 8


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """The CLI's default alternatives on tiny-vlm: every one that applies to the HF backend."""
    out = tmp_path_factory.mktemp("num") / "run"
    assert main(["run", "numerics", "--model", "tiny-vlm", "--dataset", "easy-vqa", "--n", str(N),
                 "--per-question", str(PER_QUESTION), "--quiet", "--out", str(out)]) == 0
    return out


# ------------------------------------------------------------------------------------------ known answers
def test_the_reference_rerun_invents_no_noise(tiny_run):
    rows = ResultStore(tiny_run / "cells").read()
    table = nm.floor_table(rows).set_index("alternative")
    rep = table.loc["repeat"]
    assert (rep.flips, rep.flip_rate, rep.delta_acc, rep.max_dlogit, rep.rank_changes) == (0, 0.0, 0.0, 0.0, 0)
    ref, again = (rows[rows.model == m].sort_values(nm.CELL) for m in ("tiny-vlm", "tiny-vlm~repeat"))
    assert [list(x) for x in ref.option_logits] == [list(x) for x in again.option_logits]   # bit-equal


def test_every_default_alternative_runs_the_same_cells(tiny_run, capsys):
    rows = ResultStore(tiny_run / "cells").read()
    assert set(rows.model) == {"tiny-vlm", *(f"tiny-vlm~{a}" for a in resolve("auto", "hf"))}
    cells = {m: set(map(tuple, g[nm.CELL].astype(str).to_numpy())) for m, g in rows.groupby("model")}
    assert all(c == cells["tiny-vlm"] for c in cells.values()) and len(cells["tiny-vlm"]) == N * PER_QUESTION
    # bfloat16 moves the option logits (it is another arithmetic), by far less than their margins here
    table = nm.floor_table(rows).set_index("alternative")
    assert 0 < table.loc["bfloat16"].max_dlogit < 0.05
    # batched generate stores its option logits too; in float32 the engine is exact against it (docs/architectures)
    gen = table.loc["generate"]
    assert gen.flips == 0 and 0 <= gen.max_dlogit < 1e-4


def test_a_rerun_resumes_with_nothing_new(tiny_run):
    run = run_study("numerics", "tiny-vlm", "easy-vqa", n=N, out=tiny_run, per_question=PER_QUESTION,
                    progress=False)
    assert sum(run.new_rows.values()) == 0


@pytest.mark.parametrize("sigma", [0.01, 0.1, 0.5])
def test_planted_noise_gives_the_planted_flip_rate(sigma, tiny_vlm, tmp_path):
    from mmfragile.data.loaders import load_dataset
    from mmfragile.runner import run_items
    from mmfragile.studies.format_bias.prompts import exact_match_score
    from mmfragile.studies.format_bias.items import format_bias_items

    items = format_bias_items(tiny_vlm, load_dataset("easy-vqa", n=3))
    store = ResultStore(tmp_path / "s")
    ref = PlantedNoise(tiny_vlm, 0.0, name="m")
    run_items(ref, items, store, exact_match_score, progress=False)
    run_items(PlantedNoise(tiny_vlm, sigma, seed=7, name="m~noise"), items, store, exact_match_score, progress=False)
    rows = store.read()
    row = nm.floor_table(rows).iloc[0]
    clean = rows[rows.model == "m"]
    expected = 100 * np.mean([flip_probability(np.asarray(x), sigma) for x in clean.option_logits])
    assert row.cells == len(items) and row.flip_lo <= expected <= row.flip_hi, (row.flip_rate, expected)
    assert (row.flips > 0) == (sigma >= 0.1)   # tiny-vlm's margins: sigma 0.01 flips almost nothing


def test_flip_probability_by_hand():
    from scipy.stats import norm

    assert flip_probability([0.3, 0.0], 0.5) == pytest.approx(norm.cdf(-0.3 / (0.5 * math.sqrt(2))), abs=1e-12)
    assert flip_probability([1.0, 1.0], 0.2) == pytest.approx(0.5, abs=1e-9)
    assert flip_probability([5.0, 0.0, 0.0], 0.01) == pytest.approx(0.0, abs=1e-12)
    assert flip_probability([0.0, 0.0, 0.0, 0.0], 1.0) == pytest.approx(0.75, abs=1e-6)


def test_bf16_against_fp32_on_a_zoo_model_equals_a_hand_count(tmp_path):
    out = tmp_path / "zoo"
    assert main(["run", "numerics", "--model", "zoo-smollm2-good", "--dataset", "easy-vqa", "--n", "2",
                 "--per-question", "0", "--alternatives", "bfloat16", "--quiet", "--out", str(out)]) == 0
    rows = ResultStore(out / "cells").read()
    ref = rows[rows.model == "zoo-smollm2-good"].set_index(nm.CELL).sort_index()
    bf = rows[rows.model == "zoo-smollm2-good~bfloat16"].set_index(nm.CELL).sort_index()
    hand = 0
    for (a_pos, a_raw), (b_pos, b_raw) in zip(ref[["selected_position", "raw_output"]].itertuples(index=False),
                                              bf[["selected_position", "raw_output"]].itertuples(index=False)):
        a = ("opt", int(a_pos)) if pd.notna(a_pos) else ("raw", a_raw)
        b = ("opt", int(b_pos)) if pd.notna(b_pos) else ("raw", b_raw)
        hand += a != b
    row = nm.floor_table(rows).iloc[0]
    assert row.alternative == "bfloat16" and row.cells == len(ref) and row.flips == hand


# ------------------------------------------------------------------------------------------ metrics by hand
def _rows(model, answers, correct, logits=None):
    return pd.DataFrame({"model": model, "dataset": "d", "question_id": ["q1", "q1", "q2", "q2"],
                         "variant": ["a|s0", "b|s0", "a|s0", "b|s0"], "selected_position": answers,
                         "raw_output": [str(a) for a in answers], "correct": correct,
                         "option_logits": logits or [[1.0, 0.0]] * 4})


def test_floor_table_by_hand():
    ref = _rows("m", [0, 1, 0, None], [True, False, True, False],
                [[2.0, 0.0], [0.0, 0.5], [1.0, 0.9], [0.0, 0.0]])
    alt = _rows("m~x", [0, 0, 1, None], [True, True, False, False],
                [[2.0, 0.0], [0.3, 0.2], [0.85, 0.95], [0.0, 0.0]])
    row = nm.floor_table(pd.concat([ref, alt])).iloc[0]
    assert (row.model, row.alternative, row.cells, row.flips) == ("m", "x", 4, 2)
    lo, hi = nm.wilson(2, 4)
    assert (row.flip_lo, row.flip_hi) == pytest.approx((100 * lo, 100 * hi)) and lo == pytest.approx(0.15004, 1e-4)
    assert row.delta_acc == 0.0 and row.mcnemar_p == 1.0              # one cell gained, one lost: b = c = 1
    # per-cell max |d logit|: 0, 0.3, 0.15, 0 -> median 0.075, max 0.3
    assert row.max_dlogit == pytest.approx(0.3) and row.median_dlogit == pytest.approx(0.075)
    assert row.share_margin_below == pytest.approx(50.0)               # margins 2, 0.5, 0.1, 0: two below 0.3
    # per-format accuracy: ref a 100 %, b 0 %; alt a 50 %, b 50 % (ties rank alike): b changes rank 2 -> 1
    assert (row.rank_changes, row.effects) == (1, 2)


def test_mcnemar_exact_by_hand():
    ref = np.array([True] * 6 + [False] * 4)
    alt = np.array([False] * 6 + [False] * 4)       # b = 6, c = 0: p = 2 * 0.5^6
    assert nm.mcnemar_p(ref, alt) == pytest.approx(2 * 0.5 ** 6)


def test_uncovered_answers_are_compared_by_their_text_never_dropped():
    a = pd.DataFrame({"selected_position": [None, 1.0], "raw_output": ["zzz", "B"]})
    b = pd.DataFrame({"selected_position": [None, 1], "raw_output": ["zz", "B"]})
    assert list(nm.answer_key(a) != nm.answer_key(b)) == [True, False]


# ------------------------------------------------------------------------------------------ alternatives
def test_alternatives_resolve_by_backend_and_refuse_what_does_not_apply():
    assert resolve("auto", "openai") == ["repeat"]
    assert "no-prefix-cache" in resolve("auto", "vllm") and "no-prefix-cache" not in resolve("auto", "hf")
    with pytest.raises(UnknownAlternative, match="does not apply to the openai backend"):
        resolve(["bfloat16"], "openai")
    with pytest.raises(UnknownAlternative, match="no alternative 'fp8'"):
        resolve(["fp8"], "hf")


def test_a_half_precision_reference_gets_float32_as_its_precision_alternative():
    """The zoo's fine-tunes run in bfloat16 (their own dtype): `auto` measures them against float32, not against
    the bfloat16 they already run in; naming their own dtype is refused (it would rerun the reference)."""
    from mmfragile.models.spec import ModelSpec
    from mmfragile.studies.numerics.alternatives import reference_dtype

    assert reference_dtype(ModelSpec.parse("zoo-follower")) == "bfloat16"                   # a fine-tune's own
    assert reference_dtype(ModelSpec.parse("zoo-smollm2-good")) is None                      # float32 (the default)
    assert reference_dtype(ModelSpec.parse("tiny-vlm", dtype="float16")) == "float16"        # --model-args
    half = resolve("auto", "hf", "bfloat16")
    assert "float32" in half and "bfloat16" not in half
    assert [a if a != "float32" else "bfloat16" for a in half] == resolve("auto", "hf")      # the rest unchanged
    assert "bfloat16" in resolve("auto", "hf", "float32")
    with pytest.raises(UnknownAlternative, match="bfloat16 is the reference's own dtype"):
        resolve(["bfloat16"], "hf", "bfloat16")


def test_the_cell_sample_and_the_composition_are_seeded_and_keep_every_cell(tiny_vlm):
    from mmfragile.data.loaders import load_dataset
    from mmfragile.studies.format_bias.items import format_bias_items

    items = format_bias_items(tiny_vlm, load_dataset("easy-vqa", n=2))
    a, b = sample_cells(items, 5, 3), sample_cells(items, 5, 3)
    assert [it.key for it in a] == [it.key for it in b] and len(a) == 10
    assert [it.key for it in sample_cells(items, 5, 4)] != [it.key for it in a]
    mixed = recompose(a, 3)
    assert sorted(str(it.key) for it in mixed) == sorted(str(it.key) for it in a)
    assert {it.batch_with for it in mixed} == {"part0", "part1", "part2"} and ALTERNATIVES["composition"].composition


# ------------------------------------------------------------------------------------------ shared layers
def test_shards_then_merge_give_the_whole_run(tiny_run, tmp_path):
    args = ["run", "numerics", "--model", "tiny-vlm", "--dataset", "easy-vqa", "--n", str(N), "--per-question",
            str(PER_QUESTION), "--alternatives", "repeat,batch-1", "--quiet", "--out", str(tmp_path / "sh")]
    for i in range(2):
        assert main([*args, "--shard", f"{i}/2"]) == 0
    assert main(["merge", str(tmp_path / "sh" / "cells")]) == 0
    got = ResultStore(tmp_path / "sh" / "cells").read()
    full = ResultStore(tiny_run / "cells").read()
    full = full[full.model.isin(set(got.model))]
    cols = [*nm.CELL, "model", "raw_output", "correct"]
    pd.testing.assert_frame_equal(got[cols].sort_values(cols).reset_index(drop=True),
                                  full[cols].sort_values(cols).reset_index(drop=True))


def test_the_report_shows_the_floor_beside_the_format_effects(tiny_run, tmp_path):
    from mmfragile.report import build_report

    fb = tmp_path / "fb"
    assert main(["run", "format-bias", "--model", "tiny-vlm", "--dataset", "easy-vqa", "--n", str(N), "--quiet",
                 "--out", str(fb)]) == 0
    rep = build_report([fb, tiny_run], tmp_path / "rep", n_boot=20)
    md = rep.markdown.read_text()
    assert "Numerics: the noise floor" in md and "beside the numerical floor" in md
    floor = rep.metrics["numerics/tiny-vlm/floor_pp"]
    spread = rep.metrics["formats/tiny-vlm/easy-vqa/spread"]
    verdict = "inside the floor" if abs(spread) <= floor else "above the floor"
    assert f"| tiny-vlm | easy-vqa | spread over the formats (max - min) | {spread:.1f} | {floor:.1f} | {verdict} |" in md
    assert "its numerical floor is" in md.split("## ")[1]           # in "How to report this"


def test_each_format_and_prompt_effect_is_labelled_against_the_floor_in_its_own_section(tiny_run, tmp_path):
    """Study 1's per-format deviations and study 2's per-prompt deviations (from the mean over the variants) each
    sit beside the model's floor in their own section; the inside count equals a hand count of the deviations."""
    from mmfragile.report import build_report

    fb, pc = tmp_path / "fb", tmp_path / "pc"
    assert main(["run", "format-bias", "--model", "tiny-vlm", "--dataset", "easy-vqa", "--n", str(N), "--quiet",
                 "--out", str(fb)]) == 0
    assert main(["run", "promptception", "--model", "tiny-vlm", "--dataset", "synthetic-vqa", "--n", "3",
                 "--prompt-ids", "1.1,2.1,5.2,7.6", "--max-new-tokens", "4", "--n-frames", "2", "--quiet",
                 "--out", str(pc)]) == 0
    rep = build_report([fb, pc, tiny_run], tmp_path / "rep", n_boot=20)
    md, m = rep.markdown.read_text(), rep.metrics
    floor = m["numerics/tiny-vlm/floor_pp"]
    for kind, ds, n_variants, title in (("formats", "easy-vqa", 48, "Study 1"),
                                        ("prompts", "synthetic-vqa", 4, "Study 2")):
        prefix = f"{kind}/tiny-vlm/{ds}"
        devs = {k: v for k, v in m.items() if k.startswith(f"{prefix}/deviation/")}
        assert len(devs) == n_variants
        assert m[f"{prefix}/floor_pp"] == floor
        assert m[f"{prefix}/inside_floor"] == sum(abs(v) <= floor for v in devs.values())
        section = next(s for s in md.split("\n## ") if s.startswith(title))
        assert f"beside the numerical floor ({floor:.1f} pp)" in section
        # each deviation is the variant's accuracy minus the mean over the variants
        assert abs(sum(devs.values())) < 1e-6 * n_variants
    how = md.split("\n## ")[1]
    assert how.count("Numerical floor: ") == 2 and "report those format effects as inside the floor" in how


def test_floor_labels_and_rank_gaps_by_hand():
    """floor_block and rank_gaps on hand-made numbers: |deviation| <= floor is inside; a gap between two models is
    held against the larger of their floors."""
    from mmfragile.report.build import Doc, Section, floor_block, rank_gaps

    doc, sec, how = Doc(), Section("s", "S"), {}
    doc.floors = {"a": 1.0, "b": 3.0}
    floor_block(doc, sec, "formats", "a", "d", "format", ["f1", "f2", "f3"], [50.0, 51.5, 52.5], how)  # mean 51.33
    dev = {k.rsplit("/", 1)[1]: v for k, v in doc.metrics.items() if "/deviation/" in k}
    assert dev == pytest.approx({"f1": -4 / 3, "f2": 1 / 6, "f3": 7 / 6})
    assert how["floor"] == {"floor": 1.0, "inside": 1, "of": 3}               # only f2 within 1 pp
    table = sec.blocks[0]
    assert [r[0].text for r in table.rows] == ["f1", "f3", "f2"]              # largest |deviation| first
    assert [r[2].text for r in table.rows] == ["above the floor", "above the floor", "inside the floor"]
    floor_block(doc, sec, "formats", "z", "d", "format", ["f1"], [1.0], {})   # no floor for z: nothing shown
    assert len(sec.blocks) == 1
    gaps = rank_gaps(doc, "formats", "d", {"a": 60.0, "b": 58.0, "c": 50.0})
    assert gaps["a"][1] == "inside the floor"      # 2 pp against max(1, 3)
    assert gaps["b"][1] == "above the floor"       # 8 pp against b's 3
    assert gaps["c"] == (gaps["c"][0], None) and gaps["c"][0].text == "-"
    assert doc.metrics["ranking/formats/d/a/gap_to_next"] == 2.0


def test_a_report_without_a_numerics_store_says_no_floor_was_measured(tmp_path):
    from mmfragile.report import build_report

    fb = tmp_path / "fb"
    assert main(["run", "format-bias", "--model", "tiny-vlm", "--dataset", "easy-vqa", "--n", "1", "--quiet",
                 "--formats", "uppercase-dot-line_break", "--out", str(fb)]) == 0
    rep = build_report([fb], tmp_path / "rep", n_boot=10)
    (note,) = [n for n in rep.notes if "no numerical floor was measured" in n]
    assert "python -m mmfragile run numerics --model M --dataset D" in note
    assert "no numerical floor was measured" in rep.markdown.read_text()


def test_the_numerics_notebook_writes_the_floor_table_the_store_gives(tmp_path):
    """Notebook 60 (what `reproduce` runs for study 4): its CSV is floor_table of its store, and its figure exists."""
    from pathlib import Path

    papermill = pytest.importorskip("papermill")
    repo = Path(__file__).resolve().parents[1]
    runs, figs = tmp_path / "runs", tmp_path / "figs"
    papermill.execute_notebook(str(repo / "notebooks" / "60_numerics_run.ipynb"), str(tmp_path / "60.ipynb"),
                               cwd=str(repo), progress_bar=False,
                               parameters=dict(model="tiny-vlm", dataset="easy-vqa", n=1, per_question=4,
                                               alternatives=["repeat", "bfloat16"], results_dir=str(runs),
                                               figures_dir=str(figs)))
    got = pd.read_csv(figs / "floor_format-bias_tiny-vlm.csv")
    want = nm.floor_table(ResultStore(runs / "tiny-vlm" / "easy-vqa" / "cells").read())
    assert list(got.alternative) == ["bfloat16", "repeat"] and list(got.flips) == list(want.flips)
    assert got.set_index("alternative").loc["repeat", "flip_rate"] == 0.0
    assert (figs / "floor_format-bias_tiny-vlm.png").stat().st_size > 10_000
