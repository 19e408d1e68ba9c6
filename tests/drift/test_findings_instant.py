"""A fast first answer, confirmed later: what one or two scrapes prove is reported from the first
evaluation with a confidence that grows as the window fills; rate-based findings say how long they
need; nothing loud on a healthy server meanwhile. Simulated servers in sim time, scraped with the
daemon's default intervals (15 s scrapes, 30 s evaluations, 10 min window)."""
from __future__ import annotations

import pytest

from sim_feed import SimServer, Scraper, loud

SCRAPE, EVAL = 15.0, 30.0


def run(server: SimServer, scraper: Scraper, until: float, *, start: float = 0.0):
    """Scrape every 15 s from `start` and evaluate every 30 s up to `until`; the reports."""
    out = []
    t = start
    while t <= until + 1e-9:
        scraper.observe(server.scrape(t, scraper.spec.url))
        if t > start and (t - start) % EVAL < 1e-9:
            out.append((t, scraper.evaluate(t)))
        t += SCRAPE
    return out


def test_kv_pressure_at_the_first_evaluation_with_growing_confidence():
    server = SimServer("kv-pressure", seed=5)
    reports = run(server, Scraper(server), 330)
    t0, first = reports[0]
    assert t0 == 30 and first.status == "insufficient_data"
    kv = {f.finding: f for f in first.findings}["kv_pressure"]
    assert kv.severity in ("warning", "critical")
    assert 0 < kv.confidence < 0.7
    # rate-based findings are not guessed: they say how much more data they need
    st = first.finding_status["max_num_seqs"]
    assert st["status"] == "insufficient_data" and "more minutes of data" in st["reason"]
    assert first.finding_status["kv_pressure"]["status"] == "ok"
    # nothing recommended while the data are insufficient (absent, not the configured value)
    assert first.recommended == {} and first.misconfiguration == {}
    confidences = [{f.finding: f for f in r.findings}["kv_pressure"].confidence for _, r in reports]
    assert confidences == sorted(confidences) and confidences[-1] > 0.5
    assert all("kv_pressure" in loud(r) for _, r in reports)          # never flaps while it holds
    assert reports[-1][1].status == "ok"


def test_healthy_is_quiet_from_the_first_evaluation():
    server = SimServer("healthy", seed=5)
    reports = run(server, Scraper(server), 120)
    assert reports and all(not loud(r) for _, r in reports)
    assert all(r.findings == () or {f.severity for f in r.findings} == {"info"} for _, r in reports)


def test_one_snapshot_gives_the_instant_verdicts_only():
    """`scan -` with one snapshot: the instant findings at once (no history to confirm against),
    every other finding `insufficient_data` with the reason."""
    for scenario, want in (("kv-pressure", {"kv_pressure"}), ("healthy", set())):
        server = SimServer(scenario, seed=3)
        scraper = Scraper(server, one_shot=True)
        scraper.observe(server.scrape(120, scraper.spec.url))
        r = scraper.evaluate(120)
        assert r.status == "insufficient_data"
        assert loud(r) == want, scenario
        assert {k for k, v in r.finding_status.items() if v["status"] == "ok"} >= {"kv_pressure"}
        assert "one snapshot has no rates" in r.finding_status["max_num_seqs"]["reason"]


def test_a_counter_reset_does_not_hide_what_a_snapshot_proves():
    server = SimServer("kv-pressure", seed=2)
    scraper = Scraper(server)
    run(server, scraper, 120)
    # the server restarts at 135 s: counters from zero, the window starts afresh
    restarted = SimServer("kv-pressure", seed=9, started=135.0)
    reports = [r for _, r in run(restarted, scraper, 195, start=135.0)]
    assert scraper.pipe.window.resets == 1
    assert reports and all(r.status == "insufficient_data" for r in reports)
    assert all("kv_pressure" in loud(r) for r in reports)


def test_max_model_len_against_the_servers_lifetime_before_the_window_fills():
    """An oversized context is judged from the request shapes the server has seen since it started
    (its cumulative histograms, >= 50 requests) while the window is still filling."""
    server = SimServer("oversized-max-model-len", seed=3)
    reports = run(server, Scraper(server), 60)
    assert all(r.status == "insufficient_data" for _, r in reports)
    assert "max_model_len" in loud(reports[-1][1])
    [f] = [f for f in reports[-1][1].findings if f.finding == "max_model_len"]
    assert f.binding == "observed_length_p99" and f.recommended < f.configured
    assert reports[-1][1].derived["context_length_share"] == 0.0


def test_a_scan_pair_is_as_confident_as_the_share_of_a_daemon_window_it_covers():
    """`scan A --after B` runs on a window as long as the pair; its confidence is measured against
    the window the daemon judges on (10 minutes), so a 2-minute pair is 0.2 for rate findings."""
    server = SimServer("kv-pressure", seed=3)
    scraper = Scraper(server, one_shot=True)                    # the config's window: 10 minutes
    scraper.pipe = scraper.fleet.pipeline(scraper.spec, server.model_name, window_s=3600)   # as scan does
    for t in (120.0, 240.0):
        scraper.observe(server.scrape(t, scraper.spec.url))
    r = scraper.evaluate(240.0)
    assert r.status == "ok"
    conf = {f.finding: f.confidence for f in r.findings}
    assert conf["max_num_seqs"] == pytest.approx(0.2)
    assert conf["max_num_seqs"] < conf["kv_pressure"] < 1      # gauge-proven: higher from two scrapes
