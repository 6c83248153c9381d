"""OpenAIChatModel against a real loopback HTTP server implementing a fake /v1/chat/completions.

The server (http.server.ThreadingHTTPServer on 127.0.0.1, ephemeral port, in a thread) answers
deterministically (``"ans[<user text>]"``), records every request, counts requests in flight, and
can be scripted to return a queue of error responses (429 with Retry-After, 400, 500 x N) before
answering normally. Backoff sleeps are recorded instead of slept where the delay matters.
"""
from __future__ import annotations

import base64
import io
import json
import math
import socket
import threading
import time
import warnings
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("openai")

from mmfragile.models.base import LogLik, NoOutput, Prompt, is_no_output  # noqa: E402
from mmfragile.models.openai_api import (APIError, CorruptCacheWarning, OpenAIChatModel, _parse_retry_after,
                                         request_cache_key)
from mmfragile.errors import DataError

TOP = [  # first-token alternatives the fake server returns for logprobs requests
    {"token": "A", "logprob": -0.5},
    {"token": " B", "logprob": -1.0},
    {"token": "B", "logprob": -2.0},
    {"token": "c", "logprob": -3.0},
    {"token": "Yes", "logprob": -4.0},
]


def _user_text(body: dict) -> str:
    content = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
    if isinstance(content, str):
        return content
    return "".join(p["text"] for p in content if p["type"] == "text")


class FakeServer:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests: list[dict] = []  # {"path", "headers", "body"}
        self.plan: list[tuple[int, dict, str]] = []  # scripted (status, headers, body) responses
        self.in_flight = 0
        self.max_in_flight = 0
        self.barrier: threading.Barrier | None = None
        self.delay_by_text: dict[str, float] = {}
        self.choice_by_text: dict[str, dict] = {}  # user text -> the reply's choice (null content, tool calls ...)
        state = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output clean
                pass

            def _send(self, status: int, payload: str, headers: dict | None = None):
                data = payload.encode("utf-8")
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                n = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(n))
                with state.lock:
                    self.path, _, query = self.path.partition("?")  # the route; a query (a key in the URL) kept
                    state.requests.append({"path": self.path, "query": query, "headers": self.headers,  # case-insensitive
                                           "body": body})
                    state.in_flight += 1
                    state.max_in_flight = max(state.max_in_flight, state.in_flight)
                    scripted = state.plan.pop(0) if state.plan else None
                try:
                    if state.barrier is not None:
                        state.barrier.wait(timeout=5)  # proves `parties` requests are in flight at once
                    if scripted is not None:
                        status, headers, payload = scripted
                        with state.lock:
                            state.in_flight -= 1
                        self._send(status, payload, headers)
                        return
                    if self.path == "/v1/chat/completions":
                        text = _user_text(body)
                        time.sleep(state.delay_by_text.get(text, 0.0))
                        out = {"id": "x", "object": "chat.completion", "model": body["model"],
                               "choices": [{"index": 0, "finish_reason": "stop",
                                            "message": {"role": "assistant", "content": f"ans[{text}]"}}]}
                        if text in state.choice_by_text:
                            out["choices"] = [{"index": 0, **state.choice_by_text[text]}]
                        if body.get("logprobs"):
                            k = body.get("top_logprobs", 0)
                            out["choices"][0]["logprobs"] = {"content": [
                                {"token": "A", "logprob": -0.5, "top_logprobs": TOP[:k]}]}
                    elif self.path == "/v1/completions":
                        # echo: tokens are the characters of the prompt + one generated token
                        prompt = body["prompt"]
                        toks = list(prompt) + ["!"]
                        out = {"choices": [{"index": 0, "text": prompt + "!", "logprobs": {
                            "tokens": toks,
                            "token_logprobs": [None] + [-0.25] * (len(toks) - 1),
                            "text_offset": list(range(len(toks))), "top_logprobs": None}}]}
                    else:
                        with state.lock:
                            state.in_flight -= 1
                        self._send(404, json.dumps({"error": {"message": f"no route {self.path}"}}))
                        return
                    with state.lock:
                        state.in_flight -= 1
                    self._send(200, json.dumps(out))
                except Exception as e:  # noqa: BLE001 - surface server bugs as 500s
                    with state.lock:
                        state.in_flight -= 1
                    self._send(599, json.dumps({"error": {"message": f"fake server bug: {e!r}"}}))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    @property
    def n_requests(self) -> int:
        with self.lock:
            return len(self.requests)

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


@pytest.fixture()
def server():
    s = FakeServer()
    yield s
    s.close()


def make_model(server, **kw) -> OpenAIChatModel:
    kw.setdefault("timeout", 10)
    kw.setdefault("backoff_base", 0.001)
    kw.setdefault("backoff_max", 0.01)
    return OpenAIChatModel(server.url, "fake-model", **kw)


def _err(msg: str) -> str:
    return json.dumps({"error": {"message": msg, "type": "invalid_request_error"}})


# ------------------------------------------------------------------------------ generate


def test_generate_order_and_concurrency_limit(server, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    n, conc = 8, 4
    prompts = [Prompt(f"q{i}") for i in range(n)]
    # later prompts answer faster, so completion order is roughly the reverse of prompt order
    server.delay_by_text = {f"q{i}": 0.01 * (n - i) for i in range(n)}
    server.barrier = threading.Barrier(conc)  # requests are released only in groups of 4 in flight
    m = make_model(server, max_concurrency=conc)
    out = m.generate(prompts, max_new_tokens=5)
    assert out == [f"ans[q{i}]" for i in range(n)]
    assert server.n_requests == n
    assert server.max_in_flight == conc  # reached 4 (barrier) and never more
    body = server.requests[0]["body"]
    assert body["model"] == "fake-model"
    assert body["temperature"] == 0
    assert body["max_tokens"] == 5
    assert "seed" not in body
    assert "Authorization" not in server.requests[0]["headers"]
    assert m.generate([]) == [] and server.n_requests == n


def test_concurrency_limit_shared_across_threads(server):
    server.barrier = threading.Barrier(2)
    m = make_model(server, max_concurrency=2)
    results: dict[int, list[str]] = {}

    def run(t: int):
        results[t] = m.generate([Prompt(f"t{t}-{i}") for i in range(4)])

    threads = [threading.Thread(target=run, args=(t,)) for t in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=20)
    assert results == {t: [f"ans[t{t}-{i}]" for i in range(4)] for t in range(2)}
    assert server.max_in_flight == 2  # two callers x pool of 2, but one instance-wide limit of 2


def test_concurrency_one_is_sequential(server):
    m = make_model(server, max_concurrency=1)
    out = m.generate([Prompt(f"s{i}") for i in range(5)])
    assert out == [f"ans[s{i}]" for i in range(5)]
    assert server.max_in_flight == 1
    assert [_user_text(r["body"]) for r in server.requests] == [f"s{i}" for i in range(5)]


def test_messages_system_seed_api_key(server, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    m = make_model(server, seed=1234)
    m.generate([Prompt("hello", system="be brief")])
    req = server.requests[-1]
    assert req["headers"]["Authorization"] == "Bearer sk-from-env"
    assert req["body"]["seed"] == 1234
    assert req["body"]["messages"] == [{"role": "system", "content": "be brief"},
                                       {"role": "user", "content": "hello"}]
    make_model(server, api_key="sk-arg").generate([Prompt("x")])
    assert server.requests[-1]["headers"]["Authorization"] == "Bearer sk-arg"
    monkeypatch.delenv("OPENAI_API_KEY")
    make_model(server).generate([Prompt("y")])
    assert "Authorization" not in server.requests[-1]["headers"]


def test_extra_body_cannot_override_temperature(server):
    with pytest.raises(ValueError, match="temperature"):
        make_model(server, extra_body={"temperature": 0.7})
    m = make_model(server, extra_body={"top_k": 1})
    m.generate([Prompt("x")])
    assert server.requests[-1]["body"]["top_k"] == 1
    assert server.requests[-1]["body"]["temperature"] == 0


def test_assistant_prefix_modes(server):
    p = Prompt("Which?", assistant_prefix="Answer:")
    # default "user": prefix appended to the user text; an echoed prefix is removed from the reply
    out = make_model(server).generate([p])
    body = server.requests[-1]["body"]
    assert body["messages"] == [{"role": "user", "content": "Which?\nAnswer:"}]
    assert "continue_final_message" not in body
    assert out == ["ans[Which?\nAnswer:]"]  # reply does not start with the prefix: unchanged
    m = make_model(server)
    assert m._strip_echoed_prefix("Answer: B", "Answer:") == "B"
    # "continue": partial assistant message + vLLM flags
    make_model(server, assistant_prefix_mode="continue").generate([p])
    body = server.requests[-1]["body"]
    assert body["messages"][-1] == {"role": "assistant", "content": "Answer:"}
    assert body["messages"][0] == {"role": "user", "content": "Which?"}
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    # "prefill": trailing assistant message, no flags
    make_model(server, assistant_prefix_mode="prefill").generate([p])
    body = server.requests[-1]["body"]
    assert body["messages"][-1] == {"role": "assistant", "content": "Answer:"}
    assert "continue_final_message" not in body
    with pytest.raises(ValueError, match="assistant_prefix_mode"):
        make_model(server, assistant_prefix_mode="bogus")


# ------------------------------------------------------------------------------ images


def _decode_data_url(url: str) -> Image.Image:
    head, payload = url.split(",", 1)
    assert head == "data:image/png;base64"
    return Image.open(io.BytesIO(base64.b64decode(payload)))


def test_images_sent_as_png_data_urls(server, tmp_path):
    pil = Image.new("RGB", (4, 3), (10, 20, 30))
    path = tmp_path / "img.jpg"
    Image.new("RGB", (5, 2), (200, 0, 0)).save(path, quality=100)
    m = make_model(server)
    out = m.generate([Prompt("look", images=[pil, str(path)])])
    assert out == ["ans[look]"]
    content = server.requests[-1]["body"]["messages"][-1]["content"]
    assert [c["type"] for c in content] == ["image_url", "image_url", "text"]
    assert content[2] == {"type": "text", "text": "look"}
    im0 = _decode_data_url(content[0]["image_url"]["url"])
    im1 = _decode_data_url(content[1]["image_url"]["url"])
    assert im0.format == "PNG" and im0.size == (4, 3) and im0.convert("RGB").getpixel((0, 0)) == (10, 20, 30)
    assert im1.format == "PNG" and im1.size == (5, 2)
    r, g, b = im1.convert("RGB").getpixel((0, 0))
    assert r > 190 and g < 10 and b < 10  # JPEG re-encoded as PNG


def test_missing_image_and_text_only_model(server, tmp_path):
    m = make_model(server)
    with pytest.raises(DataError, match="nope.png"):
        m.generate([Prompt("x", images=[str(tmp_path / "nope.png")])])
    assert server.n_requests == 0
    t = make_model(server, supports_images=False)
    with pytest.raises(ValueError, match="text-only"):
        t.generate([Prompt("x", images=[Image.new("L", (2, 2))])])
    assert server.n_requests == 0


# ------------------------------------------------------------------------------ cache


def test_cache_hit_makes_no_request(server, tmp_path):
    cache = tmp_path / "cache"
    img = Image.new("RGB", (3, 3), (1, 2, 3))
    prompts = [Prompt("c0"), Prompt("c1", images=[img]), Prompt("c2", system="s")]
    m = make_model(server, cache_dir=cache, max_concurrency=3)
    first = m.generate(prompts, max_new_tokens=4)
    assert server.n_requests == 3
    files = sorted(cache.glob("*.json"))
    assert len(files) == 3
    rec = json.loads(files[0].read_text())
    assert len(rec["key"]) == 64 and files[0].stem == rec["key"]
    assert "base64" not in json.dumps(rec["request"])  # images stored as hashes, not data
    # same requests, fresh instance (new port-independent key), identical image content
    m2 = make_model(server, cache_dir=cache, max_concurrency=3)
    again = m2.generate([Prompt("c0"), Prompt("c1", images=[Image.new("RGB", (3, 3), (1, 2, 3))]),
                         Prompt("c2", system="s")], max_new_tokens=4)
    assert again == first
    assert server.n_requests == 3  # no new HTTP request
    assert m2.n_cache_hits == 3 and m2.n_http_requests == 0
    # anything in the request changes the key: params, seed, image pixels
    m2.generate([Prompt("c0")], max_new_tokens=5)
    make_model(server, cache_dir=cache, seed=7).generate([Prompt("c0")], max_new_tokens=4)
    m2.generate([Prompt("c1", images=[Image.new("RGB", (3, 3), (1, 2, 4))])], max_new_tokens=4)
    assert server.n_requests == 6
    assert len(list(cache.glob("*.json"))) == 6


def _cache_file(model: OpenAIChatModel, prompt: Prompt, max_new_tokens: int):
    return model.cache_dir / f"{request_cache_key('chat/completions', model._chat_body(prompt, max_new_tokens))}.json"


def test_corrupt_cache_files_are_requested_again_with_a_warning(server, tmp_path):
    """Truncated / invalid JSON, a record without a response object, another request's entry: each is reported
    by name and requested again - never a crash, never its contents returned - and the reply repairs the file."""
    cache = tmp_path / "cache"
    prompts = [Prompt(f"k{i}") for i in range(5)]
    first = make_model(server, cache_dir=cache).generate(prompts, max_new_tokens=4)
    assert server.n_requests == 5
    m = make_model(server, cache_dir=cache)
    files = [_cache_file(m, p, 4) for p in prompts]
    assert all(f.exists() for f in files)
    files[0].write_bytes(files[0].read_bytes()[:40])                      # truncated (a kill mid-copy, a full disk)
    files[1].write_bytes(b"\xff\xfe not json at all")                      # garbage, not even UTF-8
    files[2].write_text(json.dumps({"key": files[2].stem, "response": "ans[k9]"}))  # JSON, but no response object
    files[3].write_bytes(files[4].read_bytes())                           # another request's entry (copied file)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = m.generate(prompts, max_new_tokens=4)
    assert again == first == [f"ans[k{i}]" for i in range(5)]
    assert server.n_requests == 5 + 4 and m.n_cache_hits == 1
    msgs = [str(w.message) for w in caught if w.category is CorruptCacheWarning]
    assert len(msgs) == 4
    for f, why in zip(files, ["not valid JSON", "not valid JSON", "no response object", "another request"]):
        assert any(str(f) in msg and why in msg and "requesting again" in msg for msg in msgs), (f, msgs)
    for f in files:                                                       # repaired by the new replies
        assert json.loads(f.read_text())["key"] == f.stem
    third = make_model(server, cache_dir=cache)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CorruptCacheWarning)
        assert third.generate(prompts, max_new_tokens=4) == first
    assert server.n_requests == 9 and third.n_cache_hits == 5


def test_cache_that_cannot_be_used_at_all_warns_and_still_answers(server, tmp_path):
    not_a_dir = tmp_path / "cache"
    not_a_dir.write_text("a file where the cache folder should be")      # every read and write fails with OSError
    m = make_model(server, cache_dir=not_a_dir)
    with pytest.warns(CorruptCacheWarning) as rec:
        assert m.generate([Prompt("w")], max_new_tokens=4) == ["ans[w]"]
    msgs = [str(w.message) for w in rec]
    assert any("cannot read cache file" in x for x in msgs) and any("cannot write cache file" in x for x in msgs)
    assert all(str(not_a_dir) in x for x in msgs)


def test_cache_key_is_canonical():
    a = {"model": "m", "temperature": 0, "messages": [{"role": "user", "content": "x"}]}
    b = {"messages": [{"content": "x", "role": "user"}], "temperature": 0, "model": "m"}
    assert request_cache_key("chat/completions", a) == request_cache_key("chat/completions", b)
    assert request_cache_key("chat/completions", a) != request_cache_key("completions", a)
    d1 = "data:image/png;base64," + base64.b64encode(b"abc").decode()
    d2 = "data:image/png;base64," + base64.b64encode(b"abd").decode()
    k1 = request_cache_key("e", {"u": d1})
    assert k1 == request_cache_key("e", {"u": d1}) != request_cache_key("e", {"u": d2})


# ------------------------------------------------------------------------------ errors / retries


def test_retry_after_429_is_honoured(server):
    server.plan = [(429, {"Retry-After": "3"}, _err("rate limited"))]
    m = make_model(server, backoff_base=100.0, backoff_max=100.0)
    slept: list[float] = []
    m._sleep = slept.append  # record instead of waiting
    assert m.generate([Prompt("r")]) == ["ans[r]"]
    assert server.n_requests == 2
    assert slept == [3.0]  # Retry-After used instead of the (huge) exponential backoff
    assert m.n_retries == 1


def test_retry_after_is_capped(server):
    server.plan = [(429, {"Retry-After": "1000"}, _err("slow down"))]
    m = make_model(server, max_retry_after=2.5)
    slept: list[float] = []
    m._sleep = slept.append
    assert m.generate([Prompt("r")]) == ["ans[r]"]
    assert slept == [2.5]


def test_parse_retry_after():
    from email.utils import formatdate

    assert _parse_retry_after("7") == 7.0
    assert _parse_retry_after(None) is None and _parse_retry_after("soon") is None
    future = _parse_retry_after(formatdate(time.time() + 60, usegmt=True))
    assert 50 < future <= 60
    assert _parse_retry_after(formatdate(time.time() - 60, usegmt=True)) == 0.0


def test_500s_retried_with_exponential_backoff_then_success(server):
    server.plan = [(500, {}, _err("boom"))] * 3
    m = make_model(server, max_retries=3, backoff_base=0.001, backoff_max=1.0)
    slept: list[float] = []
    real_sleep = m._sleep
    m._sleep = lambda s: (slept.append(s), real_sleep(s))[1]  # tiny real sleeps (awaited by the backend)
    assert m.generate([Prompt("five")]) == ["ans[five]"]
    assert server.n_requests == 4
    assert len(slept) == 3
    for k, s in enumerate(slept):  # base * 2**k * U(0.5, 1)
        assert 0.0005 * 2**k <= s <= 0.001 * 2**k


def test_500s_exhaust_retries_clear_error(server):
    server.plan = [(500, {}, _err("internal kaboom"))] * 5
    m = make_model(server, max_retries=2)
    with pytest.raises(APIError) as ei:
        m.generate([Prompt("z")])
    e = ei.value
    assert e.status == 500
    assert e.url == server.url + "/chat/completions"
    assert e.attempts == 3 and server.n_requests == 3
    assert "internal kaboom" in e.body
    msg = str(e)
    assert "HTTP 500" in msg and server.url in msg and "internal kaboom" in msg and "3 attempt" in msg


def test_400_fails_immediately_with_server_message(server):
    server.plan = [(400, {}, _err("messages: field required"))]
    m = make_model(server, max_retries=5)
    slept: list[float] = []
    m._sleep = slept.append
    with pytest.raises(APIError) as ei:
        m.generate([Prompt("bad")])
    e = ei.value
    assert e.status == 400 and not e.retryable and e.attempts == 1
    assert server.n_requests == 1 and slept == []
    assert "HTTP 400" in str(e) and "/v1/chat/completions" in str(e) and "messages: field required" in str(e)


def test_error_in_batch_propagates(server):
    server.plan = [(401, {}, _err("invalid api key"))]
    m = make_model(server, max_concurrency=1)
    with pytest.raises(APIError, match="invalid api key"):
        m.generate([Prompt("a"), Prompt("b"), Prompt("c")])
    assert server.n_requests == 1  # sequential: stops at the first failure


def test_connection_refused_retried_then_clear_error():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens on this loopback port now
    m = OpenAIChatModel(f"http://127.0.0.1:{port}/v1", "m", max_retries=2, backoff_base=0.001,
                        backoff_max=0.002, timeout=2)
    with pytest.raises(APIError) as ei:
        m.generate([Prompt("x")])
    e = ei.value
    assert e.status is None and e.retryable and e.attempts == 3
    assert "connection error" in str(e) and f"127.0.0.1:{port}" in str(e)
    assert m.n_http_requests == 3 and m.n_retries == 2


# ------------------------------------------------------------------------------ option_logits


def test_option_logits_from_top_logprobs(server):
    m = make_model(server, max_concurrency=2)
    cands = [["A", "B", "C", "D"], ["(A)", " A", "c", "Yes"]]
    out = m.option_logits([Prompt("o1"), Prompt("o2")], cands)
    body = server.requests[0]["body"]
    assert body["logprobs"] is True and body["top_logprobs"] == 20 and body["max_tokens"] == 1
    assert body["temperature"] == 0
    lse_b = math.log(math.exp(-1.0) + math.exp(-2.0))  # " B" and "B" merged
    np.testing.assert_allclose(out[0][:3], [-0.5, lse_b, -math.inf])  # "C" != "c" (case-sensitive)
    assert out[0][3] == -math.inf
    assert out[1][0] == -math.inf and out[1][1] == -0.5  # " A" strips to "A"
    np.testing.assert_allclose(out[1][2:], [-3.0, -4.0])
    mx = make_model(server, variant_merge="max").option_logits([Prompt("o3")], [["B"]])
    assert mx[0][0] == -1.0


def test_option_logits_top_k_and_missing_logprobs(server):
    m = make_model(server, top_logprobs=1)
    out = m.option_logits([Prompt("k")], [["A", "B"]])
    assert server.requests[-1]["body"]["top_logprobs"] == 1
    assert out[0][0] == -0.5 and out[0][1] == -math.inf  # B outside the top-1
    no_lp = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "A"}}]})
    server.plan = [(200, {}, no_lp)]
    with pytest.raises(APIError, match="no logprobs"):
        m.option_logits([Prompt("k2")], [["A"]])
    with pytest.raises(ValueError, match="candidate lists"):
        m.option_logits([Prompt("k3")], [])


# ------------------------------------------------------------------------------ loglikelihood


def test_loglikelihood_not_implemented_by_default(server):
    with pytest.raises(NotImplementedError, match="prompt log-probabilities"):
        make_model(server).loglikelihood([Prompt("x")], [" y"])
    assert server.n_requests == 0


def test_loglikelihood_via_completions_echo(server):
    m = make_model(server, completions_echo=True)
    out = m.loglikelihood([Prompt("ab", system="S"), Prompt("q", assistant_prefix="A:")], [" xy", "z"])
    # fake server: one token per character, each -0.25; the generated "!" is ignored
    assert out == [LogLik(-0.75, 3), LogLik(-0.25, 1)]
    bodies = [r["body"] for r in server.requests]
    assert {b["prompt"] for b in bodies} == {"S\n\nab xy", "q\nA:z"}
    assert all(b["echo"] is True and b["logprobs"] == 1 and b["temperature"] == 0 for b in bodies)
    assert all(r["path"] == "/v1/completions" for r in server.requests)
    with pytest.raises(ValueError, match="text-only"):
        m.loglikelihood([Prompt("x", images=[Image.new("L", (1, 1))])], ["y"])


# ------------------------------------------------------------------------------ transport


def test_official_client_inside_a_running_event_loop_and_after_close(server):
    """Requests go through the official openai client (its User-Agent); the synchronous calls work where an
    event loop already runs (Jupyter, papermill) and again after close()."""
    import asyncio

    m = make_model(server, max_concurrency=2)

    async def notebook_cell():
        return m.generate([Prompt("in-loop")])

    assert asyncio.run(notebook_cell()) == ["ans[in-loop]"]
    assert "OpenAI/Python" in server.requests[-1]["headers"]["User-Agent"]
    m.close()
    assert m.generate([Prompt("again")]) == ["ans[again]"]
    m.close()


# ------------------------------------------------------------------------------ replies without text
NO_TEXT = {
    "refused": {"finish_reason": "stop",
                "message": {"role": "assistant", "content": None, "refusal": "I'm sorry, I can't help with that."}},
    "tool": {"finish_reason": "tool_calls",
             "message": {"role": "assistant", "content": None, "tool_calls": [
                 {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{\"q\": \"A\"}"}}]}},
    "filtered": {"finish_reason": "content_filter", "message": {"role": "assistant", "content": None}},
    "parts": {"finish_reason": "stop",
              "message": {"role": "assistant", "content": [{"type": "refusal", "refusal": "No."}]}},
}
REASONS = {"refused": "refusal: I'm sorry, I can't help with that.", "tool": "tool_calls: lookup",
           "filtered": "finish_reason: content_filter", "parts": "refusal: No."}


def test_null_content_is_an_unparseable_output_with_its_reason(server, tmp_path):
    server.choice_by_text.update({f"{t}\nAnswer:": c for t, c in NO_TEXT.items()})  # the prefix joins the user text
    server.choice_by_text["textparts\nAnswer:"] = {"finish_reason": "stop", "message": {
        "role": "assistant", "content": [{"type": "text", "text": "Answer: "}, {"type": "text", "text": "B"}]}}
    texts = ["refused", "tool", "ok", "filtered", "parts", "textparts"]
    prompts = [Prompt(t, assistant_prefix="Answer:") for t in texts]
    m = make_model(server, cache_dir=tmp_path / "cache")
    with pytest.warns(UserWarning, match="4 of 6 replies carried no text.*refusal: I'm sorry"):
        outs = m.generate(prompts, max_new_tokens=4)
    assert outs[2] == "ans[ok\nAnswer:]" and not isinstance(outs[2], NoOutput)
    assert outs[5] == "B" and not is_no_output(outs[5])                    # text parts joined, echoed prefix cut
    for t, out in zip(texts, outs):
        if t not in REASONS:
            continue
        assert isinstance(out, NoOutput) and is_no_output(out) and out != ""
        assert out.reason == REASONS[t] and out == NoOutput.PREFIX + REASONS[t]
    # a cache hit gives the same outputs, reasons included
    again = make_model(server, cache_dir=tmp_path / "cache")
    with pytest.warns(UserWarning, match="4 of 6"):
        assert again.generate(prompts, max_new_tokens=4) == outs
    assert again.n_http_requests == 0


def test_null_content_rows_are_stored_out_of_coverage_with_the_reason(server, tmp_path):
    """Through the runner into the store: no row dropped, the reason in raw_output, covered/correct False."""
    from mmfragile.runner import EvalItem, run_items
    from mmfragile.studies.format_bias.prompts import exact_match_score
    from mmfragile.store import ResultStore

    server.choice_by_text.update(NO_TEXT)
    server.choice_by_text["good"] = {"finish_reason": "stop", "message": {"role": "assistant", "content": "A"}}
    texts = ["refused", "tool", "good", "filtered", "parts"]
    items = [EvalItem(key={"dataset": "d", "question_id": t, "variant": "v"}, prompt=Prompt(t),
                      option_ids=["A", "B"], answer_id="A") for t in texts]
    with pytest.warns(UserWarning, match="4 of 5 replies carried no text"):
        df = run_items(make_model(server), items, ResultStore(tmp_path / "store"), exact_match_score, mode="generate",
                       progress=False)
    df = df.set_index("question_id")
    assert sorted(df.index) == sorted(texts)                              # nothing dropped
    assert df.loc["good", "raw_output"] == "A" and df.loc["good", "covered"] and df.loc["good", "correct"]
    for t in REASONS:
        row = df.loc[t]
        assert row["raw_output"] == NoOutput.PREFIX + REASONS[t] and is_no_output(row["raw_output"])
        assert not row["covered"] and not row["correct"] and row["selected_position"] == -1
