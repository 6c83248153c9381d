"""--shard i/n for every study (SLURM arrays): a deterministic split by question group, shards written into one
store (concurrently for the format grid: a CLI process and this one), and `merge` checking completeness - the
sharded table equals the one-process table."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pandas as pd
import pytest

from mmfragile.cli import main
from mmfragile.shards import Shard, question_group, shard_index, split
from mmfragile.store import ResultStore, merge_stores
from mmfragile.study import StageTask

KEY = ["model", "dataset", "question_id", "variant"]


def _sorted(df: pd.DataFrame, cols: list[str]) -> pd.DataFrame:
    return df[cols].sort_values(KEY).reset_index(drop=True)


def test_split_is_deterministic_and_complete():
    groups = [question_group("ds", f"q{i}") for i in range(50)]
    for n in (1, 2, 3, 7):
        parts = split(groups, n, lambda g: g)
        assert sorted(g for p in parts for g in p) == sorted(groups)          # every group in exactly one shard
        for i, p in enumerate(parts):
            assert all(Shard(i, n).owns(g) for g in p)
    # SHA-1 of the group, first 8 bytes big-endian, modulo n: the same in every process and on every machine
    g = "synthetic-vqa/count-0000"
    assert shard_index(g, 4) == int.from_bytes(hashlib.sha1(g.encode()).digest()[:8], "big") % 4 == 3
    assert Shard.parse("2/5") == Shard(2, 5) and Shard.parse(None) == Shard(0, 1) and Shard(1, 3).label == "shard-1-of-3"
    for bad in ("5/5", "-1/2", "1", "a/b", "0/0"):
        with pytest.raises(ValueError, match="i/n|0 <= i < n"):
            Shard.parse(bad)


FORMATS = "uppercase-dot-line_break,numbers-bracket-semicolon"


def _args(out, shard):
    return ["formats", "--model", "tiny-vlm", "--dataset", "synthetic-image", "--n", "3", "--out", str(out),
            "--formats", FORMATS, "--batch-size", "8", "--flush-every", "6", "--quiet", "--shard", shard]


def test_format_grid_shards_written_concurrently_then_merged(tmp_path, tiny_vlm, capsys):
    from mmfragile.api import load_dataset
    from mmfragile.runner import run_items
    from mmfragile.studies.format_bias.prompts import exact_match_score
    from mmfragile.studies.format_bias.items import format_bias_items
    from mmfragile.studies.format_bias.prompts import PromptFormat

    items = format_bias_items(tiny_vlm, load_dataset("synthetic-image", n=3),
                              formats=[PromptFormat.from_name(f) for f in FORMATS.split(",")])
    expected = run_items(tiny_vlm, items, ResultStore(tmp_path / "one"), exact_match_score, batch_size=8,
                         progress=False)
    out = tmp_path / "sharded"
    # shard 0/2 in another process while this process runs shard 1/2: two writers, one store
    other = subprocess.Popen([sys.executable, "-m", "mmfragile", *_args(out, "0/2")],
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert main(_args(out, "1/2")) == 0
    assert other.wait(timeout=600) == 0, other.stderr.read().decode()[-2000:]
    capsys.readouterr()
    assert main(["merge", str(out)]) == 0
    report = capsys.readouterr().out
    assert "COMPLETE" in report and f"{len(expected)} rows stored" in report
    cols = KEY + ["raw_output", "correct", "covered", "selected_position", "answer_id"]
    pd.testing.assert_frame_equal(_sorted(expected, cols), _sorted(ResultStore(out).read(), cols))
    owners = {shard_index(question_group(d, q), 2) for d, q in zip(expected.dataset, expected.question_id)}
    assert owners == {0, 1}                                                 # both shards had work


def test_merge_names_a_shard_that_never_ran(tmp_path, capsys):
    st = ResultStore(tmp_path / "s", config={"study": "x"})
    st.declare(pd.DataFrame([{"model": "m", "dataset": "d", "question_id": "1", "variant": "v"}]), "shard-0-of-2")
    st.append([{"model": "m", "dataset": "d", "question_id": "1", "variant": "v", "x": 1}])
    assert main(["merge", str(tmp_path / "s")]) == 1
    assert "1/2" in capsys.readouterr().out


def test_promptception_shards_equal_one_run(tmp_path, tiny_vlm, synthetic):
    from mmfragile.studies.promptception import select_questions

    qs = select_questions(synthetic, 4)
    task = StageTask("promptception", "prompts", (("prompt_ids", ["1.1", "12.1"]), ("max_new_tokens", 4),
                                                  ("n_frames", 3), ("match_text", True), ("batch_size", 8)))
    one = ResultStore(tmp_path / "one")
    task(tiny_vlm, qs.to_dict("records"), one, Shard(0, 1))
    sharded = ResultStore(tmp_path / "sharded")
    for i in range(3):
        task(tiny_vlm, qs.to_dict("records"), sharded, Shard(i, 3))
    cols = KEY + ["raw_output", "letter", "extraction_stage", "correct", "covered"]
    a, b = one.read(), ResultStore(tmp_path / "sharded").read()
    assert len(a) == 4 * 2
    pd.testing.assert_frame_equal(_sorted(a, cols), _sorted(b, cols))
    rep = merge_stores(tmp_path / "sharded")
    assert rep.complete and rep.missing_shards == [] and rep.n_expected == len(a)


def test_judge_and_pairwise_shards_equal_one_run(tmp_path, tiny_vlm):
    from mmfragile.studies.judgebias.data import make_judge_set
    from mmfragile.studies import judgebias as jb

    samples = make_judge_set(2, 0, tmp_path / "data", n_text=1)[::2]     # img000, img001, txt000 (good)
    conditions = jb.build_judge_conditions(samples, ["text_dominance", "unnecessary_image"], 0, tmp_path / "audit")
    pairs = jb.position_pairs(samples)[:4]
    kw = (("runs", 2), ("max_new_tokens", 3), ("pairwise_max_new_tokens", 3), ("batch_size", 8))
    judge, pairwise = StageTask("judge", "scores", kw), StageTask("judge", "pairwise", kw)
    one = ResultStore(tmp_path / "one")
    judge(tiny_vlm, conditions, one, Shard(0, 1))
    pairwise(tiny_vlm, pairs, one, Shard(0, 1))
    sharded = ResultStore(tmp_path / "sharded")
    for i in range(2):
        judge(tiny_vlm, conditions, sharded, Shard(i, 2))
        pairwise(tiny_vlm, pairs, sharded, Shard(i, 2))
    a, b = one.read(), ResultStore(tmp_path / "sharded").read()
    assert len(a) == 2 * (len(conditions) + len(pairs)) and a.sample_seed.ne("").all()   # seeded sampled runs
    cols = KEY + ["raw_output", "status", "sample_seed"]
    pd.testing.assert_frame_equal(_sorted(a, cols), _sorted(b, cols))
    assert merge_stores(tmp_path / "sharded").complete


def test_promptception_and_judge_commands_by_shard(tmp_path, capsys):
    """The CLI of studies 2 and 3 with --shard: two shards make a complete store (merge exit status 0)."""
    pc = ["promptception", "--model", "tiny-vlm", "--n", "3", "--prompt-ids", "1.1", "--max-new-tokens", "3",
          "--n-frames", "2", "--match-text", "--out", str(tmp_path / "pc"), "--quiet"]
    judge = ["judge", "--model", "tiny-vlm", "--n-samples", "1", "--perturbations", "text_dominance", "--runs", "1",
             "--max-new-tokens", "3", "--pairwise", "--pairwise-max-new-tokens", "3", "--out", str(tmp_path / "jb"),
             "--quiet"]
    for shard in ("0/2", "1/2"):
        assert main([*pc, "--shard", shard]) == 0
        assert main([*judge, "--shard", shard]) == 0
    # 1 scene -> 2 image samples, 2 text items -> 4 text samples: 6 originals + 2 text_dominance judgments;
    # the 3 good samples x (2 position orders + 2 verbosity orders) pairwise judgments
    for store, n in ((tmp_path / "pc", 3), (tmp_path / "jb" / "scores", 6 + 2), (tmp_path / "jb" / "pairwise", 12)):
        capsys.readouterr()
        assert main(["merge", str(store)]) == 0, capsys.readouterr().out
        assert len(ResultStore(store).read()) == n


def test_cp_ln_and_self_generation_by_shard(tmp_path, capsys):
    """CP-LN (format-bias --cp-ln) and judge self-generation (responses + the judge's scores of them) run by
    --shard like every other stage: two shards make complete stores equal to one run."""
    fb = ["run", "format-bias", "--model", "tiny-vlm", "--dataset", "synthetic-image", "--n", "3", "--formats",
          "uppercase-dot-line_break", "--standard-format", "none", "--cp-ln", "--quiet"]
    judge = ["run", "judge", "--model", "tiny-vlm", "--n-samples", "2", "--perturbations", "text_dominance",
             "--runs", "1", "--max-new-tokens", "3", "--generator-max-new-tokens", "3", "--self-generators",
             "smollm2", "--quiet"]
    for shard in ("0/2", "1/2"):
        assert main([*fb, "--out", str(tmp_path / "fb"), "--shard", shard]) == 0
        assert main([*judge, "--out", str(tmp_path / "jb"), "--shard", shard]) == 0
    assert main([*fb, "--out", str(tmp_path / "fb1")]) == 0
    assert main([*judge, "--out", str(tmp_path / "jb1")]) == 0
    for store, n in (("fb/cp_ln", None), ("jb/responses", None), ("jb/scores", None)):
        one = ResultStore(tmp_path / store.replace("fb", "fb1", 1).replace("jb", "jb1", 1)).read()
        sharded = ResultStore(tmp_path / store).read()
        cols = [c for c in KEY + ["raw_output", "logprob", "response"] if c in one.columns]
        pd.testing.assert_frame_equal(_sorted(one, cols), _sorted(sharded, cols), check_exact=False, rtol=1e-5)
        capsys.readouterr()
        assert main(["merge", str(tmp_path / store)]) == 0, capsys.readouterr().out
    cp = ResultStore(tmp_path / "fb" / "cp_ln").read()
    assert len(cp) == cp.n_options.groupby(cp.question_id).first().sum()          # every option of every question
    sg = ResultStore(tmp_path / "jb" / "scores").read()
    sg = sg[sg.dataset.str.endswith("-selfgen")]
    # the judge's own responses (image and text items), SmolLM2's (text items only: it cannot see) and the references
    assert set(sg.generator) == {"tiny-vlm", "smollm2", "reference"}
    assert set(sg[sg.generator == "smollm2"].modality) == {"text"}


def test_merge_shard_folders_into_a_new_store_equals_one_run_and_fails_leaving_nothing(tmp_path, capsys,
                                                                                     monkeypatch):
    """`merge NEW S0 S1`: shards run into folders of their own come together in a new store equal to the
    one-process run; a merge that fails (another configuration, another model under the name, a crash halfway)
    leaves no NEW and no temporary folder behind."""
    from mmfragile.store import ConfigMismatch

    def run(out, *extra):
        assert main(_args(out, "0/1")[:-2] + list(extra)) == 0

    run(tmp_path / "one")
    run(tmp_path / "s0", "--shard", "0/2")
    run(tmp_path / "s1", "--shard", "1/2")
    capsys.readouterr()
    new = tmp_path / "merged"
    assert main(["merge", str(new), str(tmp_path / "s0"), str(tmp_path / "s1")]) == 0
    report = capsys.readouterr().out
    one = ResultStore(tmp_path / "one").read()
    assert f"{new}: {len(one)} rows stored, {len(one)} expected by the manifests - COMPLETE" in report
    cols = KEY + ["raw_output", "correct", "covered", "selected_position", "answer_id"]
    pd.testing.assert_frame_equal(_sorted(one, cols), _sorted(ResultStore(new).read(), cols))
    info = ResultStore(new).config["run_info"]
    assert info["model_identity"] == ResultStore(tmp_path / "one").config["run_info"]["model_identity"]
    assert set(info["provenance"]) == {"tiny-vlm"}

    def nothing_left(dest):
        assert not dest.exists() and not list(tmp_path.glob(f".{dest.name}.*"))

    run(tmp_path / "n4", "--shard", "1/2", "--n", "4")                      # another configuration
    with pytest.raises(ConfigMismatch, match=r"s0's; .*differences \(s0, n4\): \{'n': \(3, 4\)\}"):
        merge_stores(tmp_path / "bad", [tmp_path / "s0", tmp_path / "n4"])
    nothing_left(tmp_path / "bad")
    run(tmp_path / "bf16", "--shard", "1/2", "--model-args", "dtype=bfloat16")   # another model, same name
    with pytest.raises(ConfigMismatch, match=r"bf16: its run_info.model_identity\['tiny-vlm'\] is hf:tiny-vlm dtype=bfloat16 \(checkpoint "
                                               r".*the stores before it have hf:tiny-vlm \(checkpoint"):
        merge_stores(tmp_path / "bad", [tmp_path / "s0", tmp_path / "bf16"])
    nothing_left(tmp_path / "bad")
    calls = []

    def crash(self, rows):                                               # the disk fails on the second source
        calls.append(1)
        if len(calls) > 1:
            raise OSError("simulated failure")
        return real(self, rows)

    real = ResultStore.append
    monkeypatch.setattr(ResultStore, "append", crash)
    with pytest.raises(OSError, match="simulated"):
        merge_stores(tmp_path / "bad", [tmp_path / "s0", tmp_path / "s1"])
    nothing_left(tmp_path / "bad")
    monkeypatch.undo()
    assert merge_stores(tmp_path / "bad", [tmp_path / "s0", tmp_path / "s1"]).complete   # the same merge again
