"""The daemon's cached `/metrics` (per-target report blocks, gzip once per body) and the
filtered, paginated `/api/v1/findings`, on reports evaluated from real captures, over real HTTP."""
from __future__ import annotations

import dataclasses
import gzip
import json
import time
import urllib.error
import urllib.request

import pytest

from exporter.config import Config, TargetSpec, WebConfig
from exporter.export.cache import CachedExposition, gzip_parts
from exporter.export.collector import FleetCollector, FleetView, TargetView
from exporter.export.findings import Entry, FindingsIndex, ReportCache, parse_query
from exporter.export.render import Renderer
from exporter.export.server import HTTPServer, Published
from exporter.parse import parse_vllm
from exporter.pipeline import Pipelines


def evaluated_fleet(captures, copies: int = 1):
    """TargetViews of every capture (x copies), each evaluated over two scrapes, and their pipes."""
    fleet = Pipelines(Config())
    views, pipes = [], {}
    for c in range(copies):
        for i, (name, body) in enumerate(sorted(captures.items())):
            url = f"http://10.{c}.0.{i}:8000"
            snaps = parse_vllm(body, target=url, timestamp=1000.0)
            reports = []
            for snap in snaps:
                pipe = pipes[(url, snap.model_name)] = fleet.pipeline(TargetSpec(url=url, gpu="H100"), snap.model_name,
                                                                      window_s=600.0)
                pipe.observe(snap)
                pipe.observe(dataclasses.replace(snap, timestamp=1060.0))
                reports.append(pipe.evaluate(None, 1060.0))
            views.append(TargetView(url, "static", True, 0.01, 1060.0, {"timeout": 2.0}, "0.10.1",
                                    {s.model_name: s.engine_era for s in snaps}, tuple(reports)))
    views.append(TargetView("http://down:1", "file_sd", False, None, None, {"connect": 3.0}, None, {}, ()))
    return views, pipes


def full_render(view: FleetView) -> bytes:
    c = FleetCollector()
    c.view = view
    return Renderer().render(c.collect())


def fleet_body(expo: CachedExposition) -> bytes:
    """The fleet part of the body as a client reads it (the parts joined)."""
    return b"".join(expo.body)


def fleet_view(targets) -> FleetView:
    return FleetView(tuple(targets), 1060.0, 0.2, 0.0, 1.0, 900.0, {}, 0.5, 7.0, {}, True)


def test_cached_body_is_the_full_render_and_only_changed_targets_rerender(captures):
    views, pipes = evaluated_fleet(captures)
    expo = CachedExposition()
    view = fleet_view(views)
    expo.publish(view)
    first = fleet_body(expo)
    assert first == full_render(view)
    assert first.count(b"vllm_drift_evaluation_status{") == sum(len(v.reports) for v in views) > 0
    reports_rendered = expo.rendered_targets
    assert reports_rendered == sum(1 for v in views if v.reports)
    # a report family's samples are one part for the whole fleet, not one per target: a
    # request writes a few large buffers (docs/scaling.md)
    families = first.count(b"# TYPE ")
    assert len(expo.body) <= 2 * families

    # next cycle: every target's scrape state moves, nothing is re-evaluated: the report
    # families' texts are the very objects of the body before (neither rendered nor copied)
    moved = [dataclasses.replace(v, scrape_duration_s=0.03) for v in views]
    before = {id(p) for p in expo.body}
    expo.publish(fleet_view(moved))
    assert fleet_body(expo) == full_render(fleet_view(moved))
    report_parts = [p for p in expo.body if b"vllm_drift_evaluation_status{" in p or b"vllm_drift_finding_score{" in p]
    assert report_parts and all(id(p) in before for p in report_parts)
    assert expo.rendered_targets == reports_rendered
    # an evaluation's publish with no scrape since: the scrape-state lines are kept as they were
    up = next(p for p in expo.body if p.startswith(b"vllm_drift_target_up{"))
    expo.publish(fleet_view(moved))
    assert next(p for p in expo.body if p.startswith(b"vllm_drift_target_up{")) is up

    # one target is re-evaluated: only its reports are rendered again
    (url, model), pipe = next(iter(pipes.items()))
    pipe.observe(dataclasses.replace(pipe.latest, timestamp=1075.0))
    changed = []
    for v in views:
        v = dataclasses.replace(v, scrape_duration_s=0.02, last_success=1075.0)
        if v.target == url:
            v = dataclasses.replace(v, up=False, reports=(pipe.evaluate(None, 1075.0),) + v.reports[1:])
        changed.append(v)
    view2 = fleet_view(changed)
    expo.publish(view2)
    assert fleet_body(expo) == full_render(view2) and fleet_body(expo) != first
    assert expo.rendered_targets == reports_rendered + 1
    # a target that leaves takes its lines with it
    view3 = fleet_view(changed[1:])
    expo.publish(view3)
    assert fleet_body(expo) == full_render(view3)
    assert f'target="{changed[0].target}"'.encode() not in fleet_body(expo)


def test_body_stays_the_full_render_through_churn_and_spread_evaluations(captures):
    """Targets evaluated between publishes (`prerender`, as the daemon's spread evaluation does),
    arriving, leaving and coming back in any order: every body is byte for byte the full render
    of its view (the unchanged targets' lines are sliced from the body before)."""
    import random
    views, pipes = evaluated_fleet(captures, copies=3)
    rng = random.Random(5)
    expo = CachedExposition()
    current = {v.target: v for v in views}
    now = 1060.0
    for step in range(40):
        now += 15.0
        for target in rng.sample(sorted(current), k=rng.randint(0, len(current))):
            v = current[target]
            reports = tuple(pipes[(target, r.model_name)].evaluate(None, now) for r in v.reports)
            current[target] = dataclasses.replace(v, reports=reports, last_success=now)
            if rng.random() < 0.5:
                expo.prerender(current[target])
        shown = [v for v in views if rng.random() < 0.85]
        shown = [current[v.target] for v in shown]
        view = fleet_view(shown)
        expo.publish(view)
        assert fleet_body(expo) == full_render(view), f"step {step}"


def test_a_publish_of_the_same_targets_splices_only_the_families_that_changed(captures):
    """The same targets in the same order (most publishes): each report family's text is the one
    before with the changed targets' lines put in; a family nobody's lines changed in is kept as
    the same object. Scores moving, reports vanishing and coming back, targets evaluated twice
    between publishes: every body is byte for byte the full render."""
    import random
    views, _ = evaluated_fleet(captures, copies=2)
    rng = random.Random(11)
    expo = CachedExposition()
    original = {v.target: v for v in views}
    current = dict(original)
    order = [v.target for v in views]
    expo.publish(fleet_view(views))
    for step in range(30):
        for target in rng.sample(order, k=rng.randint(1, 4)):
            v, choice = current[target], rng.random()
            if choice < 0.2:
                v = dataclasses.replace(v, reports=())                 # its lines go
            elif choice < 0.4:
                v = original[target]                                   # and come back
            elif v.reports and v.reports[0].kv_pressure_score is not None:
                r = dataclasses.replace(v.reports[0], kv_pressure_score=rng.choice([0.0, -0.0, 0.25, rng.random()]))
                v = dataclasses.replace(v, reports=(r,) + v.reports[1:])
            else:
                v = dataclasses.replace(v, reports=tuple(dataclasses.replace(r) for r in v.reports))
            if rng.random() < 0.3:                                      # its scrape state moves too
                v = dataclasses.replace(v, up=rng.choice([True, False, None]), scrape_duration_s=rng.random(),
                                        errors={"timeout": float(step)} if rng.random() < 0.5 else {},
                                        models=dict(v.models) if rng.random() < 0.7 else {})
            current[target] = v
            if rng.random() < 0.5:
                expo.prerender(v)                                       # maybe twice before a publish
        view = fleet_view([current[t] for t in order])
        expo.publish(view)
        assert fleet_body(expo) == full_render(view), f"step {step}"

    # one target's KV pressure score moves: that family's text alone is new
    target = next(t for t in order if current[t].reports and current[t].reports[0].kv_pressure_score is not None)
    texts = {id(p): p for p in expo.body if not p.startswith(b"# ")}
    r = dataclasses.replace(current[target].reports[0], kv_pressure_score=0.5)
    current[target] = dataclasses.replace(current[target], reports=(r,) + current[target].reports[1:])
    view = fleet_view([current[t] for t in order])
    expo.publish(view)
    assert fleet_body(expo) == full_render(view)
    new = [p for p in expo.body if not p.startswith(b"# ") and id(p) not in texts]
    assert len(new) == 1 and new[0].startswith(b"vllm_drift_kv_pressure_score{")


def test_a_re_evaluation_writes_only_the_report_families_whose_samples_changed(captures):
    """A new evaluation whose samples are those of the one before (a steady server) writes no
    line anew; one whose KV pressure score moved writes that one family; a score that flips to
    -0.0 is written as such. Every body is the full render."""
    views, _ = evaluated_fleet(captures)
    view = next(v for v in views if v.reports and v.reports[0].kv_pressure_score is not None)
    others = [v for v in views if v is not view]
    expo = CachedExposition()
    expo.publish(fleet_view(views))
    written = expo.rendered_families

    def publish(reports):
        v = dataclasses.replace(view, reports=reports)
        expo.prerender(v)                               # as the daemon does after an evaluation
        shown = fleet_view(sorted(others + [v], key=lambda t: t.target))
        expo.publish(shown)
        assert fleet_body(expo) == full_render(shown)

    same = tuple(dataclasses.replace(r) for r in view.reports)      # new objects, same samples
    texts = {id(p) for p in expo.body}
    publish(same)
    assert expo.rendered_families == written
    # and the publish keeps every family's text as it was (the same objects: nothing joined
    # again) while the next evaluation moved nothing
    report_texts = [p for p in expo.body if not p.startswith(b"# ")]     # the rest: headers + scrape state
    assert report_texts and all(id(p) in texts for p in report_texts)
    moved = (dataclasses.replace(same[0], kv_pressure_score=same[0].kv_pressure_score + 0.125),) + same[1:]
    publish(moved)
    assert expo.rendered_families == written + 1
    publish((dataclasses.replace(same[0], kv_pressure_score=0.0),) + same[1:])
    publish((dataclasses.replace(same[0], kv_pressure_score=-0.0),) + same[1:])    # hashes as 0.0 does
    assert b"vllm_drift_kv_pressure_score{" in fleet_body(expo) and b"} -0.0\n" in fleet_body(expo)
    assert expo.rendered_families == written + 3


def test_large_body_is_gzipped_once_in_the_background(captures):
    views, _ = evaluated_fleet(captures, copies=12)
    expo = CachedExposition(compress_min_bytes=1024)
    expo.publish(fleet_view(views))
    deadline = time.monotonic() + 20
    gz = None
    while gz is None and time.monotonic() < deadline:
        gz = expo.render_gzip()
        time.sleep(0.02)
    assert gz is not None
    plain = gzip.decompress(gz)             # two gzip members: the fleet, then live process metrics
    assert plain.startswith(fleet_body(expo)) and b"process_" in plain[len(fleet_body(expo)):]
    assert gz.startswith(expo._gz[1])      # the fleet part is the one compressed per body


def test_no_compression_until_a_client_asks_for_gzip(captures):
    """Publishes compress nothing while nobody takes gzip; the first gzip request is answered
    plain (None here) and starts the compression, and from then on every publish is compressed."""
    views, _ = evaluated_fleet(captures, copies=12)
    expo = CachedExposition(compress_min_bytes=1024)
    expo.publish(fleet_view(views))
    time.sleep(0.3)
    assert expo._gz is None and expo._gz_thread is None
    assert expo.render_gzip_parts() is None          # asked: plain this time, compressing now
    deadline = time.monotonic() + 20
    while expo.render_gzip_parts() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    first = expo._gz
    assert first is not None and first[0] == expo._current[0]
    expo.publish(fleet_view(views[:-1]))            # a new body: compressed without being asked
    while (expo._gz is first or expo._gz_thread is not None) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert expo._gz[0] == expo._current[0] and gzip.decompress(expo._gz[1]) == fleet_body(expo)


def test_gzip_request_while_the_newest_compresses_gets_the_body_before(captures):
    """A new body takes a while to compress (~0.2 s for 10,000 targets); a gzip client asking
    meanwhile gets the previous body's gzip, not the new one plain (26 MB to read), unless the
    previous body was replaced more than GZIP_STALE_MAX seconds ago."""
    views, _ = evaluated_fleet(captures, copies=12)
    expo = CachedExposition(compress_min_bytes=1024)
    expo.publish(fleet_view(views))
    expo.render_gzip_parts()
    deadline = time.monotonic() + 20
    while expo.render_gzip_parts() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    first_body = fleet_body(expo)
    expo._gzip_wanted_at = None          # nobody took gzip for a while: this publish compresses nothing
    expo.publish(fleet_view(views[:-1]))
    assert fleet_body(expo) != first_body
    got = expo.render_gzip_parts()       # starts compressing the new body, answers with the old one
    assert got is not None and gzip.decompress(got[0]) == first_body
    while expo._gz[0] != expo._current[0] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert gzip.decompress(expo.render_gzip_parts()[0]) == fleet_body(expo)
    # a previous body replaced too long ago is not served: the newest goes plain instead
    expo._gzip_wanted_at = None
    expo.publish(fleet_view(views))
    expo.GZIP_STALE_MAX = 0.0
    time.sleep(0.01)
    assert expo.render_gzip_parts() is None


def entries_of(views):
    out = []
    for v in views:
        if v.reports:
            out.extend(Entry(v.target, r, None) for r in v.reports)
        else:
            out.append(Entry(v.target, None, {"target": v.target, "status": "down", "findings": []}))
    return out


def test_findings_filters_and_pagination(captures):
    views, _ = evaluated_fleet(captures, copies=2)
    index = FindingsIndex(1060.0, entries_of(views), ReportCache())
    full = json.loads(index.document())
    assert len(full["targets"]) == len(index.entries) == full["total"] and full["next_offset"] is None
    assert [t["target"] for t in full["targets"]] == [e.target for e in index.entries]

    with_findings = [t for t in full["targets"] if t["findings"]]
    name = with_findings[0]["findings"][0]["finding"]
    severity = with_findings[0]["findings"][0]["severity"]
    doc = json.loads(index.document(parse_query(f"finding={name}")))
    want = [t for t in full["targets"] if any(f["finding"] == name for f in t["findings"])]
    assert doc["targets"] == want and doc["total"] == len(want) >= 2
    doc = json.loads(index.document(parse_query(f"finding={name}&severity={severity}")))
    assert doc["targets"] == [t for t in want if any(f["finding"] == name and f["severity"] == severity
                                                     for f in t["findings"])]
    one = full["targets"][3]["target"]
    doc = json.loads(index.document(parse_query(f"target={one}")))
    assert doc["targets"] and {t["target"] for t in doc["targets"]} == {one}

    pages, offset = [], 0
    while offset is not None:
        doc = json.loads(index.document(parse_query(f"limit=3&offset={offset}")))
        assert len(doc["targets"]) <= 3 and doc["total"] == len(full["targets"])
        pages.extend(doc["targets"])
        offset = doc["next_offset"]
    assert pages == full["targets"]


def test_findings_api_over_http(captures):
    views, _ = evaluated_fleet(captures)
    pub = Published(lambda: b"", None)
    pub.findings_index = FindingsIndex(1060.0, entries_of(views), ReportCache())
    srv = HTTPServer("127.0.0.1:0", pub, WebConfig())
    srv.start()
    try:
        base = f"http://127.0.0.1:{srv.port}/api/v1/findings"
        with urllib.request.urlopen(base + "?limit=2&target=http://down:1,http://10.0.0.0:8000", timeout=5) as r:
            doc = json.loads(r.read())
        assert [t["target"] for t in doc["targets"]][:1] == ["http://10.0.0.0:8000"] and len(doc["targets"]) <= 2
        assert doc["total"] >= 2
        for bad in ("limit=0", "offset=-1", "limit=x", "colour=red"):
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(f"{base}?{bad}", timeout=5)
            assert err.value.code == 400 and "error" in json.loads(err.value.read())
        assert json.loads(pub.findings)["total"] == len(pub.findings_index.entries)
    finally:
        srv.stop()


def test_metrics_over_http_in_parts_plain_and_gzip(captures):
    """The daemon hands the server the fleet part and the live part separately (no copy of a
    large body per request): what a client reads is the joined body, plain or gzip."""
    views, _ = evaluated_fleet(captures, copies=4)
    expo = CachedExposition(compress_min_bytes=1024)
    expo.publish(fleet_view(views))
    pub = Published(expo.render_parts, expo.render_gzip_parts)
    srv = HTTPServer("127.0.0.1:0", pub, WebConfig())
    srv.start()
    try:
        url = f"http://127.0.0.1:{srv.port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            plain = r.read()
            assert int(r.headers["Content-Length"]) == len(plain)
        assert plain.startswith(fleet_body(expo)) and b"process_cpu_seconds_total" in plain[len(fleet_body(expo)):]
        deadline = time.monotonic() + 20
        while expo.render_gzip_parts() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        req = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
        with urllib.request.urlopen(req, timeout=5) as r:
            assert r.headers["Content-Encoding"] == "gzip"
            body = r.read()
            assert int(r.headers["Content-Length"]) == len(body)
        assert gzip.decompress(body).startswith(fleet_body(expo))
    finally:
        srv.stop()


def test_live_process_metrics_read_by_refresh_not_per_request(captures):
    views, _ = evaluated_fleet(captures)
    expo = CachedExposition()
    expo.publish(fleet_view(views))
    first = expo.render_parts()[-1]
    assert b"process_open_fds" in first
    assert expo.render_parts()[-1] is first          # requests read the cached part
    expo.refresh_live()                             # the daemon's job: read again
    assert expo.render_parts()[-1] is not first
    second = expo.render_parts()[-1]
    expo.LIVE_TTL = 0.0                             # nothing refreshes it: a request reads it
    assert expo.render_parts()[-1] is not second



@pytest.mark.parametrize("configured,recommended", [(None, None), (256, 512), (0.9, 0.85), ("auto", "fp8"),
                                                    (False, True), ((1, 2), [3, {"a": 4}])])
def test_finding_json_is_what_asdict_gives(configured, recommended):
    """`Finding.to_json` is a flat copy (the stability tracker makes one per evaluation): the
    same document `dataclasses.asdict` makes, containers copied rather than shared."""
    from exporter.report import Finding
    f = Finding("max_num_seqs", "warning", 0.4, "max_num_seqs", configured, recommended, "why", "kv_cache",
                since=12.0, confidence=0.5)
    doc = f.to_json()
    assert doc == dataclasses.asdict(f)
    if isinstance(recommended, list):
        doc["recommended"][1]["a"] = 5
        assert f.recommended[1]["a"] == 4


def test_gzip_of_parts_is_one_member_of_the_joined_parts():
    parts = tuple(bytes([65 + i % 26]) * (i * 37 % 5000) for i in range(400)) + (b"", b"x" * 600_000)
    gz = gzip_parts(parts, chunk=4096)
    assert gzip.decompress(gz) == b"".join(parts)
    assert gz[:2] == b"\x1f\x8b" and gzip.decompress(gzip_parts(())) == b""
