"""The simulator's OpenAI endpoints over real HTTP on 127.0.0.1: streamed and plain completions
run through the simulated engine (exact `usage`, `max_tokens`/`ignore_eos` honoured, tokens paced
by the engine's step times), /metrics moves with the load, bad requests get vLLM's errors, and a
client that goes away aborts its request. Plus the engine hook itself, without HTTP."""
from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import pytest

from exporter.sim.engine import Engine, EngineConfig, Phase, Traffic
from sim_running import quiet_scenario, start


@pytest.fixture()
def quiet(tmp_path):
    srv, st = start(quiet_scenario(tmp_path, max_num_seqs=8))
    with srv:
        yield srv.urls[0], st


def _stream(url: str, body: dict) -> tuple[list[dict], list[float], float]:
    chunks, times = [], []
    t0 = time.monotonic()
    with httpx.stream("POST", url, json=body, timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
                times.append(time.monotonic() - t0)
    return chunks, times, time.monotonic() - t0


def test_engine_submit_reports_every_token_and_cancel_frees_blocks():
    cfg = EngineConfig(num_gpu_blocks=200, max_num_seqs=4)
    eng = Engine(cfg, [Phase(0.0, Traffic(rate=0.0))], lambda ds, dc, pt, pc, chunks: 0.01 + 0.001 * ds + 1e-5 * pt)
    events = []
    req = eng.submit(50, 12, lambda t, n, r: events.append((t, n, r)))
    eng.advance_to(5.0)
    assert sum(n for _, n, _ in events) == 12
    assert events[-1][2] == "length" and events[-1][1] == 0
    times = [t for t, n, _ in events if n]
    assert times == sorted(times) and len(times) == 12
    # decode steps of a lone request take the step function's 0.011 s
    assert all(abs((b - a) - 0.011) < 1e-9 for a, b in zip(times[1:], times[2:]))
    assert eng.metrics.finished["length"] == 1 and eng.pool.used == 0
    assert eng.submit(4000, 10, lambda *a: None) is None          # larger than the KV pool: refused
    other = eng.submit(64, 1000, lambda *a: None)
    eng.advance_to(5.2)
    assert eng.pool.used > 0
    eng.cancel(other)
    assert eng.pool.used == 0 and not eng.running and eng.metrics.finished["abort"] == 1
    assert req is not None


def test_streamed_completion_is_exact_and_paced_by_the_engine(quiet):
    url, st = quiet
    gen0 = st.current.metrics.counters["generation_tokens"]
    body = {"prompt": list(range(1000, 1200)), "max_tokens": 20, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    chunks, times, total = _stream(url + "/v1/completions", body)
    text_chunks = [c for c in chunks if c["choices"] and c["choices"][0]["text"]]
    assert len(text_chunks) == 20
    assert text_chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"] == {"prompt_tokens": 200, "completion_tokens": 20, "total_tokens": 220,
                                   "prompt_tokens_details": None}
    # the engine's own step time for one 8B decode on an L4 (the calculator's model)
    step = st.resolved.step_time(1, 210, 0, 0)
    tpot = (times[len(text_chunks) - 1] - times[0]) / 19
    assert 0.8 * step < tpot < 1.6 * step, (tpot, step)
    assert st.current.metrics.counters["generation_tokens"] - gen0 == 20


def test_chat_and_plain_completion_and_natural_stop(quiet):
    url, st = quiet
    r = httpx.post(url + "/v1/chat/completions", timeout=30, json={
        "model": st.model_name, "max_tokens": 5, "ignore_eos": True,
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "one two three"}]})
    assert r.status_code == 200
    doc = r.json()
    assert doc["object"] == "chat.completion"
    assert doc["usage"]["prompt_tokens"] == 2 + 3 + 2 * 4 and doc["usage"]["completion_tokens"] == 5
    assert len(doc["choices"][0]["message"]["content"].split()) == 5
    # without ignore_eos the scenario's output distribution (mean 100) stops it before 3000 tokens
    r = httpx.post(url + "/v1/completions", timeout=60, json={"prompt": "hi there", "max_tokens": 3000})
    u = r.json()["usage"]
    assert r.json()["choices"][0]["finish_reason"] == "stop" and 1 <= u["completion_tokens"] < 3000


def test_streamed_chat_first_chunk_carries_the_role(quiet):
    url, _ = quiet
    chunks, _, _ = _stream(url + "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "a b c"}], "max_tokens": 3, "ignore_eos": True, "stream": True})
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks).split() != []
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_metrics_move_with_the_load(quiet):
    url, st = quiet

    async def load():
        async with httpx.AsyncClient(timeout=60) as c:
            body = {"prompt": list(range(300)), "max_tokens": 60, "ignore_eos": True}
            tasks = [asyncio.create_task(c.post(url + "/v1/completions", json=body)) for _ in range(6)]
            await asyncio.sleep(1.0)
            text = (await c.get(url + "/metrics")).text
            return text, await asyncio.gather(*tasks)
    text, results = asyncio.run(load())
    assert all(r.status_code == 200 for r in results)
    running = [ln for ln in text.splitlines() if ln.startswith("vllm:num_requests_running{")]
    assert running and float(running[0].rsplit(" ", 1)[1]) == 6
    assert st.current.metrics.finished["length"] == 6


def test_bad_requests_get_vllm_errors(quiet):
    url, st = quiet
    r = httpx.post(url + "/v1/completions", json={"prompt": "x", "model": "nope"}, timeout=10)
    assert r.status_code == 404 and "does not exist" in r.json()["message"]
    r = httpx.post(url + "/v1/completions", json={"prompt": list(range(5000)), "max_tokens": 10}, timeout=10)
    assert r.status_code == 400 and "maximum context length is 4096" in r.json()["message"]
    r = httpx.post(url + "/v1/completions", content=b"{not json", timeout=10)
    assert r.status_code == 400
    r = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 0}, timeout=10)
    assert r.status_code == 400
    r = httpx.post(url + "/v1/chat/completions", json={"messages": []}, timeout=10)
    assert r.status_code == 400
    assert httpx.get(url + "/v1/models", timeout=10).status_code == 200   # still serving


def test_client_going_away_aborts_its_request(quiet):
    url, st = quiet
    host, port = url.rsplit("/", 1)[1].split(":")
    body = json.dumps({"prompt": list(range(100)), "max_tokens": 2000, "ignore_eos": True,
                       "stream": True}).encode()
    s = socket.create_connection((host, int(port)), 5)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
              b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    assert s.recv(4096).startswith(b"HTTP/1.1 200")
    time.sleep(0.5)
    assert len(st.current.running) == 1
    s.close()
    deadline = time.time() + 10
    while st.current.running and time.time() < deadline:
        time.sleep(0.1)
    assert not st.current.running and st.current.metrics.finished["abort"] == 1
