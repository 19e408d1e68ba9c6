"""Workload presets: named traffic + SLOs + objective, each number with its public source.

Why: "how should I set up vLLM for a chatbot" is the question most people bring; a preset turns
it into the traffic and SLOs the calculator needs, stated in the output so the user can see and
override every assumption. The recommendation itself is computed for the model and GPU.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any, Mapping

from exporter import yamlfile
from exporter.errors import CatalogError

OBJECTIVES = ("cost", "latency", "throughput")
ARRIVALS = ("poisson", "bursty", "closed-loop")


@dataclass(frozen=True)
class Profile:
    name: str
    title: str
    objective: str
    prompt_tokens_mean: float
    prompt_tokens_p99: float | None
    output_tokens_mean: float
    output_tokens_p99: float | None
    prefix_hit_ratio: float
    arrival: str
    ttft_p99_s: float | None
    tpot_p99_s: float | None
    sources: Mapping[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "title": self.title, "objective": self.objective,
                "prompt_tokens": {"mean": self.prompt_tokens_mean, "p99": self.prompt_tokens_p99},
                "output_tokens": {"mean": self.output_tokens_mean, "p99": self.output_tokens_p99},
                "prefix_hit_ratio": self.prefix_hit_ratio, "arrival": self.arrival,
                "slo": {"ttft_p99_s": self.ttft_p99_s, "tpot_p99_s": self.tpot_p99_s},
                "sources": dict(self.sources)}


def _build(name: str, e: Mapping[str, Any]) -> Profile:
    where = f"profiles.yaml: {name}"
    try:
        p, o, slo = e["prompt_tokens"], e["output_tokens"], e.get("slo") or {}
        prof = Profile(name=name, title=str(e["title"]), objective=str(e["objective"]),
                       prompt_tokens_mean=float(p["mean"]), prompt_tokens_p99=_opt(p.get("p99")),
                       output_tokens_mean=float(o["mean"]), output_tokens_p99=_opt(o.get("p99")),
                       prefix_hit_ratio=float(e.get("prefix_hit_ratio") or 0.0), arrival=str(e["arrival"]),
                       ttft_p99_s=_opt(slo.get("ttft_p99_s")), tpot_p99_s=_opt(slo.get("tpot_p99_s")),
                       sources=dict(e.get("sources") or {}))
    except (KeyError, TypeError, ValueError) as exc:
        raise CatalogError(f"{where}: bad or missing key {exc}") from None
    if prof.objective not in OBJECTIVES:
        raise CatalogError(f"{where}: objective {prof.objective!r} not one of {', '.join(OBJECTIVES)}")
    if prof.arrival not in ARRIVALS:
        raise CatalogError(f"{where}: arrival {prof.arrival!r} not one of {', '.join(ARRIVALS)}")
    return prof


def _opt(v: Any) -> float | None:
    return None if v is None else float(v)


@lru_cache(maxsize=1)
def profiles() -> dict[str, Profile]:
    """Every preset, in file order."""
    text = resources.files("exporter.model").joinpath("data/profiles.yaml").read_text(encoding="utf-8")
    data = yamlfile.safe_load(text)["profiles"]
    return {name: _build(name, e) for name, e in data.items()}


def get_profile(name: str) -> Profile:
    """A preset by name; CatalogError listing the names when unknown."""
    found = profiles().get((name or "").strip().lower())
    if found is None:
        raise CatalogError(f"unknown profile {name!r}; one of {', '.join(profiles())}")
    return found
