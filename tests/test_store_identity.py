"""A store is one model per model name (issue 27): its identity - backend, source, the arguments that change
outputs, the checkpoint's SHA-256 - is pinned on the first run; a resume with another model under that name is
refused before the model loads, in one line naming both; provenance is never rewritten over rows it did not
produce; the report keeps two models of one name apart."""
from __future__ import annotations

import json
import shutil

import pytest

from mmfragile.cli import main
from mmfragile.models.embedded import embedded_model_path
from mmfragile.models.spec import ModelSpec, as_spec
from mmfragile.provenance import tree_sha256
from mmfragile.store import ConfigMismatch, ResultStore
from mmfragile.study import run_study

ARGS = ["run", "format-bias", "--dataset", "synthetic-image", "--n", "2", "--formats", "uppercase-dot-line_break",
        "--quiet"]


def _cfg(out) -> dict:
    return json.loads((out / "config.json").read_text())


def _no_load(monkeypatch):
    monkeypatch.setattr(ModelSpec, "load", lambda self: pytest.fail(f"{self} loaded before the refusal"))


def test_resume_with_dtype_is_refused_before_the_model_loads_and_the_report_keeps_both_apart(tmp_path, capsys,
                                                                                            monkeypatch):
    from mmfragile.report import build_report

    out = tmp_path / "fp32"
    assert main(ARGS + ["--model", "tiny-vlm", "--out", str(out)]) == 0
    cfg = _cfg(out)
    sha = tree_sha256(embedded_model_path("tiny-vlm", 0))
    assert cfg["run_info"]["model_identity"] == {
        "tiny-vlm": {"backend": "hf", "source": "tiny-vlm", "args": {}, "checkpoint_sha256": sha}}
    capsys.readouterr()
    with monkeypatch.context() as m:
        _no_load(m)
        assert main(ARGS + ["--model", "tiny-vlm", "--out", str(out), "--model-args", "dtype=bfloat16"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert (f"the model named 'tiny-vlm' here is hf:tiny-vlm (checkpoint sha256 {sha[:12]}), not hf:tiny-vlm "
            f"dtype=bfloat16 (checkpoint sha256 {sha[:12]}) (stored vs requested)") in err
    assert "Use a new --out" in err and "name=NEW" in err
    assert _cfg(out) == cfg                                   # nothing rewritten: provenance stays the fp32 run's
    # a speed-only argument resumes: nothing new to compute, identity and provenance as they were
    assert main(ARGS + ["--model", "tiny-vlm", "--out", str(out), "--model-args", "batch_size=3"]) == 0
    assert _cfg(out)["run_info"]["model_identity"] == cfg["run_info"]["model_identity"]
    assert _cfg(out)["run_info"]["provenance"] == cfg["run_info"]["provenance"]
    # the bf16 run in its own folder; a report over both shows two rows, labelled, with a warning
    assert main(ARGS + ["--model", "tiny-vlm", "--out", str(tmp_path / "bf16"), "--model-args", "dtype=bfloat16"]) == 0
    rep = build_report([out, tmp_path / "bf16"], tmp_path / "report", n_boot=10)
    (warning,) = [n for n in rep.notes if "different models are named 'tiny-vlm'" in n]
    assert warning.startswith("WARNING") and "dtype=bfloat16" in warning
    md = rep.markdown.read_text()
    for label in (f"tiny-vlm [hf:tiny-vlm (checkpoint sha256 {sha[:12]})]",
                  f"tiny-vlm [hf:tiny-vlm dtype=bfloat16 (checkpoint sha256 {sha[:12]})]"):
        assert f"| {label} | synthetic-vqa |" in md


def test_another_checkpoint_in_a_folder_of_the_same_name_is_refused_a_moved_one_resumes(tmp_path, capsys,
                                                                                       monkeypatch):
    src = embedded_model_path("tiny-vlm", 0)
    a, b, moved = (shutil.copytree(src, tmp_path / d / "ckpt") for d in ("a", "b", "moved"))
    with open(b / "config.json", "a") as f:
        f.write("\n")                                         # other bytes, same model name ("ckpt")
    out = tmp_path / "out"
    assert main(ARGS + ["--model", str(a), "--out", str(out)]) == 0
    cfg = _cfg(out)
    assert cfg["run_info"]["provenance"]["ckpt"]["checkpoint_sha256"] == tree_sha256(a)
    capsys.readouterr()
    with monkeypatch.context() as m:
        _no_load(m)
        assert main(ARGS + ["--model", str(b), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"(checkpoint sha256 {tree_sha256(a)[:12]}), not hf:{b} (checkpoint sha256 {tree_sha256(b)[:12]})" in err
    assert _cfg(out) == cfg
    # the same bytes under another path are the same model: resumes, nothing recomputed, nothing rewritten
    n_rows = len(ResultStore(out).read())
    assert main(ARGS + ["--model", str(moved), "--out", str(out)]) == 0
    assert len(ResultStore(out).read()) == n_rows and _cfg(out)["run_info"] == cfg["run_info"]


def test_a_store_from_before_identities_resumes_and_records_one(tmp_path):
    out = tmp_path / "old"
    assert main(ARGS + ["--model", "tiny-vlm", "--out", str(out)]) == 0
    cfg = _cfg(out)
    legacy = {**cfg, "run_info": {k: v for k, v in cfg["run_info"].items() if k != "model_identity"}}
    (out / "config.json").write_text(json.dumps(legacy))
    assert main(ARGS + ["--model", "tiny-vlm", "--out", str(out)]) == 0
    assert _cfg(out)["run_info"]["model_identity"] == cfg["run_info"]["model_identity"]


def test_one_identity_per_model_name(tmp_path):
    from mmfragile.provenance import model_identity

    st = ResultStore(tmp_path / "s", {"study": "judge"})
    spec = ModelSpec.parse("/ckpt/m", dtype="bfloat16", batch_size=4, name="m")
    x = model_identity(spec, "a" * 64)
    assert x == {"backend": "hf", "source": "/ckpt/m", "args": {"dtype": "bfloat16"}, "checkpoint_sha256": "a" * 64}
    st.pin_model("m", x)
    st.pin_model("other", model_identity(ModelSpec.parse("/ckpt/o"), "b" * 64))   # a second model, its own entry
    st.pin_model("m", model_identity(ModelSpec.parse("/elsewhere/m", dtype="bfloat16"), "a" * 64))  # moved: same
    with pytest.raises(ConfigMismatch, match=r"give this model another name with --model-args name=NEW"):
        st.pin_model("m", model_identity(ModelSpec.parse("/ckpt/m", dtype="float32"), "a" * 64))
    with pytest.raises(ConfigMismatch):
        st.pin_model("other", model_identity(ModelSpec.parse("/ckpt/o"), "c" * 64))
    api = "none: no local checkpoint (an API model)"                 # no hash: the source tells models apart
    st.pin_model("gpt", model_identity(ModelSpec.parse("openai:http://a/v1::gpt"), api))
    with pytest.raises(ConfigMismatch):
        st.pin_model("gpt", model_identity(ModelSpec.parse("openai:http://b/v1::gpt"), api))
    assert set(st.config["run_info"]["model_identity"]) == {"m", "other", "gpt"}


def test_a_loaded_model_carries_its_spec_into_the_store(tmp_path):
    model = as_spec("tiny-vlm", dtype="bfloat16").load()
    assert model.spec == ModelSpec.parse("tiny-vlm", dtype="bfloat16")
    run = run_study("format-bias", model, "synthetic-image", n=1, out=tmp_path / "run",
                    formats=["uppercase-dot-line_break"], progress=False)
    info = run.stores["grid"].config["run_info"]
    assert info["model_identity"]["tiny-vlm"]["args"] == {"dtype": "bfloat16"}
    assert info["provenance"]["tiny-vlm"]["model_spec"] == "tiny-vlm dtype=bfloat16"
