"""The daemon's `/` page: the fleet at a glance for a person with a browser.

Built from the same two JSON documents `/api/v1/findings` and `/api/v1/targets` serve, so the page
and the API never disagree. One self-contained HTML document: inline CSS, no JavaScript, no
external resource (it works on an air-gapped network); it refreshes itself with a meta tag. Every
string that comes from a target, a discovery source or a finding is HTML-escaped.
"""
from __future__ import annotations

import html
import json
import time
from dataclasses import dataclass
from typing import Any

SEVERITY_RANK = {"critical": 0, "warning": 1, "info": 2}
REFRESH_SECONDS = 30
MAX_AGE_SECONDS = 5.0   # a page is re-rendered when the documents change or it is this old


class Cached:
    """The page for the current documents, rendered at most once per `MAX_AGE_SECONDS` (its
    "12s ago" texts stay that fresh). At 1,000 targets a render takes ~80 ms of GIL time that
    /metrics answers would otherwise wait for on every page load."""

    def __init__(self, *, version: str, revision: str) -> None:
        self.version, self.revision = version, revision
        self._last: tuple[bytes, bytes, float, bytes] | None = None

    def page(self, findings: bytes, targets: bytes) -> bytes:
        now = time.monotonic()
        last = self._last
        if last is not None and last[0] is findings and last[1] is targets and now - last[2] < MAX_AGE_SECONDS:
            return last[3]
        body = render(findings, targets, version=self.version, revision=self.revision)
        self._last = (findings, targets, now, body)
        return body


@dataclass(frozen=True, slots=True)
class _Target:
    url: str
    info: dict[str, Any]              # the /api/v1/targets entry ({} when absent)
    reports: tuple[dict[str, Any], ...]   # the /api/v1/findings entries of this target

    @property
    def state(self) -> str:
        up = self.info.get("up")
        return "pending" if up is None else ("up" if up else "down")

    @property
    def findings(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """(report, finding) pairs, worst first."""
        pairs = [(r, f) for r in self.reports for f in r.get("findings") or ()]
        return sorted(pairs, key=lambda p: (SEVERITY_RANK.get(p[1].get("severity"), 3),
                                            -(p[1].get("score") or 0.0), p[1].get("finding") or ""))

    @property
    def worst(self) -> int:
        if self.state == "down":
            return -1
        return min((SEVERITY_RANK.get(f.get("severity"), 3) for _, f in self.findings), default=3)


def parse(findings: bytes, targets: bytes) -> tuple[float | None, list[_Target]]:
    """The published documents, grouped by target and ordered worst first."""
    fdoc, tdoc = json.loads(findings or b"{}"), json.loads(targets or b"{}")
    infos = {t["target"]: t for t in tdoc.get("targets") or () if t.get("target")}
    reports: dict[str, list[dict[str, Any]]] = {}
    for r in fdoc.get("targets") or ():
        if r.get("target"):
            reports.setdefault(r["target"], []).append(r)
    urls = sorted(set(infos) | set(reports))
    out = [_Target(u, infos.get(u, {}), tuple(reports.get(u, ()))) for u in urls]
    out.sort(key=lambda t: (t.worst, t.url))
    return fdoc.get("generated_at"), out


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _ago(ts: float | None, now: float) -> str:
    if not ts:
        return "never"
    d = max(0.0, now - ts)
    if d < 1:
        return "just now"
    if d < 90:
        return f"{d:.0f}s ago"
    if d < 5400:
        return f"{d / 60:.0f}m ago"
    return f"{d / 3600:.1f}h ago"


def _utc(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts)) if ts else "never"


def _value(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, float):
        if v.is_integer() and abs(v) >= 1:
            return f"{int(v):,}"
        return f"{v:.3g}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def _badge(kind: str, text: str | None = None) -> str:
    return f'<span class="badge {_e(kind)}">{_e(text or kind)}</span>'


CSS = """
:root{--bg:#f6f7f9;--card:#fff;--fg:#1d2430;--muted:#5b6676;--line:#dde2e8;--link:#1f5fbf;
--crit:#b3261e;--crit-bg:#fde8e7;--warn:#8a5a00;--warn-bg:#fff1d6;--info:#2d5b8a;--info-bg:#e6eef8;
--up:#1b7a3a;--up-bg:#e3f4e8;--down:#b3261e;--down-bg:#fde8e7;--pend:#5b6676;--pend-bg:#eceff3}
@media (prefers-color-scheme:dark){:root{--bg:#14171c;--card:#1c2027;--fg:#e3e7ee;--muted:#9aa5b4;
--line:#2e343d;--link:#7fb0ff;--crit:#ff8a80;--crit-bg:#3d1f1f;--warn:#ffcc66;--warn-bg:#3a2f17;
--info:#9cc3ff;--info-bg:#1d2a3d;--up:#7ad89a;--up-bg:#183524;--down:#ff8a80;--down-bg:#3d1f1f;
--pend:#9aa5b4;--pend-bg:#262b33}}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--fg);font:14px/1.45 system-ui,-apple-system,"Segoe UI",
Roboto,"Helvetica Neue",Arial,sans-serif}
a{color:var(--link);text-decoration:none}a:hover{text-decoration:underline}
header{background:var(--card);border-bottom:1px solid var(--line);padding:14px 28px;display:flex;
flex-wrap:wrap;align-items:baseline;gap:8px 24px}
header h1{font-size:20px;margin:0}header h1 small{font-weight:400;color:var(--muted);font-size:13px;margin-left:8px}
nav a{margin-right:16px;font-size:13px}
main{max-width:1280px;margin:0 auto;padding:20px 28px 40px}
h2{font-size:16px;margin:28px 0 10px}
.cards{display:flex;flex-wrap:wrap;gap:12px}
.card{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:10px 16px;min-width:150px}
.card .n{font-size:24px;font-weight:600;display:block}.card .l{color:var(--muted);font-size:12px;
text-transform:uppercase;letter-spacing:.04em}
.card.crit .n{color:var(--crit)}.card.warn .n{color:var(--warn)}.card.info .n{color:var(--info)}
.card.down .n{color:var(--down)}
table{width:100%;border-collapse:collapse;background:var(--card);border:1px solid var(--line);border-radius:8px}
th,td{text-align:left;padding:7px 10px;border-bottom:1px solid var(--line);vertical-align:top}
th{font-size:12px;color:var(--muted);font-weight:600;text-transform:uppercase;letter-spacing:.03em}
tr:last-child td{border-bottom:0}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:13px}
.muted{color:var(--muted)}
.badge{display:inline-block;border-radius:10px;padding:1px 8px;font-size:12px;font-weight:600;white-space:nowrap}
.badge.critical{color:var(--crit);background:var(--crit-bg)}.badge.warning{color:var(--warn);background:var(--warn-bg)}
.badge.info{color:var(--info);background:var(--info-bg)}.badge.up{color:var(--up);background:var(--up-bg)}
.badge.down{color:var(--down);background:var(--down-bg)}.badge.pending{color:var(--pend);background:var(--pend-bg)}
section.target{background:var(--card);border:1px solid var(--line);border-left:4px solid var(--line);
border-radius:8px;margin:14px 0;padding:12px 16px}
section.target.sev-critical,section.target.state-down{border-left-color:var(--crit)}
section.target.sev-warning{border-left-color:var(--warn)}section.target.sev-info{border-left-color:var(--info)}
section.target h3{margin:0 0 2px;font-size:15px;display:flex;gap:10px;align-items:center;flex-wrap:wrap}
section.target .meta{color:var(--muted);font-size:13px;margin:0 0 8px}
section.target table{border:0;background:transparent;table-layout:fixed}
col.c-sev{width:96px}col.c-find{width:210px}col.c-score{width:118px}col.c-change{width:250px}
td{overflow-wrap:anywhere}
section.target .model{font-weight:600;margin:10px 0 4px;font-size:13px}
.score{display:inline-block;width:60px;height:6px;background:var(--line);border-radius:3px;
vertical-align:middle;margin-right:6px;overflow:hidden}.score i{display:block;height:100%;background:var(--muted)}
tr.critical .score i{background:var(--crit)}tr.warning .score i{background:var(--warn)}tr.info .score i{background:var(--info)}
.change{white-space:nowrap}.change b{font-weight:600}
.error{color:var(--down)}
footer{color:var(--muted);font-size:12px;margin-top:28px}
"""


def render(findings: bytes, targets: bytes, *, version: str, revision: str, now: float | None = None) -> bytes:
    now = time.time() if now is None else now
    generated_at, fleet = parse(findings, targets)
    states = {s: sum(1 for t in fleet if t.state == s) for s in ("up", "down", "pending")}
    sev = {s: 0 for s in SEVERITY_RANK}
    for t in fleet:
        for _, f in t.findings:
            if f.get("severity") in sev:
                sev[f["severity"]] += 1
    rev = revision[:12] if revision and revision != "unknown" else revision
    out = [
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        f'<meta http-equiv="refresh" content="{REFRESH_SECONDS}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>vllm-drift — {len(fleet)} targets</title><style>{CSS}</style></head><body>",
        f"<header><h1>vllm-drift<small>{_e(version)} · revision {_e(rev)}</small></h1><nav>",
        '<a href="metrics">/metrics</a><a href="api/v1/findings">/api/v1/findings</a>',
        '<a href="api/v1/targets">/api/v1/targets</a><a href="-/healthy">/-/healthy</a>',
        '<a href="-/ready">/-/ready</a></nav></header><main>',
        '<div class="cards">',
        f'<div class="card"><span class="n">{len(fleet)}</span><span class="l">targets</span></div>',
        f'<div class="card"><span class="n">{states["up"]}</span><span class="l">up</span></div>',
        f'<div class="card down"><span class="n">{states["down"]}</span><span class="l">down</span></div>',
        f'<div class="card crit"><span class="n">{sev["critical"]}</span><span class="l">critical findings</span></div>',
        f'<div class="card warn"><span class="n">{sev["warning"]}</span><span class="l">warning findings</span></div>',
        f'<div class="card info"><span class="n">{sev["info"]}</span><span class="l">info findings</span></div>',
        f'<div class="card"><span class="n">{_e(_ago(generated_at, now))}</span>'
        f'<span class="l" title="{_e(_utc(generated_at))}">last evaluation</span></div></div>',
    ]
    out.append(_targets_table(fleet, now))
    out.append("<h2>Findings by target</h2>")
    if not fleet:
        out.append('<p class="muted">No targets yet: add <span class="mono">--target</span>, '
                   '<span class="mono">targets:</span>, <span class="mono">file_sd:</span> or '
                   '<span class="mono">kubernetes:</span> to the configuration.</p>')
    for i, t in enumerate(fleet):
        out.append(_target_section(i, t, now))
    out.append(f'<footer>Rendered {_e(_utc(now))}; refreshes every {REFRESH_SECONDS}s. '
               'The same data as JSON: <a href="api/v1/findings">findings</a>, '
               '<a href="api/v1/targets">targets</a>.</footer></main></body></html>\n')
    return "".join(out).encode()


def _targets_table(fleet: list[_Target], now: float) -> str:
    rows = []
    for i, t in enumerate(fleet):
        models = t.info.get("models") or {r.get("model_name"): r.get("engine_era") for r in t.reports
                                          if r.get("model_name")}
        model_txt = "<br>".join(_e(m) for m in models) or '<span class="muted">—</span>'
        eras = sorted({str(e) for e in models.values() if e}) or ["—"]
        counts = {}
        for _, f in t.findings:
            counts[f.get("severity")] = counts.get(f.get("severity"), 0) + 1
        badges = " ".join(_badge(s, f"{counts[s]} {s}") for s in SEVERITY_RANK if counts.get(s)) \
            or '<span class="muted">none</span>'
        dur = t.info.get("scrape_duration_seconds")
        dur_txt = (f' <span class="muted">({dur * 1000:.0f} ms)</span>'
                   if isinstance(dur, (int, float)) and t.info.get("last_success") else "")
        rows.append(
            f'<tr><td class="mono"><a href="#t{i}">{_e(t.url)}</a></td><td>{_badge(t.state)}</td>'
            f'<td title="{_e(_utc(t.info.get("last_success")))}">{_e(_ago(t.info.get("last_success"), now))}{dur_txt}</td>'
            f'<td>{_e(t.info.get("vllm_version") or "—")}</td><td>{model_txt}</td>'
            f'<td>{_e(", ".join(eras))}</td><td>{badges}</td></tr>')
    return ("<h2>Targets</h2><table><thead><tr><th>Target</th><th>State</th><th>Last scrape</th>"
            "<th>vLLM</th><th>Model</th><th>Era</th><th>Active findings</th></tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>")


def _target_section(i: int, t: _Target, now: float) -> str:
    worst = next((s for s, r in SEVERITY_RANK.items() if r == t.worst), "none")
    parts = [f'<section class="target state-{t.state} sev-{worst}" id="t{i}">',
             f'<h3><span class="mono">{_e(t.url)}</span> {_badge(t.state)}</h3>']
    meta = [f"source {_e(t.info.get('source') or '—')}",
            f"vLLM {_e(t.info.get('vllm_version') or '—')}",
            f"last scrape {_e(_ago(t.info.get('last_success'), now))}"]
    parts.append(f'<p class="meta">{" · ".join(meta)}</p>')
    if t.state == "down" and t.info.get("last_error"):
        parts.append(f'<p class="error">Last error ({_e(t.info.get("last_error_reason") or "error")}): '
                     f'{_e(t.info["last_error"])}</p>')
    if not any(r.get("model_name") for r in t.reports):
        if t.state != "down":
            parts.append('<p class="muted">Not evaluated yet.</p>')
        parts.append("</section>")
        return "".join(parts)
    for r in t.reports:
        if not r.get("model_name"):
            continue
        parts.append(f'<p class="model">{_e(r["model_name"])} <span class="muted">· era '
                     f'{_e(r.get("engine_era") or "unknown")} · status {_e(r.get("status") or "—")}</span></p>')
        fs = sorted(r.get("findings") or (), key=lambda f: (SEVERITY_RANK.get(f.get("severity"), 3),
                                                             -(f.get("score") or 0.0)))
        if not fs:
            parts.append('<p class="muted">No active findings: the configuration matches the traffic.</p>')
            continue
        parts.append('<table class="findings"><colgroup><col class="c-sev"><col class="c-find"><col class="c-score">'
                     '<col class="c-change"><col></colgroup><thead><tr><th>Severity</th><th>Finding</th><th>Score</th>'
                     '<th>Configured → recommended</th><th>Explanation</th></tr></thead><tbody>')
        for f in fs:
            s = f.get("severity") or "info"
            score = float(f.get("score") or 0.0)
            if f.get("parameter") or f.get("recommended") is not None:
                was = (_e(_value(f["configured"])) if f.get("configured") is not None
                       else '<span class="muted">unknown</span>')
                change = (f'<span class="change">{_e(f.get("parameter") or "")} {was} → '
                          f'<b>{_e(_value(f.get("recommended")))}</b></span>')
            else:
                change = '<span class="muted">—</span>'
            parts.append(
                f'<tr class="{_e(s)} finding" data-finding="{_e(f.get("finding"))}"><td>{_badge(s)}</td>'
                f'<td class="mono">{_e(f.get("finding"))}</td>'
                f'<td class="num"><span class="score"><i style="width:{min(max(score, 0.0), 1.0) * 100:.0f}%"></i>'
                f'</span>{score:.2f}</td><td>{change}</td><td>{_e(f.get("explanation") or "")}</td></tr>')
        parts.append("</tbody></table>")
    parts.append("</section>")
    return "".join(parts)
