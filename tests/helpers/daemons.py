"""Running the real daemon and its neighbours in tests: `vllm-drift serve` subprocesses
(`Daemon`: pipes; `Serve`: stderr to a file, latency and RSS sampling), `vllm-drift simulate`
(`Simulator`), a real Prometheus (`Prometheus`), and the small HTTP/exposition helpers they all
use (`get`, `get_any`, `samples`, `wait_for`: a condition polled until a deadline)."""
from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from conftest import free_port

PROMETHEUS = shutil.which("prometheus")


def get(url, timeout=5):
    """(status, body); raises urllib.error.HTTPError on an error status."""
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode()


def samples(text: str, name: str) -> dict[str, float]:
    """{labels-string: value} for one metric name in an exposition."""
    out = {}
    for m in re.finditer(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", text, re.M):
        out[m.group(1) or ""] = float(m.group(2))
    return out


def get_any(url: str, timeout: float = 5) -> tuple[int, str]:
    """(status, body), also for an HTTP error status."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def wait_for(pred, timeout: float = 30, step: float = 0.2):
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        try:
            got = pred()
            if got:
                return got
        except (OSError, urllib.error.URLError, KeyError, ValueError) as exc:
            last = exc
        time.sleep(step)
    raise AssertionError(f"condition not met in {timeout} s (last error: {last!r})")


def rss_mib(pid: int) -> float:
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class Serve:
    """`vllm-drift serve` in a subprocess; stderr goes to a file (a pipe could fill and block it).
    `wrap` prefixes the command (setpriv, unshare) and may end in a shell `-c` taking the command."""

    def __init__(self, config_path, env, workdir: Path, *, wrap: list[str] | None = None, shell_prefix: str = "") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(workdir) / f"daemon-{self.port}.log"
        cmd = [sys.executable, "-m", "exporter", "serve", "--config", str(config_path),
               "--listen", f"127.0.0.1:{self.port}"]
        if shell_prefix:      # e.g. "mount ... && exec " inside `unshare -m sh -c`
            import shlex
            cmd = ["sh", "-c", shell_prefix + " ".join(shlex.quote(c) for c in cmd)]
        self.err = open(self.log_path, "wb")
        self.proc = subprocess.Popen((wrap or []) + cmd, stdout=subprocess.DEVNULL, stderr=self.err, env=env)
        self.peak_rss = 0.0

    def metrics(self) -> str:
        return get_any(self.url + "/metrics")[1]

    def findings(self) -> dict:
        return {t["target"]: t for t in json.loads(get_any(self.url + "/api/v1/findings")[1])["targets"]}

    def rss(self) -> float:
        r = rss_mib(self.proc.pid)
        self.peak_rss = max(self.peak_rss, r)
        return r

    def latencies(self, seconds: float, gap: float = 0.1) -> list[float]:
        """Time `/metrics` repeatedly for `seconds` (sampling RSS too)."""
        out = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t = time.perf_counter()
            try:
                get_any(self.url + "/metrics", timeout=5)
                out.append(time.perf_counter() - t)
            except (OSError, urllib.error.URLError):
                out.append(5.0)
            self.rss()
            time.sleep(gap)
        return out

    def wait_ready(self, timeout: float = 60) -> None:
        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited {self.proc.returncode}: {self.log()[-2000:]}")
            return get_any(self.url + "/-/ready")[0] == 200
        wait_for(ready, timeout=timeout)

    def log(self) -> str:
        if not self.err.closed:
            self.err.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.err.close()
        return self.proc.returncode


class Daemon:
    def __init__(self, config_path, cli_env):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "exporter", "serve", "--config", str(config_path),
                                      "--listen", f"127.0.0.1:{self.port}"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env)

    def __enter__(self) -> "Daemon":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def metrics(self):
        return get(self.url + "/metrics")[1]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.stderr.read().decode()



class Simulator:
    """`vllm-drift simulate` in a subprocess on a free port."""

    def __init__(self, env, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "exporter", "simulate", "--port", "0", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
        line = self.proc.stdout.readline().strip()
        assert line.startswith("http://127.0.0.1:"), line
        self.url = line
        self.address = ("127.0.0.1", int(line.rsplit(":", 1)[1]))

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class Prometheus:
    """A real Prometheus on a free loopback port, scraping `targets` every second."""

    def __init__(self, tmp_path, targets: list[str], extra_jobs: str = "") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = tmp_path / "prometheus.yml"
        cfg.write_text("global: {scrape_interval: 1s, scrape_timeout: 1s}\nscrape_configs:\n"
                       "  - job_name: vllm\n    static_configs:\n      - targets: [" +
                       ", ".join(f"'{t.split('://')[1]}'" for t in targets) + "]\n"
                       "        labels: {namespace: llm, cluster: test}\n" + extra_jobs)
        self.proc = subprocess.Popen([PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                      f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def up(self) -> dict[str, float]:
        doc = json.loads(get(self.url + "/api/v1/query?query=up")[1])
        return {r["metric"]["instance"]: float(r["value"][1]) for r in doc["data"]["result"]}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def wait_cycles(metrics, n: int = 1, timeout: float = 30) -> str:
    """Wait until the daemon whose exposition `metrics()` returns completes `n` more scrape cycles
    than when called; returns the exposition then."""
    start = samples(metrics(), "vllm_drift_scrape_cycles_total").get("", 0.0)

    def done():
        text = metrics()
        return text if samples(text, "vllm_drift_scrape_cycles_total").get("", 0.0) >= start + n else None
    return wait_for(done, timeout=timeout)


def wait_evaluations(metrics, n: int = 1, timeout: float = 30) -> None:
    """Wait until the daemon finishes `n` more evaluations (its last-evaluation time moves n times;
    the poll step is well under any evaluation interval the tests use)."""
    seen = [samples(metrics(), "vllm_drift_last_evaluation_timestamp_seconds").get("")]

    def done():
        now = samples(metrics(), "vllm_drift_last_evaluation_timestamp_seconds").get("")
        if now != seen[-1]:
            seen.append(now)
        return len(seen) > n
    wait_for(done, timeout=timeout, step=0.1)
