"""The notebooks: one name and one default per knob, every pipeline parameter a notebook parameter, and every
notebook executed end to end on the pipeline's quick profile.

A run notebook's parameters cell declares the study's parameters (``Study.params``: the same names and defaults
as ``mmfragile run <study> --help``) and the run's keywords of :func:`mmfragile.run_study` it uses, under
run_study's names and defaults, and passes each as ``name=name``. Papermill injects a parameter the notebook does
not declare without a word, so a stale name in ``pipeline.yaml`` would be ignored silently: the test refuses it.
"""
from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import nbformat
import pandas as pd
import pytest
import yaml

from mmfragile.grid import for_profile, load_pipeline
from mmfragile.study import BUILTIN, get_study, run_study

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
PIPELINE = NOTEBOOKS / "pipeline.yaml"
#: run_study keywords a run notebook may declare (model and dataset default to the study's own)
RUN_KNOBS = ("model", "dataset", "n", "results_dir", "threads", "budget", "budget_seed", "adaptive")
#: notebook parameters that are no knob of the run: where the notebook writes its figures
OUTPUT_PARAMS = ("figures_dir",)


def parameters(path: Path) -> dict[str, object]:
    """The parameters cell of a notebook: name -> default (a literal)."""
    nb = nbformat.read(str(path), as_version=4)
    cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1, f"{path.name}: one cell tagged 'parameters', found {len(cells)}"
    out = {}
    for node in ast.parse(cells[0].source).body:
        assert isinstance(node, ast.Assign) and len(node.targets) == 1, f"{path.name}: {ast.unparse(node)}"
        out[node.targets[0].id] = ast.literal_eval(node.value)
    return out


def code(path: Path) -> str:
    nb = nbformat.read(str(path), as_version=4)
    return "\n".join(c.source for c in nb.cells if c.cell_type == "code")


def run_notebooks() -> dict[str, str]:
    """notebook stem -> the study it runs (its ``run_study("<name>"`` call)."""
    out = {}
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        called = set(re.findall(r"run_study\(\"([a-z-]+)\"", code(path)))
        assert len(called) <= 1, f"{path.name} runs several studies: {called}"
        if called:
            out[path.stem] = called.pop()
    return out


def test_every_study_has_a_run_notebook():
    assert sorted(set(run_notebooks().values())) == sorted(BUILTIN)   # (tests register others: option-order)


@pytest.mark.parametrize("stem", sorted(run_notebooks()))
def test_a_run_notebook_declares_each_knob_once_under_its_one_name_and_default(stem):
    study = get_study(run_notebooks()[stem])
    path = NOTEBOOKS / f"{stem}.ipynb"
    declared, source = parameters(path), code(path)
    run_defaults = {k: p.default for k, p in inspect.signature(run_study).parameters.items()}
    run_defaults.update(model=study.default_model, dataset=study.default_dataset)
    study_defaults = {p.name: p.default for p in study.params}
    missing = sorted(set(study_defaults) - set(declared))
    assert not missing, f"{path.name}: the study's parameters {missing} are not in its parameters cell"
    unknown = sorted(set(declared) - set(study_defaults) - set(RUN_KNOBS) - set(OUTPUT_PARAMS))
    assert not unknown, f"{path.name}: {unknown} are neither {study.name}'s parameters nor run_study's keywords"
    for name, value in declared.items():
        if name in OUTPUT_PARAMS or name == "results_dir":   # where to write: no default to share
            continue
        want = study_defaults[name] if name in study_defaults else run_defaults[name]
        assert value == (list(want) if isinstance(want, tuple) else want), \
            f"{path.name}: {name} = {value!r}, but its default is {want!r} ({study.name} / run_study)"
        if name not in ("model", "dataset"):   # passed positionally
            assert re.search(rf"\b{name}={name}\b", source), f"{path.name} declares {name} but passes no {name}={name}"


def test_the_pipeline_names_only_parameters_its_notebooks_declare():
    steps = load_pipeline(PIPELINE)
    assert sorted(s["notebook"] for s in steps) == sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")), \
        "every notebook is a step of notebooks/pipeline.yaml, and every step a notebook"
    for step in steps:
        declared = parameters(NOTEBOOKS / step["notebook"])
        for profile in ("default", "quick", "full"):
            given = dict(for_profile(step.get("fixed", {}), profile) or {})
            for run in for_profile(step.get("runs"), profile) or []:
                given.update(run)
            given.update(for_profile(step.get("grid", {}), profile) or {})
            stale = sorted(set(given) - set(declared))
            assert not stale, f"pipeline.yaml, {step['notebook']} ({profile}): {stale} are not its parameters"


def test_notebooks_save_figures_through_the_one_save():
    """No notebook defines its own ``save``: figures go through mmfragile.figures.save_figure."""
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        assert not re.search(r"^def save\w*\(", code(path), re.M), f"{path.name} defines its own save()"
        assert ".savefig(" not in code(path), f"{path.name} calls savefig itself: use mmfragile.figures.save_figure"


def test_the_pipeline_file_is_what_reproduce_reads():
    assert yaml.safe_load(PIPELINE.read_text())["steps"] == load_pipeline(PIPELINE)


# ---------------------------------------------------------------------------------- every notebook, quick profile
#: the notebooks of each study in the pipeline (run notebook first); the quick-profile tests below run them all
STUDY_NOTEBOOKS = {
    "format-bias": ("30_", "31_", "32_", "33_", "34_", "35_"),
    "promptception": ("40_", "41_", "42_"),
    "judge": ("50_", "51_"),
    "numerics": ("60_",),
}


def test_the_quick_profile_tests_cover_every_notebook():
    covered = {p.stem for p in NOTEBOOKS.glob("*.ipynb") if any(p.stem.startswith(s)
                                                                 for v in STUDY_NOTEBOOKS.values() for s in v)}
    assert covered == {p.stem for p in NOTEBOOKS.glob("*.ipynb")}
    assert set(STUDY_NOTEBOOKS) == set(BUILTIN)


def quick(tmp_path: Path, study: str) -> Path:
    """Run ``study``'s notebooks on the quick profile with ``tmp_path`` as the working folder (the pipeline's
    relative results and figure folders land under it); returns it."""
    from mmfragile.grid import run_pipeline

    written = run_pipeline(PIPELINE, profile="quick", only=list(STUDY_NOTEBOOKS[study]), out_dir=tmp_path / "pm",
                           progress=False, cwd=tmp_path)
    stems = {p.parent.name for p in written}
    assert stems == {p.stem for p in NOTEBOOKS.glob("*.ipynb") if p.stem.startswith(STUDY_NOTEBOOKS[study])}
    return tmp_path


def test_format_bias_notebooks_run_end_to_end_on_the_quick_profile(tmp_path):
    from mmfragile.store import ResultStore
    from mmfragile.studies import format_bias as fbs

    root = quick(tmp_path, "format-bias")
    table7 = pd.read_csv(root / "figures/quick/format_bias/table7_all_questions.csv", header=[0, 1], index_col=[0, 1])
    for model in ("smollm2-vlm", "tiny-vlm"):   # the quick profile's models (pipeline.yaml)
        store = root / "runs/quick/format_bias" / model / "synthetic-image"
        pq = fbs.results_to_metrics_frame(ResultStore(store).read(), include_standard=True)
        assert pq["format"].nunique() == 48 + 1 and (store / "cp_ln" / "config.json").exists()
        vanilla = 100 * fbs.standard_rows(pq)["correct"].mean()   # the standard format's accuracy, from the store
        assert float(table7.loc[("synthetic-vqa", model), ("Vanilla", "Acc. [%]")]) == pytest.approx(vanilla, abs=0.005)
    for fig in ("fig3_rank_distribution", "fig6_lmm_coefficients", "fig7_confidence_bins", "fig8_mitigation_all_questions"):
        assert (root / "figures/quick/format_bias" / f"{fig}.png").stat().st_size > 10_000
    assert any((root / "figures/quick/budget/format-bias").glob("*.png"))   # 35 on the embedded grid
    assert (root / "figures/format_bias/published/fig8_mitigation_published.png").exists()   # the published run


def test_promptception_notebooks_run_end_to_end_on_the_quick_profile(tmp_path):
    from mmfragile.store import ResultStore

    root = quick(tmp_path, "promptception")
    rows = ResultStore(root / "runs/quick/promptception/tiny-vlm/synthetic-vqa").read()
    # an image and a video question x the quick profile's 6 prompt types, but 11.4 is for videos only (Table 1):
    # 11 answers, each stored once (unparseable ones out of coverage, none dropped)
    assert sorted(rows.modality.unique()) == ["image", "video"]
    assert len(rows) == 11 == len(rows.drop_duplicates(["question_id", "prompt_id"]))
    assert set(rows[rows.modality == "image"].prompt_id) == {"1.1", "2.1", "5.2", "7.6", "12.3"}
    assert (root / "figures/quick/promptception/fig11_accuracy_across_prompts_synthetic_vqa.png").exists()
    assert any((root / "figures/quick/budget/promptception").glob("*.png"))   # 42 on a simulated MMStar grid


def test_judge_notebooks_run_end_to_end_on_the_quick_profile(tmp_path):
    from mmfragile.store import ResultStore
    from mmfragile.studies import judgebias as jb

    root = quick(tmp_path, "judge")
    rows = ResultStore(root / "runs/quick/judgebias/scores").read()
    want = jb.parse_failure_table(jb.main_rows(rows), by=("judge", "prompt_variant", "perturbation"))
    got = pd.read_csv(root / "figures/quick/judgebias/parse_failures.csv")
    assert got["n"].tolist() == want["n"].tolist() and got["n_unparseable"].tolist() == want["n_unparseable"].tolist()
    assert (root / "figures/quick/judgebias/perturbation_examples.png").exists()
    assert (root / "figures/judgebias/published/table2_heatmap.png").exists()   # 51 on the published Table 2


def test_numerics_notebook_runs_end_to_end_on_the_quick_profile(tmp_path):
    from mmfragile.store import ResultStore
    from mmfragile.studies.numerics.metrics import floor_table

    root = quick(tmp_path, "numerics")
    got = pd.read_csv(root / "figures/quick/numerics/floor_format-bias_tiny-vlm.csv")
    want = floor_table(ResultStore(root / "runs/quick/numerics/tiny-vlm/synthetic-image/cells").read())
    assert list(got.alternative) == list(want.alternative) and list(got.flips) == list(want.flips)
