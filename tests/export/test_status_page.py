"""The `/` status page: what it shows, that it escapes what targets send, and that a real browser
(Debian's headless Chromium) renders it against a simulated fleet behind basic auth, with every
target and every active finding readable in the rendered page."""
from __future__ import annotations

import base64
import json
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from html.parser import HTMLParser

import bcrypt
import pytest

from conftest import dead_url, free_port
from exporter.export import status_page

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--no-first-run", "--disable-component-update", "--disable-sync"]


class Page(HTMLParser):
    """The page as a reader sees it: per target section, its heading text, its state badge and its
    findings (name, severity, score text, explanation)."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: dict[str, dict] = {}
        self.table_targets: list[str] = []
        self.scripts = 0
        self.external: list[str] = []
        self._stack: list[tuple[str, dict]] = []
        self._cur: dict | None = None
        self._row: dict | None = None
        self._cell: list[str] | None = None
        self._cells: list[str] = []
        self._in_h3 = False
        self._h3: list[str] = []
        self._in_thead = False
        self._in_targets_table = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "script":
            self.scripts += 1
        for key in ("src", "href"):
            if key in a and "://" in (a[key] or "") and tag != "a":
                self.external.append(a[key])
        if tag in ("link", "img", "iframe", "object") and (a.get("href") or a.get("src")):
            self.external.append(a.get("href") or a.get("src"))
        if tag == "section" and "target" in (a.get("class") or "").split():
            self._cur = {"classes": a.get("class"), "findings": [], "h3": "", "text": []}
        elif tag == "h3" and self._cur is not None:
            self._in_h3, self._h3 = True, []
        elif tag == "tr" and self._cur is not None and "finding" in (a.get("class") or "").split():
            self._row, self._cells = {"finding": a.get("data-finding"), "class": a.get("class")}, []
        elif tag == "td" and self._row is not None:
            self._cell = []
        elif tag == "a" and self._cur is None and (a.get("href") or "").startswith("#t"):
            self._in_targets_table = True
            self._cell = []

    def handle_endtag(self, tag):
        if tag == "h3" and self._in_h3:
            self._in_h3 = False
            self._cur["h3"] = " ".join("".join(self._h3).split())
        elif tag == "td" and self._row is not None and self._cell is not None:
            self._cells.append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "tr" and self._row is not None:
            sev, name, score, change, expl = self._cells
            self._row.update(severity=sev, name=name, score=score, change=change, explanation=expl)
            self._cur["findings"].append(self._row)
            self._row = None
        elif tag == "a" and self._in_targets_table:
            self.table_targets.append("".join(self._cell))
            self._in_targets_table, self._cell = False, None
        elif tag == "section" and self._cur is not None:
            url = self._cur["h3"].split()[0]
            self._cur["text"] = " ".join("".join(self._cur["text"]).split())
            self.sections[url] = self._cur
            self._cur = None

    def handle_data(self, data):
        if self._in_h3:
            self._h3.append(data)
        if self._cell is not None:
            self._cell.append(data)
        if self._cur is not None:
            self._cur["text"].append(data)


def read_page(text: str) -> Page:
    p = Page()
    p.feed(text)
    p.close()
    return p


def _report(target, model, findings, status="ok"):
    return {"target": target, "model_name": model, "engine_era": "v1", "status": status, "findings": findings}


def test_page_lists_every_target_worst_first_and_escapes_what_targets_send():
    hostile = 'http://10.0.0.9:8000/"><script>alert(1)</script>'
    findings = {"generated_at": 1000.0, "targets": [
        _report("http://a:8000", "m-ok", []),
        _report("http://b:8000", "m<b>", [
            {"finding": "kv_pressure", "severity": "critical", "score": 0.9, "parameter": None,
             "configured": None, "recommended": None, "explanation": "KV <full> & preempting"},
            {"finding": "max_num_seqs", "severity": "warning", "score": 0.4, "parameter": "max_num_seqs",
             "configured": 256.0, "recommended": 64, "explanation": "cap it"}]),
        {"target": hostile, "model_name": None, "status": "down", "error": "boom", "findings": []},
    ]}
    targets = {"targets": [
        {"target": "http://a:8000", "up": True, "last_success": 990.0, "scrape_duration_seconds": 0.01,
         "vllm_version": "0.11.0", "models": {"m-ok": "v1"}, "source": "static"},
        {"target": "http://b:8000", "up": True, "last_success": 995.0, "scrape_duration_seconds": 0.02,
         "vllm_version": "0.10.1", "models": {"m<b>": "v0"}, "source": "file_sd"},
        {"target": hostile, "up": False, "last_success": None, "last_error": "connect <refused>",
         "last_error_reason": "connect", "models": {}, "source": "file_sd"},
        {"target": "http://c:8000", "up": None, "models": {}, "source": "kubernetes"},
    ]}
    html = status_page.render(json.dumps(findings).encode(), json.dumps(targets).encode(),
                              version="9.9.9", revision="0123456789abcdef0123", now=1000.0).decode()
    assert "<script>" not in html and "&lt;script&gt;" in html and "KV &lt;full&gt; &amp; preempting" in html
    page = read_page(html)
    assert page.scripts == 0 and page.external == []
    # worst first: the down target, then the critical one, then the rest by URL
    assert page.table_targets == [hostile, "http://b:8000", "http://a:8000", "http://c:8000"]
    assert set(page.sections) == {hostile.split()[0], "http://b:8000", "http://a:8000", "http://c:8000"}
    down = page.sections[hostile]
    assert "down" in down["h3"] and "connect <refused>" in down["text"]
    b = page.sections["http://b:8000"]
    assert [(f["name"], f["severity"], f["score"]) for f in b["findings"]] == [
        ("kv_pressure", "critical", "0.90"), ("max_num_seqs", "warning", "0.40")]
    assert b["findings"][1]["change"] == "max_num_seqs 256 → 64"
    assert "sev-critical" in b["classes"] and "m<b>" in b["text"]
    assert "No active findings" in page.sections["http://a:8000"]["text"]
    assert "Not evaluated yet" in page.sections["http://c:8000"]["text"]
    assert "revision 0123456789ab" in html and 'href="metrics"' in html and 'href="api/v1/findings"' in html


def _get(url, auth=None):
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def _stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _consecutive_ports(n):
    """A first port with the next n-1 free too (simulate --fleet binds consecutive ports)."""
    import socket

    for _ in range(50):
        first = free_port()
        socks = []
        try:
            for i in range(n):
                s = socket.socket()
                s.bind(("127.0.0.1", first + i))
                socks.append(s)
            return first
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no run of free ports")


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (scripts/test installs it)")
def test_chromium_renders_every_simulated_target_and_its_findings(tmp_path, cli_env):
    n = 4
    first = _consecutive_ports(n)
    sim = subprocess.Popen([sys.executable, "-m", "exporter", "simulate", "--fleet", str(n), "--port", str(first),
                            "--speed", "20", "--duration", "150"], env=cli_env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    dead = dead_url()                                # nothing listens there: a down target
    password = "status-page-pw"
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
    urls = [f"http://127.0.0.1:{first + i}" for i in range(n)]
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("scrape: {interval: 2s, timeout: 2s}\nevaluation: {interval: 2s, window: 12s}\n"
                   "targets:\n" + "".join(f"  - url: {u}\n" for u in urls + [dead])
                   + f"web:\n  basic_auth_users:\n    admin: '{hashed}'\n")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    serve = subprocess.Popen([sys.executable, "-m", "exporter", "serve", "--config", str(cfg),
                              "--listen", f"127.0.0.1:{port}", "--duration", "150"], env=cli_env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    auth = ("admin", password)
    try:
        def evaluated():
            st, body, _ = _get(base + "/api/v1/findings", auth)
            doc = json.loads(body) if st == 200 else {"targets": []}
            judged = {r["target"] for r in doc["targets"]
                      if r.get("model_name") and r["status"] != "insufficient_data"}
            return doc if judged >= set(urls) and any(r["findings"] for r in doc["targets"]) else None

        deadline, before = time.monotonic() + 90, None
        while before is None and time.monotonic() < deadline and serve.poll() is None:
            try:
                before = evaluated()
            except OSError:
                pass
            time.sleep(0.5)
        assert before is not None, "the daemon never judged every simulated target"

        status, body, headers = _get(base + "/")
        assert status == 401 and "Basic" in headers.get("WWW-Authenticate", "")   # same auth as /metrics
        status, body, headers = _get(base + "/", auth)
        assert status == 200 and headers["Content-Type"].startswith("text/html")
        assert "script-src" not in headers["Content-Security-Policy"] and "default-src 'none'" in headers["Content-Security-Policy"]

        shot = tmp_path / "status.png"
        udd = tmp_path / "chromium-profile"
        authed = f"http://admin:{password}@127.0.0.1:{port}/"
        dom = subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={udd}", "--dump-dom", authed],
                             capture_output=True, text=True, timeout=90)
        after = json.loads(_get(base + "/api/v1/findings", auth)[1])
        subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={udd}", "--window-size=1280,1600",
                        f"--screenshot={shot}", authed], capture_output=True, timeout=90)
    finally:
        _stop(serve)
        _stop(sim)
    assert dom.returncode == 0, dom.stderr[-500:]
    page = read_page(dom.stdout)
    assert page.scripts == 0 and page.external == []
    assert set(page.table_targets) == set(urls) | {dead}
    assert "down" in page.sections[dead]["h3"] and "connect" in page.sections[dead]["text"]
    states = ["down" if "down" in page.sections[u]["h3"].split() else "other" for u in page.table_targets]
    assert states == sorted(states), states                 # down targets come first

    def api_findings(doc, url):
        return {(f["finding"], f["severity"]) for r in doc["targets"] if r["target"] == url for f in r["findings"]}

    shown_any = 0
    for url in urls:
        sec = page.sections[url]
        assert "up" in sec["h3"].split()
        shown = {(f["name"], f["severity"]) for f in sec["findings"]}
        # the page was rendered between the two API reads: it shows what one of them showed
        b, a = api_findings(before, url), api_findings(after, url)
        assert b & a <= shown <= b | a, (url, shown, b, a)
        for f in sec["findings"]:
            assert f["explanation"] and 0.0 <= float(f["score"]) <= 1.0
        shown_any += len(shown)
    assert shown_any > 0
    # the simulated fleet includes misconfigured servers: some finding recommends a value
    assert any("→" in f["change"] for u in urls for f in page.sections[u]["findings"])
    assert shot.exists() and shot.stat().st_size > 10_000


def test_cached_page_follows_the_published_documents():
    empty = b'{"targets": []}'
    cache = status_page.Cached(version="1", revision="r")
    first = cache.page(empty, empty)
    assert cache.page(empty, empty) is first                     # same documents: not rendered again
    one = json.dumps({"targets": [{"target": "http://x:8000", "up": True}]}).encode()
    assert b"http://x:8000" in cache.page(empty, one)            # a new publish shows at once
