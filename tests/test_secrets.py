"""An API key never leaves the process (mmfragile.redaction): not in a store, a report, an export, an error line.

The canary test plants four distinct secrets - a ``--model-args api_key=``, ``$OPENAI_API_KEY``, URL user info and a
``?api_key=`` query parameter - runs every study's CLI against a fake OpenAI-compatible server on 127.0.0.1, then
``report``, ``merge``, ``export`` to every harness and a refused rerun, and greps every file written, stdout and
stderr: no canary anywhere, while the server saw each key where a client sends it.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings

import pytest

pytest.importorskip("openai")

from test_openai_backend import FakeServer  # noqa: E402

from mmfragile.models.spec import ModelSpec  # noqa: E402
from mmfragile.provenance import model_identity, same_model  # noqa: E402
from mmfragile.redaction import MARK, redact, redact_obj, without_credentials  # noqa: E402
from mmfragile.store import ResultStore  # noqa: E402

ARG, ENV, USER, QUERY = "sk-CANARYARG0001", "sk-CANARYENV0002", "sk-CANARYUSER003", "sk-CANARYQRY0004"
OLD = "sk-CANARYOLDSTORE5"  # the key a store written before the fix holds
CANARIES = (ARG, ENV, USER, QUERY, OLD)
FORMAT_BIAS = ["--dataset", "synthetic-text", "--n", "1", "--formats", "uppercase-dot-line_break"]


# ------------------------------------------------------------------------------------------ the redaction itself
def test_redact_masks_each_kind_of_secret_and_nothing_else():
    assert redact(f"openai:http://127.0.0.1:1/v1::m api_key={ARG} batch_size=4") == \
        "openai:http://127.0.0.1:1/v1::m api_key=*** batch_size=4"
    assert redact(f"http://bob:{USER}@host:8/v1::m") == "http://***@host:8/v1::m"
    assert redact(f"https://h/v1?x=1&key={QUERY}::gpt") == "https://h/v1?x=1&key=***::gpt"
    assert redact(f"https://h/v1?token={QUERY}&x=1") == "https://h/v1?token=***&x=1"
    assert redact(json.dumps({"api_key": ARG, "n": 3})) == '{"api_key": "***", "n": 3}'
    plain = "uppercase-dot-line_break: 61.5 % (keyboard=key, https://example.org/v1)"
    assert redact(plain) == plain
    assert redact_obj({"a": [f"x api_key={ARG}"], "api_key": ARG, "k": 3}) == \
        {"a": ["x api_key=***"], "api_key": MARK, "k": 3}


def test_a_key_from_the_environment_is_masked_wherever_it_shows(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", ENV)
    assert redact(f"HTTP 401 from server: key {ENV} rejected") == "HTTP 401 from server: key *** rejected"


def test_spec_shows_and_records_no_secret_and_a_key_is_not_a_model_change():
    with_key = ModelSpec.parse(f"openai:http://u:{USER}@h:1/v1?api_key={QUERY}::m", api_key=ARG, seed=1)
    assert str(with_key) == "openai:http://***@h:1/v1?api_key=***::m api_key=*** seed=1"
    assert not any(c in repr(with_key) for c in CANARIES)
    assert "api_key" not in with_key.output_options
    bare = ModelSpec.parse("openai:http://h:1/v1::m", seed=1)
    other_key = ModelSpec.parse("openai:http://h:1/v1::m", api_key="sk-another-key-9", seed=1)
    ids = [model_identity(s, "none") for s in (with_key, bare, other_key)]
    assert ids[0] == ids[1] == ids[2]
    assert ids[0]["source"] == "http://h:1/v1::m"
    # an identity pinned before the fix (credentials in its source) is still the same model
    old = {**ids[0], "source": f"http://u:{OLD}@h:1/v1::m"}
    assert same_model(old, ids[1])
    assert not same_model(ids[0], model_identity(ModelSpec.parse("openai:http://h:1/v1::m", seed=2), "none"))


def test_without_credentials_keeps_the_rest_of_the_url():
    assert without_credentials(f"http://h/v1?x=1&token={QUERY}&y=2::m") == "http://h/v1?x=1&y=2::m"
    assert without_credentials("http://***@h/v1?key=***::m") == "http://h/v1::m"
    assert without_credentials("http://h/v1::m") == "http://h/v1::m"


def test_an_old_store_is_cleaned_when_opened_for_writing(tmp_path):
    config = {"study": "format-bias", "stage": "grid", "model": "m"}
    ResultStore(tmp_path, config=config)
    raw = json.loads((tmp_path / "config.json").read_text())
    raw["run_info"] = {"provenance": {"m": {"model_spec": f"openai:http://h/v1::m api_key={OLD}"}},
                       "model_identity": {"m": {"backend": "openai", "source": f"http://u:{OLD}@h/v1::m", "args": {},
                                                "checkpoint_sha256": "none"}}}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert OLD not in json.dumps(ResultStore(tmp_path).config)           # never read back
    assert OLD in (tmp_path / "config.json").read_text()                 # a read-only open changes nothing
    with pytest.warns(UserWarning, match=r"config.json held a secret .* has been cleaned"):
        st = ResultStore(tmp_path, config=config)
    assert OLD not in (tmp_path / "config.json").read_text()
    st.pin_model("m", model_identity(ModelSpec.parse("openai:http://h/v1::m", api_key=ARG), "none"))  # same model
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ResultStore(tmp_path, config=config)  # clean now: no second warning


# ------------------------------------------------------------------------------------------ the canary run
@pytest.fixture(scope="module")
def canary_run(tmp_path_factory):
    """Every command a user runs with a model that holds secrets; ``(work folder, [(argv, rc, stdout, stderr)],
    server requests)``."""
    work = tmp_path_factory.mktemp("canary")
    server = FakeServer()
    url, host = server.url, server.url.removeprefix("http://")
    env = {**os.environ, "OPENAI_API_KEY": ENV, "PYTHONWARNINGS": "default"}
    runs = []

    def cli(*args: str) -> tuple[int, str, str]:
        argv = [sys.executable, "-m", "mmfragile", *args]
        p = subprocess.run(argv, env=env, cwd=work, capture_output=True, text=True, timeout=600)
        runs.append((args, p.returncode, p.stdout, p.stderr))
        return p.returncode, p.stdout, p.stderr

    try:
        fb = ["run", "format-bias", "--model", f"openai:{url}::m", *FORMAT_BIAS]
        assert cli(*fb, "--model-args", f"api_key={ARG}", "--out", "fb")[0] == 0, runs[-1]
        # a store written before the fix: its config holds a key (in the spec and in the pinned identity)
        shutil.copytree(work / "fb", work / "old")
        cfg = json.loads((work / "old" / "config.json").read_text())
        cfg["run_info"]["provenance"]["m"]["model_spec"] += f" api_key={OLD}"
        cfg["run_info"]["model_identity"]["m"]["source"] = f"http://me:{OLD}@{host}::m"
        (work / "old" / "config.json").write_text(json.dumps(cfg))
        assert cli("report", "old", "--out", "old_report")[0] == 0, runs[-1]
        assert cli(*fb, "--model-args", f"api_key={ARG}", "--out", "old")[0] == 0, runs[-1]
        # the key from the environment; URL user info; a key in the URL's query
        assert cli(*fb, "--out", "fb_env")[0] == 0, runs[-1]
        assert cli("run", "promptception", "--model", f"openai:http://me:{USER}@{host}::m", "--n", "1",
                   "--out", "pc")[0] == 0, runs[-1]
        assert cli("run", "judge", "--model", f"openai:{url}?api_key={QUERY}::m", "--n-samples", "1",
                   "--decoding", "greedy", "--runs", "1", "--perturbations", "text_dominance", "--out", "jb")[0] == 0, \
            runs[-1]
        assert cli("report", ".", "--out", "report")[0] == 0, runs[-1]
        assert cli("merge", "merged", "fb")[0] == 0, runs[-1]
        assert cli("merge", "fb")[0] == 0, runs[-1]
        for harness in ("lmms-eval", "lm-eval", "vlmevalkit"):  # refused: an API model has no tokenizer to export
            assert cli("export", harness, "--model", f"openai:http://me:{USER}@{host}?key={QUERY}::m",
                       "--out", f"export_{harness}")[0] == 2, runs[-1]
        # a refused rerun: another model (seed changes outputs) under the same name in the same store
        code, _, err = cli(*fb, "--model-args", f"api_key={ARG},seed=3", "--out", "fb")
        assert code == 2 and "their rows would mix" in err, runs[-1]
        # and a failing one: the server refuses the request, echoing what it got
        server.plan = [(401, {}, json.dumps({"error": {"message": f"bad key {ARG} for {url}?key={QUERY}"}}))] * 50
        assert cli(*fb, "--model-args", f"api_key={ARG},max_retries=0", "--out", "fb_401")[0] == 1, runs[-1]
        server.plan = []
        with server.lock:
            requests = list(server.requests)
    finally:
        server.close()
    return work, runs, requests


def test_no_canary_in_any_file_or_output(canary_run):
    work, runs, _ = canary_run
    files = [p for p in work.rglob("*") if p.is_file()]
    assert any(p.name == "report.html" for p in files) and any(p.name.endswith(".parquet") for p in files)
    leaks = [(str(p.relative_to(work)), c) for p in files for c in CANARIES if c.encode() in p.read_bytes()]
    leaks += [(" ".join(args), c) for args, _, out, err in runs for c in CANARIES if c in out + err]
    assert not leaks


def test_the_server_saw_each_key_where_a_client_sends_it(canary_run):
    _, _, requests = canary_run
    auth = {r["headers"].get("Authorization") for r in requests}
    assert {f"Bearer {ARG}", f"Bearer {ENV}"} <= auth
    assert any(f"api_key={QUERY}" in r["query"] for r in requests)


def test_what_the_user_reads_says_where_the_secret_was(canary_run):
    work, runs, _ = canary_run
    report = (work / "report" / "report.md").read_text()
    assert f"openai:{'http://127.0.0.1'}" in report and "api_key=***" in report
    old_config = (work / "old" / "config.json").read_text()
    assert "api_key=***" in old_config and OLD not in old_config
    reruns = [err for args, _, _, err in runs if args[-1] == "old" and args[0] == "run"]
    assert len(reruns) == 1 and "warning: " in reruns[0] and "config.json held a secret" in reruns[0]
    refused = [err for args, code, _, err in runs if code == 2 and args[0] == "run"]
    assert refused and all(err.startswith("error: ") and err.count("\n") == 1 for err in refused)
    failed = [err for args, code, _, err in runs if args[-1] == "fb_401"]
    assert "HTTP 401" in failed[0] and "bad key ***" in failed[0]
