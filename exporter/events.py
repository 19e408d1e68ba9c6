"""What the daemon tells its operator, as structured log events (rendered by `exporter.logs`).

The daemon calls one `Narrator` at the points where things happen (a target discovered, its
first good scrape, each evaluation); the narrator keeps the little memory needed to say what
*changed*: how far each window has filled (a line at each quarter), whether a target/model was
evaluated before, and the findings active at the previous evaluation. Finding transitions are
computed here, in one place, by diffing consecutive evaluations' active findings per
(target, model): `opened`, `escalated`, `de-escalated` (severity up or down) and `cleared`.

Events (the structlog `event` key), all at info level:
  target discovered   target, source
  first scrape        target, models (comma-separated), vllm_version, engine_era
  window filling      target, model_name, percent (25, 50, 75: the highest quarter reached),
                      window_seconds (span covered), window (length)
  window full         target, model_name, window_seconds
  first evaluation    target, model_name, status, findings (warning and above, comma-separated),
                      needs_more_data (findings not judged yet, comma-separated)
  engine asleep       target, model_name, level (vLLM sleep mode 1 or 2): load findings wait
  engine awake        target, model_name: the window starts again (filling lines follow)
  finding opened | finding escalated | finding de-escalated | finding cleared
                      target, model_name, finding, severity (previous_severity), score,
                      parameter, configured, recommended, explanation
  evaluation          one line per evaluation: targets, models, critical/warning/info counts, how many
                      windows are still filling, duration_ms; so the daemon is never silent for
                      longer than one evaluation interval
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import structlog

from exporter.report import FINDINGS, SEVERITIES, Finding, ModelReport

RANK = {s: i for i, s in enumerate(SEVERITIES)}
QUARTERS = (25, 50, 75, 100)


@dataclass(frozen=True)
class Transition:
    kind: str                      # opened | escalated | de-escalated | cleared
    finding: Finding               # the current finding (the last one seen, for `cleared`)
    previous: Finding | None = None


def transitions(prev: Mapping[str, Finding], cur: Mapping[str, Finding]) -> list[Transition]:
    """Findings (by name) active at the previous evaluation vs now -> what changed, in a stable
    order: cleared first, then opened, escalated, de-escalated (each sorted by name)."""
    out = [Transition("cleared", prev[n], prev[n]) for n in sorted(set(prev) - set(cur))]
    for n in sorted(cur):
        f, p = cur[n], prev.get(n)
        if p is None:
            out.append(Transition("opened", f))
        elif RANK.get(f.severity, 0) > RANK.get(p.severity, 0):
            out.append(Transition("escalated", f, p))
        elif RANK.get(f.severity, 0) < RANK.get(p.severity, 0):
            out.append(Transition("de-escalated", f, p))
    return out


def active(report: ModelReport) -> dict[str, Finding]:
    """The report's findings by name (a finding name appears once per report)."""
    return {f.finding: f for f in report.findings}


def needs_more_data(doc: Mapping[str, Any]) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """(findings not judged yet, why, findings that cannot be judged from this server and why),
    from the report's per-finding status; a report without one (an engine that says only
    `insufficient_data` for the whole report) lists every finding it did not give."""
    status = doc.get("finding_status") or {}
    if status:
        need = {k: str(v.get("reason") or "") for k, v in status.items()
                if v.get("status") == "insufficient_data"}
        gone = {k: str(v.get("reason") or "") for k, v in status.items() if v.get("status") == "unavailable"}
        return sorted(need), need, gone
    fs = doc.get("findings") or []
    pseudo = {f["finding"]: f.get("explanation") or "" for f in fs
              if f["finding"] in ("insufficient_data", "unavailable")}
    gone = {f["finding"]: f.get("explanation") or "" for f in fs
            if f["finding"] == "unavailable" and f.get("parameter")}
    if "insufficient_data" not in pseudo and doc.get("status") != "insufficient_data":
        return [], {}, gone
    given = {f["finding"] for f in fs}
    why = pseudo.get("insufficient_data", "")
    need = [n for n in FINDINGS if n not in given and n not in ("insufficient_data", "unavailable")]
    return need, {n: why for n in need}, gone


def _brief(report: ModelReport) -> dict[str, Any]:
    """The parts of `report.to_json()` that `needs_more_data` reads, without the rest."""
    return {"finding_status": getattr(report, "finding_status", None) or {}, "status": report.status,
            "findings": [{"finding": f.finding, "explanation": f.explanation, "parameter": f.parameter}
                         for f in report.findings]}


@dataclass
class _Memory:
    findings: dict[str, Finding] = field(default_factory=dict)
    quarter: int = 0               # highest quarter of the window logged
    evaluated: bool = False
    sleep_level: int | None = None # vLLM sleep mode at the previous evaluation


class Narrator:
    """Per-daemon memory of what was already said; emits through a structlog logger."""

    def __init__(self, logger: Any = None) -> None:
        self.log = logger if logger is not None else structlog.get_logger("vllm_drift")
        self._mem: dict[tuple[str, str], _Memory] = {}
        self._scraped: set[str] = set()

    # ---- targets --------------------------------------------------------------------------
    def discovered(self, url: str, source: str | None) -> None:
        self.log.info("target discovered", target=url, source=source)

    def removed(self, url: str) -> None:
        self.log.info("target removed", target=url)
        self._scraped.discard(url)
        for key in [k for k in self._mem if k[0] == url]:
            del self._mem[key]

    def scraped(self, url: str, models: Iterable[tuple[str, str | None]],
                vllm_version: str | None) -> None:
        """A good scrape; the first one per target is logged."""
        if url in self._scraped:
            return
        self._scraped.add(url)
        models = list(models)
        self.log.info("first scrape", target=url, models=",".join(m for m, _ in models),
                      vllm_version=vllm_version,
                      engine_era=next((e for _, e in models if e), None))

    # ---- evaluations ----------------------------------------------------------------------
    def evaluated(self, url: str, model: str, report: ModelReport, window_s: float,
                  slack_s: float = 0.0) -> list[Transition]:
        """One target/model's report of this evaluation: window progress, first evaluation and
        finding transitions are logged; the transitions are returned. The window counts as full
        when it covers `window_s - slack_s` (one scrape interval short: snapshots come at scrape
        times, so the span of a full window is up to one interval less than its length)."""
        mem = self._mem.setdefault((url, model), _Memory())
        level = (report.observed or {}).get("sleep_level")
        if level != mem.sleep_level and level is not None:
            if level:
                self.log.info("engine asleep", target=url, model_name=model, level=level)
            elif mem.sleep_level:
                self.log.info("engine awake", target=url, model_name=model)
                mem.quarter = 0         # its window started again at the wake-up
            mem.sleep_level = level
        covered = float((report.observed or {}).get("window_seconds") or 0.0)
        # a full window's rates span between 7/8 of it and all of it (exporter.window keeps a
        # baseline snapshot every 1/8), less up to one scrape interval
        full = max(min(window_s - slack_s, 0.85 * window_s), 1e-9)
        reached = max((q for q in QUARTERS if covered + 1e-6 >= full * q / 100.0), default=0)
        if reached > mem.quarter:
            mem.quarter = reached
            if reached == 100:
                self.log.info("window full", target=url, model_name=model, window_seconds=round(covered, 1))
            else:
                self.log.info("window filling", target=url, model_name=model, percent=reached,
                              window_seconds=round(covered, 1), window=window_s)
        if not mem.evaluated:
            mem.evaluated = True
            self.log.info("first evaluation", target=url, model_name=model, status=report.status,
                          findings=",".join(sorted(f.finding for f in report.findings
                                                   if RANK.get(f.severity, 0) >= RANK["warning"])),
                          needs_more_data=",".join(needs_more_data(_brief(report))[0]))
        cur = active(report)
        out = transitions(mem.findings, cur)
        mem.findings = cur
        for t in out:
            f = t.finding
            fields: dict[str, Any] = dict(target=url, model_name=model, finding=f.finding,
                                          severity=f.severity, score=round(float(f.score), 3))
            if t.previous is not None and t.kind != "cleared":
                fields["previous_severity"] = t.previous.severity
            if f.parameter:
                fields.update(parameter=f.parameter, configured=f.configured, recommended=f.recommended)
            if t.kind != "cleared":
                fields["explanation"] = f.explanation
            self.log.info(f"finding {t.kind}", **fields)
        return out

    def filling(self) -> int:
        """How many evaluated target/models have a window not yet full."""
        return sum(1 for m in self._mem.values() if m.quarter < 100)

    def summary(self, reports: Iterable[ModelReport], targets: int, duration_s: float) -> None:
        counts = {s: 0 for s in SEVERITIES}
        models = 0
        for r in reports:
            models += 1
            for f in r.findings:
                counts[f.severity] = counts.get(f.severity, 0) + 1
        self.log.info("evaluation", targets=targets, models=models, critical=counts.get("critical", 0),
                      warning=counts.get("warning", 0), info=counts.get("info", 0),
                      windows_filling=self.filling(), duration_ms=round(duration_s * 1000, 1))

    def forget(self, url: str, model: str) -> None:
        self._mem.pop((url, model), None)
