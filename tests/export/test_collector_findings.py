"""The exported families cannot mislead: each finding's status as a label of that finding (no
`finding="unavailable"` pseudo-findings), a confidence beside each active finding, no recommended
value while the data are insufficient, the SLOs each target is judged against, predicted TTFT and
TPOT with their basis. Reports from the real pipeline on simulated servers, rendered by the real
exposition and read back with prometheus_client's parser."""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from exporter.config import SLO
from exporter.export.collector import Exposition, FleetView, TargetView
from sim_feed import SimServer, Scraper


def samples(reports):
    exp = Exposition()
    exp.publish(FleetView(targets=tuple(
        TargetView(target=r.target, source="static", up=True, scrape_duration_s=0.01, last_success=0.0, errors={},
                   vllm_version=r.vllm_version, models={r.model_name: r.engine_era or "v1"}, reports=(r,))
        for r in reports)))
    out = []
    for fam in text_string_to_metric_families(exp.render().decode()):
        out.extend(fam.samples)
    return out


def of(ss, name, **labels):
    return [s for s in ss if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]


def reports():
    """A kv-pressure server after its first evaluation (instant findings only) and a healthy one with
    a filled window and a configured SLO."""
    kv = SimServer("kv-pressure", seed=1)
    a = Scraper(kv, url="http://127.0.0.1:1/kv")
    for t in (0.0, 15.0, 30.0):
        a.observe(kv.scrape(t, a.spec.url))
    first = a.evaluate(30.0)
    ok = SimServer("healthy", seed=1)
    b = Scraper(ok, url="http://127.0.0.1:1/ok", window_s=120)
    b.spec = b.spec.model_copy(update={"slo": SLO(ttft_p99=1.5, tpot_p99=0.08)})
    b.pipe.spec = b.spec
    t, last = 0.0, None
    while t <= 180:
        b.observe(ok.scrape(t, b.spec.url))
        if t and t % 30 == 0:
            last = b.evaluate(t)
        t += 15.0
    return first, last


def test_statuses_confidence_recommendations_slos_and_predictions():
    first, ok = reports()
    assert first.status == "insufficient_data" and ok.status == "ok"
    ss = samples([first, ok])
    kvt, okt = first.target, ok.target
    # a finding's status is a label of that finding; no pseudo-findings
    assert not of(ss, "vllm_drift_finding", finding="unavailable")
    assert not of(ss, "vllm_drift_finding", finding="insufficient_data")
    st = {(s.labels["finding"], s.labels["status"]) for s in of(ss, "vllm_drift_finding_status", target=kvt)}
    assert ("kv_pressure", "ok") in st and ("max_num_seqs", "insufficient_data") in st
    assert len(st) == len({f for f, _ in st})                 # one status per finding
    assert {s.labels["status"] for s in of(ss, "vllm_drift_finding_status", target=okt)} <= {"ok", "unavailable"}
    # the instant finding pages from the first evaluation, with its (low) confidence beside it
    assert of(ss, "vllm_drift_finding", target=kvt, finding="kv_pressure")[0].labels["severity"] in ("warning", "critical")
    [conf] = of(ss, "vllm_drift_finding_confidence", target=kvt, finding="kv_pressure")
    assert 0 < conf.value < 0.7
    # nothing recommended while data are insufficient; the judged target has its values
    assert not of(ss, "vllm_drift_recommended_value", target=kvt)
    assert not of(ss, "vllm_drift_misconfiguration_score", target=kvt)
    assert of(ss, "vllm_drift_recommended_value", target=okt)
    # the SLOs each target is held to: the configured ones; else what its hardware should deliver
    # at its load (never tighter than the defaults 2 s / 150 ms), or the defaults
    slo = {(s.labels["target"], s.labels["metric"]): (s.value, s.labels["source"])
           for s in of(ss, "vllm_drift_slo_seconds", quantile="0.99")}
    assert slo[(okt, "ttft")] == (1.5, "configured") and slo[(okt, "tpot")] == (0.08, "configured")
    for metric, floor in (("ttft", 2.0), ("tpot", 0.15)):
        value, source = slo[(kvt, metric)]
        assert source in ("expected", "default") and value >= floor
        assert value == first.slo_seconds[metric] and source == first.slo_source[metric]
        if source == "default":
            assert value == floor
    # predictions with their basis
    [tpot] = of(ss, "vllm_drift_predicted_tpot_seconds", target=okt)
    [ttft] = of(ss, "vllm_drift_predicted_ttft_seconds", target=okt)
    assert tpot.labels["basis"] == ttft.labels["basis"] == ok.prediction_basis in ("prior", "calibrated")
    assert 0 < tpot.value < ttft.value
    assert ok.to_json()["predicted"]["basis"] == ok.prediction_basis
    assert ok.to_json()["slo"]["source"] == {"ttft": "configured", "tpot": "configured"}
