"""The scraper against real misbehaving HTTP servers on 127.0.0.1."""
import asyncio
import json
import socket
import time

import pytest

import loopback
from exporter.scrape import Scraper, ScrapeError

BODY = b'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} 3.0\n'


def fetch(url, **kw):
    async def go():
        s = Scraper(**kw)
        try:
            return await s.fetch(url)
        finally:
            await s.aclose()
    return asyncio.run(go())


def reason_of(url, **kw):
    with pytest.raises(ScrapeError) as err:
        fetch(url, **kw)
    return err.value.reason, str(err.value)


def test_plain_and_gzip_bodies():
    with loopback.Site(loopback.static({"/metrics": BODY})) as site:
        got = fetch(site.url + "/metrics")
        assert got.body == BODY and got.status == 200 and got.duration_s > 0
    with loopback.Site(loopback.gzipped(BODY)) as site:
        assert fetch(site.url + "/metrics").body == BODY


def test_error_reasons():
    with loopback.Site(loopback.status("500 Internal Server Error")) as site:
        reason, msg = reason_of(site.url + "/metrics")
        assert reason == "http_status" and "HTTP 500" in msg and site.url in msg
    with loopback.Site(loopback.hang()) as site:
        t = time.monotonic()
        assert reason_of(site.url + "/metrics", timeout=0.5)[0] == "timeout"
        assert time.monotonic() - t < 3
    with loopback.Site(loopback.trickle(BODY * 20, 0.05)) as site:   # slow-loris body: total deadline holds
        t = time.monotonic()
        assert reason_of(site.url + "/metrics", timeout=0.5)[0] == "timeout"
        assert time.monotonic() - t < 3
    with loopback.Site(loopback.reset_mid_body(BODY)) as site:
        assert reason_of(site.url + "/metrics")[0] == "read"
    with loopback.Site(loopback.huge(100 * 2**20)) as site:
        reason, msg = reason_of(site.url + "/metrics", max_body_bytes=2**20)
        assert reason == "body_too_large" and "1048576" in msg
    with loopback.Site(loopback.gzip_bomb(64 * 2**20)) as site:
        reason, _ = reason_of(site.url + "/metrics", max_body_bytes=2**20)
        assert reason == "body_too_large"


def test_connection_refused():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()   # nothing listens there now
    assert reason_of(f"http://127.0.0.1:{port}/metrics")[0] == "connect"


def test_keepalive_reuses_one_connection():
    with loopback.Site(loopback.static({"/metrics": BODY})) as site:
        conns = []
        orig = site._serve

        async def counting(reader, writer):
            conns.append(1)
            await orig(reader, writer)
        site.server.close()

        async def restart():
            site.server = await asyncio.start_server(counting, "127.0.0.1", site.port)
        asyncio.run_coroutine_threadsafe(restart(), site.loop).result(5)

        async def go():
            s = Scraper()
            try:
                for _ in range(5):
                    await s.fetch(site.url + "/metrics")
            finally:
                await s.aclose()
        asyncio.run(go())
        assert len(site.requests) == 5 and len(conns) == 1


def test_metadata_reads_version_and_models_and_tolerates_absence():
    models = {"object": "list", "data": [
        {"id": "qwen", "object": "model", "root": "Qwen/Qwen3-4B", "max_model_len": 8192},
        {"id": "my-lora", "object": "model", "root": "/adapters/x", "parent": "qwen"}]}
    routes = {"/version": json.dumps({"version": "0.11.0"}).encode(), "/v1/models": json.dumps(models).encode()}

    async def go(url):
        s = Scraper()
        try:
            return await s.metadata(url)
        finally:
            await s.aclose()
    with loopback.Site(loopback.static(routes)) as site:
        md = asyncio.run(go(site.url))
    assert md.vllm_version == "0.11.0" and md.served_models == ("qwen",)
    assert md.max_model_len == {"qwen": 8192} and md.root == {"qwen": "Qwen/Qwen3-4B"}
    with loopback.Site(loopback.status("404 Not Found", b"no")) as site:
        md = asyncio.run(go(site.url))
    assert md.vllm_version is None and md.served_models == ()


def test_a_scrape_and_its_metadata_share_one_connection():
    """/metrics, /version and /v1/models of a target over one kept-alive socket: a fleet of
    N targets holds N sockets, not 2N (the open-file limit at 10,000 targets)."""
    routes = {"/metrics": BODY, "/version": b'{"version": "0.11.0"}', "/v1/models": b'{"data": []}'}

    async def go(url):
        s = Scraper()
        try:
            for _ in range(3):
                await s.fetch(url + "/metrics")
                await s.metadata(url)
        finally:
            await s.aclose()
    with loopback.Site(loopback.static(routes)) as site:
        asyncio.run(go(site.url))
        assert len(site.requests) == 9 and site.connections == 1
