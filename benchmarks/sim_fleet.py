"""Simulator speed: the compiled exposition renderer against prometheus_client's own text
writer on the same families (baseline, same process), and a 1,000-target fleet's CPU and
memory while serving and while being scraped once in full.

usage: .venv/bin/python benchmarks/sim_fleet.py [TARGETS]
Prints ratios and figures; it asserts nothing (speed goals are tracked here, not in tests).
"""
from __future__ import annotations

import concurrent.futures as cf
import os
import subprocess
import sys
import time
import urllib.request

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.sim.scenario import build, load_scenario


class _Fixed:
    def __init__(self, families):
        self.families = families

    def collect(self):
        return iter(self.families)


def render_ratio(n: int = 300) -> None:
    st = build(load_scenario("kv-pressure"), seed=1, version="0.11.0")
    st.tick(30.0)
    text = st.renderer.render(st.engine.metrics)
    reg = CollectorRegistry()
    reg.register(_Fixed(list(text_string_to_metric_families(text))))
    t = time.perf_counter()
    for _ in range(n):
        generate_latest(reg)
    base = (time.perf_counter() - t) / n
    t = time.perf_counter()
    for _ in range(n):
        st.renderer.render(st.engine.metrics)
    ours = (time.perf_counter() - t) / n
    print(f"render: ours {ours * 1e3:.3f} ms, prometheus_client generate_latest {base * 1e3:.3f} ms "
          f"on the same {len(text)} bytes -> ratio {ours / base:.3f}")
    t = time.perf_counter()
    st.tick(90.0)
    print(f"engine: 60 s of kv-pressure simulated in {time.perf_counter() - t:.3f} s CPU")


def _cpu(pid: int) -> float:
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mib(pid: int) -> float:
    return [int(l.split()[1]) for l in open(f"/proc/{pid}/status") if l.startswith("VmRSS")][0] / 1024


def fleet(targets: int) -> None:
    p = subprocess.Popen([sys.executable, "-m", "exporter", "simulate", "--fleet", str(targets),
                          "--port", "0", "--duration", "120"], stdout=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        t0 = time.time()
        urls = [p.stdout.readline().strip() for _ in range(targets)]
        print(f"fleet: {targets} targets listening after {time.time() - t0:.1f} s")
        c0, t1 = _cpu(p.pid), time.time()
        time.sleep(20)
        print(f"fleet: serving idle, CPU {100 * (_cpu(p.pid) - c0) / (time.time() - t1):.1f}% of one core, "
              f"RSS {_rss_mib(p.pid):.0f} MiB")
        c0, t1 = _cpu(p.pid), time.time()
        with cf.ThreadPoolExecutor(32) as ex:
            sizes = list(ex.map(lambda u: len(urllib.request.urlopen(u + "/metrics", timeout=10).read()), urls))
        print(f"fleet: all {targets} scraped in {time.time() - t1:.2f} s wall, "
              f"{1e3 * (_cpu(p.pid) - c0) / targets:.2f} ms server CPU per scrape, "
              f"mean body {sum(sizes) // len(sizes)} B")
    finally:
        p.terminate()
        p.wait(10)


if __name__ == "__main__":
    render_ratio()
    fleet(int(sys.argv[1]) if len(sys.argv) > 1 else 1000)
