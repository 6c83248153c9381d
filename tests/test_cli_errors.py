"""Every mistake a user can make on the command line is one line ``error: ...`` on stderr (exit 2), found before the
model loads and - where the mistake is in the model, ``--n`` or ``--out`` - before the dataset is read (the results
folder is never created). Uncaught failures are one line too (exit 1) unless ``--debug`` / ``MMFRAGILE_DEBUG=1``."""
from __future__ import annotations

import inspect
import json
import shutil

import pytest

from mmfragile import cli
from mmfragile.errors import UsageError
from mmfragile.models.spec import ModelSpec

RUN = ["run", "format-bias", "--dataset", "easy-vqa", "--formats", "uppercase-dot-line_break", "--quiet"]


@pytest.fixture(autouse=True)
def no_model_load(monkeypatch):
    """A pre-flight mistake must stop the run before any model loads."""
    def refuse(spec):
        raise AssertionError(f"the model {spec} was loaded before the mistake was reported")

    monkeypatch.setattr(ModelSpec, "_load", lambda spec, kw: refuse(spec))


@pytest.fixture(scope="module")
def tiny_llava(tmp_path_factory):
    from mmfragile.models.tiny import build_tiny

    return build_tiny("llava", tmp_path_factory.mktemp("ckpt"))


def checkpoint(tiny_llava, tmp_path, drop=(), model_type=None):
    """A copy of the tiny LLaVA checkpoint without the files ``drop`` (and with another ``model_type``)."""
    folder = tmp_path / "ckpt"
    shutil.copytree(tiny_llava, folder)
    for name in drop:
        (folder / name).unlink()
    if model_type:
        cfg = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**cfg, "model_type": model_type}))
    return folder


def one_error(capsys, code, argv, exit_code=2) -> str:
    """Run the CLI; assert the exit code and that stderr is exactly one ``error:`` line; return it."""
    assert cli.main(argv) == exit_code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_model_path_that_does_not_exist(tmp_path, capsys):
    line = one_error(capsys, 2, RUN + ["--model", str(tmp_path / "nope"), "--n", "2", "--out", str(tmp_path / "o")])
    assert f"model folder {tmp_path / 'nope'} does not exist" in line
    assert not (tmp_path / "o").exists()  # stopped before the dataset and the store


def test_model_id_not_in_the_cache_names_what_a_model_can_be(tmp_path, capsys):
    line = one_error(capsys, 2, RUN + ["--model", "someorg/nomodel", "--n", "2", "--out", str(tmp_path / "o")])
    assert "'someorg/nomodel'" in line and "tiny-vlm" in line and "zoo-smollm2-good" in line and "HF cache" in line


def test_checkpoint_without_image_processor_config(tiny_llava, tmp_path, capsys):
    folder = checkpoint(tiny_llava, tmp_path, drop=["processor_config.json"])
    line = one_error(capsys, 2, RUN + ["--model", str(folder), "--n", "2", "--out", str(tmp_path / "o")])
    assert str(folder) in line and "preprocessor_config.json" in line
    assert not (tmp_path / "o").exists()


def test_checkpoint_with_preprocessor_config_only_passes_the_check(tiny_llava, tmp_path):
    folder = checkpoint(tiny_llava, tmp_path)
    proc = json.loads((folder / "processor_config.json").read_text())
    (folder / "preprocessor_config.json").write_text(json.dumps(proc.pop("image_processor")))
    (folder / "processor_config.json").write_text(json.dumps(proc))
    ModelSpec.parse(str(folder)).check()  # the older layout transformers also loads


def test_checkpoint_without_tokenizer(tiny_llava, tmp_path, capsys):
    folder = checkpoint(tiny_llava, tmp_path, drop=["tokenizer.json"])
    line = one_error(capsys, 2, RUN + ["--model", str(folder), "--n", "2", "--out", str(tmp_path / "o")])
    assert "no tokenizer file" in line and "tokenizer.json" in line and "tokenizer.model" in line


def test_checkpoint_without_weights_or_config(tiny_llava, tmp_path, capsys):
    folder = checkpoint(tiny_llava, tmp_path, drop=["model.safetensors"])
    assert "no weights (model.safetensors" in one_error(
        capsys, 2, RUN + ["--model", str(folder), "--n", "2", "--out", str(tmp_path / "o")])
    (folder / "config.json").unlink()
    assert f"{folder}: not a checkpoint folder (no config.json)" in one_error(
        capsys, 2, RUN + ["--model", str(folder), "--n", "2", "--out", str(tmp_path / "o")])


def test_unknown_model_type_lists_the_supported_families(tiny_llava, tmp_path, capsys):
    from mmfragile.models.adapters import ADAPTERS

    folder = checkpoint(tiny_llava, tmp_path, model_type="llava_future")
    line = one_error(capsys, 2, RUN + ["--model", str(folder), "--n", "2", "--out", str(tmp_path / "o")])
    assert "model_type 'llava_future'" in line and "config.json" in line
    assert all(family in line for family in ADAPTERS)  # the registry, not a hand list


def test_unknown_model_args_key_lists_the_accepted_ones(tmp_path, capsys):
    from mmfragile.models.hf import HFModel

    line = one_error(capsys, 2, RUN + ["--model", "tiny-vlm", "--model-args", "dtyp=float32", "--n", "2",
                                       "--out", str(tmp_path / "o")])
    assert "unknown key 'dtyp'" in line and "did you mean 'dtype'?" in line
    own = [n for n in inspect.signature(HFModel.from_pretrained).parameters if n not in ("path", "kwargs")]
    assert own and all(n in line for n in own)          # the backend's own keywords, from its signature
    assert "attn_implementation" in line and "revision" in line  # and transformers' loading keywords
    assert not (tmp_path / "o").exists()


def test_known_model_args_and_config_keys_pass(tiny_llava):
    ModelSpec.parse("tiny-vlm", max_pixels=4096, dtype="float32", attn_implementation="eager").check()
    ModelSpec.parse(str(tiny_llava), image_token_index=3).check()  # a config.json key overrides the config
    with pytest.raises(UsageError, match="unknown key 'image_token_index'"):
        ModelSpec.parse("tiny-vlm", image_token_index=3).check()


def test_openai_model_args_are_the_client_constructors():
    with pytest.raises(UsageError, match="unknown key 'temprature'.*max_concurrency"):
        ModelSpec.parse("openai:http://127.0.0.1:9/v1::m", temprature=0.5).check()
    ModelSpec.parse("openai:http://127.0.0.1:9/v1::m", max_concurrency=2).check()


def test_unknown_dataset_kind_has_no_skip_bad_rows_hint(tmp_path, capsys):
    line = one_error(capsys, 2, ["run", "format-bias", "--model", "tiny-vlm", "--dataset", "mmbnech:x.tsv",
                                 "--out", str(tmp_path / "o"), "--quiet"])
    assert "unknown dataset prefix 'mmbnech'" in line and "mmbench" in line and "skip-bad-rows" not in line


def test_a_bad_row_keeps_the_skip_bad_rows_hint(tmp_path, capsys):
    from mmfragile.data.benchmarks import benchmark

    spec = benchmark("mmbench").write_fixture(tmp_path / "data", bad_rows=True)
    assert cli.main(["run", "format-bias", "--model", "tiny-vlm", "--dataset", spec, "--out", str(tmp_path / "o"),
                     "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("error: ") and "row 4" in err[0] and err[1].startswith("(--skip-bad-rows")


@pytest.mark.parametrize("n", ["0", "-1"])
def test_n_below_one(tmp_path, capsys, n):
    line = one_error(capsys, 2, RUN + ["--model", "tiny-vlm", "--n", n, "--out", str(tmp_path / "o")])
    assert f"--n (n=) must be 1 or more, got {n}" in line and "no questions" not in line
    assert not (tmp_path / "o").exists()


def test_out_inside_a_file(tmp_path, capsys):
    (tmp_path / "f.txt").write_text("x")
    line = one_error(capsys, 2, RUN + ["--model", "tiny-vlm", "--n", "2", "--out", str(tmp_path / "f.txt" / "run")])
    assert f"--out {tmp_path / 'f.txt' / 'run'}: {tmp_path / 'f.txt'} is a file, not a folder" in line


def test_out_not_writable(tmp_path, capsys):
    # /proc refuses new entries even to root (a chmod'ed folder would not stop root)
    line = one_error(capsys, 2, RUN + ["--model", "tiny-vlm", "--n", "2", "--out", "/proc/mmfragile-run"])
    assert line.startswith("error: --out /proc/mmfragile-run: cannot write in /proc")


def test_no_model_says_which_model_runs(tmp_path, capsys, monkeypatch):
    import mmfragile.study

    seen = {}
    monkeypatch.setattr(mmfragile.study, "run_study", lambda study, model, *a, **k: seen.setdefault("model", model)
                        and (_ for _ in ()).throw(UsageError("stop here")))
    assert cli.main(["run", "format-bias", "--n", "2", "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "model: zoo-smollm2-good (default; pass --model to choose)" and seen["model"] == "zoo-smollm2-good"
    assert cli.main(["run", "judge", "--n-samples", "2", "--out", str(tmp_path / "j"), "--quiet"]) == 2
    assert capsys.readouterr().err.splitlines()[0] == "model: smollm2-vlm (default; pass --model to choose)"


def test_argument_mistakes_are_one_line(tmp_path, capsys):
    line = one_error(capsys, 2, RUN + ["--model", "tiny-vlm", "--n", "two", "--out", str(tmp_path / "o")])
    assert "argument --n: invalid int value: 'two'" in line and "mmfragile run format-bias --help" in line
    assert "unrecognized arguments: --bogus" in one_error(capsys, 2, ["benchmarks", "--bogus"])


def test_an_unexpected_failure_is_one_line_and_debug_shows_the_traceback(tmp_path, capsys, monkeypatch):
    import mmfragile.study

    def boom(*a, **k):
        raise RuntimeError("disk on fire\nsecond line")

    monkeypatch.setattr(mmfragile.study, "run_study", boom)
    argv = RUN + ["--model", "tiny-vlm", "--out", str(tmp_path / "o")]
    line = one_error(capsys, 1, argv, exit_code=1)
    assert line.startswith("error: RuntimeError: disk on fire second line (") and "--debug" in line
    with pytest.raises(RuntimeError, match="disk on fire"):
        cli.main(["--debug"] + argv)
    with pytest.raises(RuntimeError, match="disk on fire"):
        cli.main(argv + ["--debug"])  # anywhere on the line
    monkeypatch.setenv("MMFRAGILE_DEBUG", "1")
    with pytest.raises(RuntimeError, match="disk on fire"):
        cli.main(argv)


def test_the_python_api_gets_the_same_errors(tmp_path):
    from mmfragile.study import run_study

    with pytest.raises(UsageError, match="does not exist"):
        run_study("format-bias", str(tmp_path / "nope"), "easy-vqa", n=2, out=tmp_path / "o")
    with pytest.raises(UsageError, match="unknown key 'dtyp'"):
        run_study("format-bias", "tiny-vlm", "easy-vqa", n=2, out=tmp_path / "o", model_args="dtyp=float32")
    with pytest.raises(UsageError, match="must be 1 or more"):
        run_study("format-bias", "tiny-vlm", "easy-vqa", n=0, out=tmp_path / "o")
    with pytest.raises(UsageError, match="does not exist"):
        ModelSpec.parse(str(tmp_path / "nope")).load()
    assert not (tmp_path / "o").exists()


def test_a_format_name_that_is_not_in_table_1(tmp_path, capsys):
    line = one_error(capsys, 2, ["run", "format-bias", "--dataset", "easy-vqa", "--formats",
                                 "uppercase-dot-line_break,lowercase-paren-space", "--model", "tiny-vlm", "--n", "1",
                                 "--out", str(tmp_path / "o"), "--quiet"])
    assert "--formats" in line and "'paren'" in line  # the bad level, with the levels to choose from


def test_n_given_to_the_judge_study(tmp_path, capsys):
    line = one_error(capsys, 2, ["run", "judge", "--model", "tiny-vlm", "--n", "3", "--out", str(tmp_path / "o"),
                                 "--quiet"])
    assert "--n-samples" in line  # on main --n was accepted and silently ignored
