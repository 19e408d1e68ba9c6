"""Render an engine's `Metrics` as the `/metrics` text a real vLLM server of a given era serves.

Rendering is on the hot path of fleet mode (up to 1,000 targets per tick on 2 cores), so each
family is compiled once into static text pieces (HELP/TYPE lines, sample names with their sorted
label sets, the constant `_created` series) and a function returning only the changing numbers;
a render is then one interleave and one `join`. Number formatting follows prometheus_client
(`0.0`, `1.7624384230434499e+09`, `+Inf`), with a fast path for small integers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from prometheus_client.utils import floatToGoString

from exporter.sim.engine import Metrics
from exporter.sim.eras import Era, Family, bounds_for


def fmt(v: float) -> str:
    """prometheus_client's number format, fast for the common integer-valued case."""
    if v == 0:
        return "0.0"
    if -1e6 < v < 1e6 and v == int(v):
        return f"{int(v)}.0"
    return floatToGoString(v)


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _labels(pairs: Sequence[tuple[str, str]]) -> str:
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in sorted(pairs)) + "}"


@dataclass(frozen=True)
class _Block:
    """Static text pieces around the numbers `values(metrics)` returns (len(pieces) - 1 of them);
    `present(metrics)` hides families a multiprocess V0 registry has not written yet."""

    pieces: tuple[str, ...]
    values: Callable[[Metrics], list]
    present: Callable[[Metrics], bool] | None = None


def _scalar(source: str, extra: Mapping[str, Callable[[Metrics], float]]) -> Callable[[Metrics], float]:
    kind, _, key = source.partition(":")
    if source in extra:
        return extra[source]
    if source == "g:running":
        return lambda m: m.running
    if source == "g:waiting":
        return lambda m: m.waiting
    if source == "g:kv_usage":
        return lambda m: m.kv_usage
    if source in ("g:zero", "c:zero"):
        return lambda m: 0.0
    if source == "g:one":
        return lambda m: 1.0
    if source == "g:minus_one":
        return lambda m: -1.0
    if kind == "finished":
        return lambda m: m.finished.get(key, 0)
    if kind == "c":
        return lambda m: m.counters.get(key, 0)
    raise ValueError(f"unknown metric source {source!r}")


class Renderer:
    """Compiled exposition of one engine for one era."""

    def __init__(self, era: Era, *, model_name: str, max_model_len: int, max_num_seqs: int,
                 cache_config: Mapping[str, str], start_time: float, spec_tokens: int = 0,
                 engine_index: str = "0", multiprocess_api: bool = False):
        """`multiprocess_api`: the V1 frontend runs several API-server processes (data parallel),
        so prometheus_client's multiprocess collector serves /metrics: histograms as `_sum`,
        buckets, `_count`, no `_created` series, no process/python families."""
        self.era = era
        self._mp = era.multiprocess or multiprocess_api
        self.start_time = start_time
        self.bounds = bounds_for(era, max_model_len, max_num_seqs)
        self._created_seq = 0
        base: list[tuple[str, str]] = []
        if era.v1:
            base.append(("engine", engine_index))
        self._base_model = [("model_name", model_name)]
        self._base_engine = base
        spec_enabled = spec_tokens > 0
        block_size = int(cache_config.get("block_size", "16") or 16)
        extra = {
            "g:hit_rate": (lambda m: (m.counters["prefix_hits"] / m.counters["prefix_queries"])
                           if m.counters["prefix_queries"] else
                           (0.0 if cache_config.get("enable_prefix_caching") == "True" else -1.0)),
            "g:spec_acceptance": (lambda m: m.counters["spec_accepted"] / m.counters["spec_draft_tokens"]
                                  if m.counters["spec_draft_tokens"] else 0.0),
            "g:spec_efficiency": (lambda m: (m.counters["spec_accepted"] + m.counters["spec_drafts"])
                                  / (m.counters["spec_drafts"] * (spec_tokens + 1))
                                  if m.counters["spec_drafts"] else 0.0),
            "c:spec_emitted": lambda m: m.counters["spec_accepted"] + m.counters["spec_drafts"],
            # 0.7.3-0.8.x V1 counted prefix-cache queries/hits in blocks
            "c:prefix_query_blocks": lambda m: m.counters["prefix_queries"] // block_size,
            "c:prefix_hit_blocks": lambda m: m.counters["prefix_hits"] // block_size,
        }
        self._extra = extra
        blocks: list[_Block] = []
        families = list(era.families)
        if spec_enabled:
            # V1 registers spec-decode families right after the prefix-cache counters' block;
            # their position does not matter to parsers, so they go after the counters.
            idx = next((i for i, f in enumerate(families) if f.name.startswith("vllm:request_success")),
                       len(families))
            families[idx:idx] = list(era.spec)
        for fam in families:
            if fam.source == "spec_per_pos":
                samples = tuple(((("position", str(p)),), f"pos:{p}") for p in range(spec_tokens))
                fam = Family(fam.name, fam.type, fam.help, "", samples, fam.engine, fam.model)
            blocks.extend(self._compile(fam, cache_config))
        self._blocks = tuple(blocks)
        self._python_process = era.python_process and not multiprocess_api
        self._http = era.python_process and era.v1     # the V1 API server's HTTP families
        self._http_created = [fmt(start_time + 0.5 + 1e-5 * i) for i in range(5)]

    # ---- compilation -------------------------------------------------------------------------
    def _pairs(self, fam: Family, extra: Sequence[tuple[str, str]] = ()) -> list[tuple[str, str]]:
        pairs = list(extra)
        if fam.engine:
            pairs += self._base_engine
        if fam.model:
            pairs += self._base_model
        return pairs

    def _created(self) -> str:
        self._created_seq += 1
        return fmt(self.start_time + 2.5e-5 * self._created_seq)

    def _compile(self, fam: Family, cache_config: Mapping[str, str]) -> list[_Block]:
        era = self.era
        name = fam.name
        if fam.type == "info":
            if fam.source == "info:lora":
                text = (f"# HELP {name} {fam.help}\n# TYPE {name} gauge\n"
                        f'{name}{{max_lora="0",running_lora_adapters="",waiting_lora_adapters=""}} '
                        f"{fmt(self.start_time + 1.5)}\n")
            else:
                labels = [(k, cache_config.get(k, "None")) for k in era.cache_labels]
                if fam.engine and era.v1:
                    labels += self._base_engine
                text = f"# HELP {name} {fam.help}\n# TYPE {name} gauge\n{name}{_labels(labels)} 1.0\n"
            return [_Block((text,), lambda m: [])]
        samples = fam.samples or (((), fam.source),)
        if fam.type == "gauge":
            head = f"# HELP {name} {fam.help}\n# TYPE {name} gauge\n"
            pieces = [head]
            getters = []
            for extra, src in samples:
                pieces[-1] += f"{name}{_labels(self._pairs(fam, extra))} "
                pieces.append("\n")
                getters.append(_scalar(src, self._extra))
            return [_Block(tuple(pieces), lambda m, g=tuple(getters): [f(m) for f in g])]
        if fam.type == "counter":
            total = name + "_total"
            head = f"# HELP {total} {fam.help}\n# TYPE {total} counter\n"
            pieces = [head]
            getters = []
            for extra, src in samples:
                pieces[-1] += f"{total}{_labels(self._pairs(fam, extra))} "
                pieces.append("\n")
                if src.startswith("pos:"):
                    p = int(src[4:])
                    getters.append(lambda m, p=p: m.spec_accepted_per_pos[p])
                else:
                    getters.append(_scalar(src, self._extra))
            if era.v1 and not self._mp:
                pieces[-1] += self._created_text(fam, [e for e, _ in samples])
            present = None
            if era.multiprocess and fam.samples and fam.samples[0][1].startswith("finished:"):
                # V0 multiprocess: only reasons that occurred have a series.
                return [self._v0_success(fam)]
            return [_Block(tuple(pieces), lambda m, g=tuple(getters): [f(m) for f in g], present)]
        if fam.type == "histogram":
            key = fam.source.partition(":")[2]
            bounds = self.bounds[key]
            pairs = self._pairs(fam)
            les = [fmt(b) for b in bounds] + ["+Inf"]
            head = f"# HELP {name} {fam.help}\n# TYPE {name} histogram\n"
            if self._mp:   # _sum, buckets, _count (MultiProcessCollector order)
                pieces = [head + f"{name}_sum{_labels(pairs)} "]
                for le in les:
                    pieces.append(f"\n{name}_bucket{_labels(pairs + [('le', le)])} ")
                pieces.append(f"\n{name}_count{_labels(pairs)} ")
                pieces.append("\n")

                def values(m: Metrics, key: str = key) -> list:
                    h = m.hist[key]
                    return [h.sum, *h.cumulative(), h.count]
                # V0 writes a histogram's file on its first observation; V1 labels its
                # histograms at start-up, which writes them (all present from the start)
                present = (lambda m, key=key: m.hist[key].count > 0) if era.multiprocess else None
                return [_Block(tuple(pieces), values, present)]
            pieces = [head + f"{name}_bucket{_labels(pairs + [('le', les[0])])} "]
            for le in les[1:]:
                pieces.append(f"\n{name}_bucket{_labels(pairs + [('le', le)])} ")
            pieces.append(f"\n{name}_count{_labels(pairs)} ")
            pieces.append(f"\n{name}_sum{_labels(pairs)} ")
            pieces.append("\n" + (self._created_text(fam, [()]) if era.v1 else ""))

            def values(m: Metrics, key: str = key) -> list:
                h = m.hist[key]
                return [*h.cumulative(), h.count, h.sum]
            return [_Block(tuple(pieces), values)]
        raise ValueError(f"unknown family type {fam.type!r}")

    def _created_text(self, fam: Family, extras: list) -> str:
        cname = fam.name + "_created"
        out = f"# HELP {cname} {fam.help}\n# TYPE {cname} gauge\n"
        for extra in extras:
            out += f"{cname}{_labels(self._pairs(fam, extra))} {self._created()}\n"
        return out

    def _v0_success(self, fam: Family) -> _Block:
        total = fam.name + "_total"
        head = f"# HELP {total} {fam.help}\n# TYPE {total} counter\n"
        prefixes = {r: f"{total}{_labels(self._pairs(fam, [('finished_reason', r)]))} "
                    for r in ("stop", "length", "abort")}

        def text(m: Metrics) -> list:
            return [head + "".join(prefixes[r] + fmt(n) + "\n" for r, n in m.finished.items() if n)]
        return _Block(("", ""), text, lambda m: any(m.finished.values()))

    # ---- rendering ---------------------------------------------------------------------------
    def render(self, m: Metrics, now: float | None = None) -> str:
        out: list[str] = []
        if self._python_process:
            out.append(_python_process_text(self.start_time, now if now is not None else self.start_time))
        append = out.append
        for b in self._blocks:
            if b.present is not None and not b.present(m):
                continue
            pieces = b.pieces
            append(pieces[0])
            for v, piece in zip(b.values(m), pieces[1:]):
                append(v if isinstance(v, str) else fmt(v))
                append(piece)
        if self._http:
            append(self._http_text(m))
        return "".join(out)

    def _http_text(self, m: Metrics) -> str:
        """prometheus_fastapi_instrumentator's families: labelled series exist once a request
        was served; before that only their HELP/TYPE lines (as on a real idle server)."""
        n = m.hist["http_highr"].count
        c = self._http_created

        def created(key: str, series: str, i: int) -> str:
            return "" if self._mp else _HTTP_HEAD[key + "_created"] + f"{series} {c[i]}\n"
        out = [_HTTP_HEAD["requests"]]
        if n:
            lab = '{handler="/v1/completions",method="POST",status="2xx"}'
            out.append(f"http_requests_total{lab} {fmt(n)}\n"
                       + created("requests", "http_requests_created" + lab, 0))
        for key, total, ci in (("request_size", "http_request_bytes", 1),
                               ("response_size", "http_response_bytes", 2)):
            name = f"http_{key}_bytes"
            out.append(_HTTP_HEAD[key])
            if n:
                out.append(f'{name}_count{{handler="/v1/completions"}} {fmt(n)}\n'
                           f'{name}_sum{{handler="/v1/completions"}} {fmt(m.counters[total])}\n'
                           + created(key, f'{name}_created{{handler="/v1/completions"}}', ci))
        h = m.hist["http_highr"]
        out.append(_HTTP_HEAD["highr"])
        for b, v in zip(self.bounds["http_highr"], h.cumulative()):
            out.append(f'http_request_duration_highr_seconds_bucket{{le="{fmt(b)}"}} {fmt(v)}\n')
        out.append(f'http_request_duration_highr_seconds_bucket{{le="+Inf"}} {fmt(h.count)}\n'
                   f"http_request_duration_highr_seconds_count {fmt(h.count)}\n"
                   f"http_request_duration_highr_seconds_sum {fmt(h.sum)}\n"
                   + created("highr", "http_request_duration_highr_seconds_created", 3))
        out.append(_HTTP_HEAD["duration"])
        if n:
            h = m.hist["http_few"]
            lab = 'handler="/v1/completions"'
            for b, v in zip(self.bounds["http_few"], h.cumulative()):
                out.append(f'http_request_duration_seconds_bucket{{{lab},le="{fmt(b)}",method="POST"}} {fmt(v)}\n')
            out.append(f'http_request_duration_seconds_bucket{{{lab},le="+Inf",method="POST"}} {fmt(h.count)}\n'
                       f'http_request_duration_seconds_count{{{lab},method="POST"}} {fmt(h.count)}\n'
                       f'http_request_duration_seconds_sum{{{lab},method="POST"}} {fmt(h.sum)}\n'
                       + created("duration", f'http_request_duration_seconds_created{{{lab},method="POST"}}', 4))
        return "".join(out)


def _help_type(name: str, text: str, kind: str) -> str:
    return f"# HELP {name} {text}\n# TYPE {name} {kind}\n"


_H_REQ = "Total number of requests by method, status and handler."
_H_SIZE_IN = ("Content length of incoming requests by handler. Only value of header is respected. "
              "Otherwise ignored. No percentile calculated. ")
_H_SIZE_OUT = ("Content length of outgoing responses by handler. Only value of header is respected. "
               "Otherwise ignored. No percentile calculated. ")
_H_HIGHR = ("Latency with many buckets but no API specific labels. Made for more accurate "
            "percentile calculations. ")
_H_FEW = ("Latency with only few buckets by handler. Made to be only used if aggregation by "
          "handler is important. ")
_HTTP_HEAD = {
    "requests": _help_type("http_requests_total", _H_REQ, "counter"),
    "requests_created": _help_type("http_requests_created", _H_REQ, "gauge"),
    "request_size": _help_type("http_request_size_bytes", _H_SIZE_IN, "summary"),
    "request_size_created": _help_type("http_request_size_bytes_created", _H_SIZE_IN, "gauge"),
    "response_size": _help_type("http_response_size_bytes", _H_SIZE_OUT, "summary"),
    "response_size_created": _help_type("http_response_size_bytes_created", _H_SIZE_OUT, "gauge"),
    "highr": _help_type("http_request_duration_highr_seconds", _H_HIGHR, "histogram"),
    "highr_created": _help_type("http_request_duration_highr_seconds_created", _H_HIGHR, "gauge"),
    "duration": _help_type("http_request_duration_seconds", _H_FEW, "histogram"),
    "duration_created": _help_type("http_request_duration_seconds_created", _H_FEW, "gauge"),
}


def _python_process_text(start: float, now: float) -> str:
    """The default prometheus_client collectors of the API-server process (single-process mode)."""
    up = max(0.0, now - start)
    return (
        "# HELP python_gc_objects_collected_total Objects collected during gc\n"
        "# TYPE python_gc_objects_collected_total counter\n"
        'python_gc_objects_collected_total{generation="0"} 11299.0\n'
        'python_gc_objects_collected_total{generation="1"} 1620.0\n'
        'python_gc_objects_collected_total{generation="2"} 236.0\n'
        "# HELP python_gc_objects_uncollectable_total Uncollectable objects found during GC\n"
        "# TYPE python_gc_objects_uncollectable_total counter\n"
        'python_gc_objects_uncollectable_total{generation="0"} 0.0\n'
        'python_gc_objects_uncollectable_total{generation="1"} 0.0\n'
        'python_gc_objects_uncollectable_total{generation="2"} 0.0\n'
        "# HELP python_gc_collections_total Number of times this generation was collected\n"
        "# TYPE python_gc_collections_total counter\n"
        'python_gc_collections_total{generation="0"} 1746.0\n'
        'python_gc_collections_total{generation="1"} 158.0\n'
        'python_gc_collections_total{generation="2"} 11.0\n'
        "# HELP python_info Python platform information\n"
        "# TYPE python_info gauge\n"
        'python_info{implementation="CPython",major="3",minor="12",patchlevel="3",version="3.12.3"} 1.0\n'
        "# HELP process_virtual_memory_bytes Virtual memory size in bytes.\n"
        "# TYPE process_virtual_memory_bytes gauge\n"
        "process_virtual_memory_bytes 8.982228992e+09\n"
        "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
        "# TYPE process_resident_memory_bytes gauge\n"
        "process_resident_memory_bytes 1.08929024e+09\n"
        "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.\n"
        "# TYPE process_start_time_seconds gauge\n"
        f"process_start_time_seconds {floatToGoString(round(start - 55.0, 2))}\n"
        "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n"
        "# TYPE process_cpu_seconds_total counter\n"
        f"process_cpu_seconds_total {fmt(round(11.0 + up * 0.08, 2))}\n"
        "# HELP process_open_fds Number of open file descriptors.\n"
        "# TYPE process_open_fds gauge\n"
        "process_open_fds 45.0\n"
        "# HELP process_max_fds Maximum number of open file descriptors.\n"
        "# TYPE process_max_fds gauge\n"
        "process_max_fds 1.048576e+06\n"
    )


def cache_config_values(era: Era, *, block_size: int, num_gpu_blocks: int,
                        gpu_memory_utilization: float, enable_prefix_caching: bool,
                        cache_dtype: str = "auto", max_model_len: int = 4096,
                        kv_cache_memory_bytes: int | None = None,
                        num_gpu_blocks_override: int | None = None,
                        engines: int = 1) -> dict[str, str]:
    """`cache_config_info` label values as that era's CacheConfig stringifies them; `engines`
    data-parallel engines of `num_gpu_blocks` each show the sum in `num_gpu_blocks` (vLLM's
    frontend adds them up) and their own pool in `kv_cache_size_tokens`."""
    v = {
        "block_size": str(block_size), "cache_dtype": cache_dtype,
        "calculate_kv_scales": "False", "enable_prefix_caching": str(bool(enable_prefix_caching)),
        "gpu_memory_utilization": repr(float(gpu_memory_utilization)),
        "is_attention_free": "False", "num_gpu_blocks": str(num_gpu_blocks * engines),
        "num_gpu_blocks_override": "None" if num_gpu_blocks_override is None else str(num_gpu_blocks_override), "sliding_window": "None", "num_cpu_blocks": "None",
    }
    if not era.v1:
        v.update({"cpu_offload_gb": "0", "swap_space_bytes": "4294967296", "num_cpu_blocks": "9362"})
        return v
    v.update({
        "cpu_kvcache_space_bytes": "None", "cpu_offload_gb": "0.0", "kv_sharing_fast_prefill": "False",
        "mamba_cache_dtype": "auto", "mamba_page_size_padded": "None",
        "mamba_ssm_cache_dtype": "float32" if era.key == "0.32" else "auto",
        "prefix_caching_hash_algo": "builtin" if era.key in ("0.8", "0.10.1") else "sha256",
        "swap_space": "4.0", "swap_space_bytes": "4294967296.0",
        "kv_cache_memory_bytes": "None" if kv_cache_memory_bytes is None else str(kv_cache_memory_bytes),
        # 0.32-era additions (values as a real 0.32.0 server shows them)
        "mamba_block_size": "None", "kv_offloading_size": "None", "kv_offloading_backend": "native",
        "mamba_cache_mode": "none", "user_specified_block_size": "False",
        "_block_size_resolved": "True", "kv_cache_dtype_skip_layers": "[]",
        "hash_block_size": "None", "prefix_match_unit": "None",
        "kv_cache_size_tokens": str(num_gpu_blocks * block_size),
        "kv_cache_max_concurrency": repr(round(num_gpu_blocks * block_size / max(1, max_model_len), 2)),
        "skip_page_size_padded": "None", "replayssm_buffer_len": "16", "use_replayssm": "False",
        "kv_cache_layout": "None", "prefix_cache_retention_interval": "0",
        "use_kda_recoverssm": "False", "enable_mamba_shared_prefix_checkpoint": "False",
        "effective_attention_block_size": str(block_size), "swa_bounded_replay": "True",
        "cache_hit_alignment_tokens": "None",
    })
    return v
