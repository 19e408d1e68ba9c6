"""Find a served model's config.json the way vLLM does, and say which source answered.

Why: the calculator and the daemon can only predict for a model whose architecture they know.
vLLM itself loads `config.json` from a local directory or from the Hugging Face Hub (through the
HF cache), so the same sources answer here, in this order:

1. an explicit hint (`--model`, `targets[].model`, a `model` label): a local `config.json` or
   model directory, or a Hub id looked up in 3 and 4;
2. what the server says: `/v1/models` gives the served name and its `root` (vLLM's `--model`
   argument): a local path the sidecar reads when it mounts the same model volume, or a Hub id;
3. the local Hugging Face cache (`HF_HUB_CACHE`, else `HF_HOME/hub`, else ~/.cache/huggingface/hub;
   the `models--org--name/snapshots/<rev>/` layout vLLM hosts have), read without the network;
4. the Hub through `huggingface_hub` (config.json, then the safetensors headers for the exact
   weight bytes), with a timeout, the token from the environment (HF_TOKEN), the download kept in
   the HF cache, and off when HF_HUB_OFFLINE=1 or `huggingface.offline: true`;
5. the shipped catalog last, by name (a quantized or renamed variant of a catalog model); a match
   by name says so in the notes, since the architecture is assumed. An *exact* catalog id or alias
   answers between 3 and 4, so models the catalog knows never wait on the network (the HF cache,
   holding the checkpoint's own config and weights, still wins).

The seam the daemon calls: `resolve_model(hint, served_name, root, settings=...)` returns a
`ResolvedModel` (arch, source, notes) or raises `CatalogError` with one line naming what was
tried. It may do network I/O (step 4), so an event loop calls `resolve_model_nowait` instead (answers
from the local sources at once, runs the Hub lookup in a worker thread, None meanwhile). Results
are cached per (hint, served name, root, settings) for the process, failures for
`settings.retry_seconds`.
"""
from __future__ import annotations

import json
import os
import re
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from exporter.errors import CatalogError, InputError
from exporter.model import weights as weights_mod
from exporter.model.architectures import ModelArch, arch_from_config, catalog_lookup
from exporter.model.architectures import resolve_model as catalog_resolve

DEFAULT_ENDPOINT = "https://huggingface.co"
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
_TRUE = {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class HubSettings:
    """Where and whether to look for configs. None fields fall back to the environment
    (HF_HUB_OFFLINE, HF_ENDPOINT, HF_HUB_CACHE / HF_HOME) at call time, as huggingface_hub does."""

    offline: bool | None = None
    endpoint: str | None = None
    timeout: float = 10.0
    cache_dir: str | None = None
    weights: bool = True             # read safetensors headers for exact weight bytes
    retry_seconds: float = 300.0     # how long a failed resolution is remembered

    def is_offline(self) -> bool:
        if self.offline is not None:
            return self.offline
        return any(os.environ.get(k, "").strip().lower() in _TRUE
                   for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))

    def hub_endpoint(self) -> str:
        return (self.endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")

    def hub_cache(self) -> Path:
        if self.cache_dir:
            return Path(self.cache_dir).expanduser()
        if os.environ.get("HF_HUB_CACHE"):
            return Path(os.environ["HF_HUB_CACHE"]).expanduser()
        home = os.environ.get("HF_HOME") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface")
        return Path(home).expanduser() / "hub"

    @classmethod
    def from_config(cls, section: Any) -> "HubSettings":
        """From the config file's `huggingface:` section (exporter.config.HuggingFaceConfig)."""
        if section is None:
            return cls()
        return cls(offline=section.offline, endpoint=section.endpoint, timeout=section.timeout,
                   cache_dir=section.cache_dir, weights=section.weights)


@dataclass(frozen=True)
class ResolvedModel:
    """A model's architecture and where it came from.

    source: "local" (a directory or config.json on disk), "hf-cache", "hub" or "catalog";
    via: which input named it, "hint", "root" (/v1/models root) or "served_name"."""

    arch: ModelArch
    source: str
    via: str
    name: str
    notes: tuple[str, ...] = field(default=())

    def describe(self) -> str:
        return f"{self.source} (via {self.via}: {self.name})"

    def as_dict(self) -> dict[str, Any]:
        w = self.arch.weights
        return {"name": self.name, "source": self.source, "via": self.via,
                "config": self.arch.source, "model_type": self.arch.model_type,
                "quantization": self.arch.quantization,
                "checkpoint_bytes": w.total_bytes if w else None,
                "notes": list(self.notes)}


# ---- one source at a time -------------------------------------------------------------------

def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: config.json is not a JSON object")
    return data


QUANT_COMPANION = "hf_quant_config.json"


def with_quant_companion(cfg: dict[str, Any],
                         read_companion: Callable[[], dict[str, Any] | None]) -> dict[str, Any]:
    """config.json with ModelOpt's separate quantization file applied as vLLM applies it: ModelOpt
    0.29 and before saved the quantization config in `hf_quant_config.json` beside config.json,
    and vLLM reads that file as the `quantization_config` when config.json has none
    (vllm/transformers_utils/config.py). nvidia/*-NVFP4 and *-FP8 checkpoints of that era carry
    only this file, so without it their FP4 experts would be counted at BF16. `read_companion`
    (a disk read or a Hub download) is called only when config.json has no quantization_config."""
    if cfg.get("quantization_config") is not None:
        return cfg
    companion = read_companion()
    return {**cfg, "quantization_config": companion} if isinstance(companion, dict) else cfg


def _companion_beside(config_path: Path) -> dict[str, Any] | None:
    path = config_path.parent / QUANT_COMPANION
    return _read_json(path) if path.is_file() else None


def _from_config_file(path: Path, name: str, *, settings: HubSettings,
                      notes: list[str]) -> ModelArch:
    """Arch from a config.json on disk (with the hf_quant_config.json beside it, if any);
    exact weights from the safetensors beside it."""
    cfg = with_quant_companion(_read_json(path), lambda: _companion_beside(path))
    arch = arch_from_config(cfg, name=name, where=str(path))
    if settings.weights:
        try:
            info = weights_mod.from_local_dir(path.parent, num_layers=arch.num_layers)
        except (OSError, ValueError) as exc:
            notes.append(f"safetensors headers unreadable ({exc}); weight bytes from config fields")
            info = None
        if info is not None:
            arch = _with_weights(arch, info)
    return arch


def _with_weights(arch: ModelArch, info: weights_mod.WeightInfo) -> ModelArch:
    extra = info.tower_params or arch.extra_params
    return replace(arch, weights=info, extra_params=extra)


def _is_path(name: str) -> bool:
    return (name.startswith(("/", "./", "../", "~")) or name.endswith(".json")
            or os.path.exists(os.path.expanduser(name)))


def _try_local(name: str, settings: HubSettings, notes: list[str], tried: list[str]) -> ModelArch | None:
    p = Path(os.path.expanduser(name))
    cfg = p / "config.json" if p.is_dir() else p
    if not cfg.is_file():
        tried.append(f"no config.json at {cfg}")
        return None
    return _from_config_file(cfg, name, settings=settings, notes=notes)


def _try_cache(repo_id: str, settings: HubSettings, notes: list[str], tried: list[str]) -> ModelArch | None:
    cache = settings.hub_cache()
    # the cache keeps a repository under models--{org}--{name}; without that folder there is
    # nothing to look up, and huggingface_hub (with httpx under it, ~0.1 s) need not load
    if not (cache / f"models--{repo_id.replace('/', '--')}").is_dir():
        tried.append(f"not in HF cache at {cache}")
        return None
    from huggingface_hub import try_to_load_from_cache
    try:
        hit = try_to_load_from_cache(repo_id, "config.json", cache_dir=str(cache))
    except Exception as exc:  # huggingface_hub validation errors (a name that is not a repo id)
        tried.append(f"not a Hub id ({exc.__class__.__name__})")
        return None
    if not isinstance(hit, str):
        tried.append(f"not in HF cache at {cache}")
        return None
    return _from_config_file(Path(hit), repo_id, settings=settings, notes=notes)


def _try_hub(repo_id: str, settings: HubSettings, notes: list[str], tried: list[str]) -> ModelArch | None:
    if settings.is_offline():
        tried.append("hub offline")
        return None
    from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_download, hf_hub_url
    from huggingface_hub.utils import disable_progress_bars
    disable_progress_bars()   # huggingface_hub's download bars would break one-line CLI/daemon output
    endpoint = settings.hub_endpoint()
    try:
        # one HEAD without retries first: hf_hub_download retries unreachable hosts five times
        # with backoff (~25 s), too long for a daemon's resolution or a CLI answer
        get_hf_file_metadata(hf_hub_url(repo_id, "config.json", endpoint=endpoint),
                             timeout=settings.timeout)
        path = hf_hub_download(repo_id, "config.json", cache_dir=str(settings.hub_cache()),
                               endpoint=endpoint, etag_timeout=settings.timeout)
    except Exception as exc:  # not found, gated, unreachable, timed out: one line, keep going
        tried.append(f"hub {endpoint}: {_short(exc)}")
        return None
    cfg = with_quant_companion(_read_json(Path(path)), lambda: _hub_companion(repo_id, settings, notes))
    arch = arch_from_config(cfg, name=repo_id, where=f"{endpoint}/{repo_id}/config.json")
    info = None
    if settings.weights:
        # the shards may already be in the cache (a host that ran vLLM); else the Hub's headers
        try:
            info = weights_mod.from_local_dir(Path(path).parent, num_layers=arch.num_layers)
        except (OSError, ValueError):
            info = None
        if info is None:
            try:
                info = _hub_weights(HfApi(endpoint=endpoint), repo_id, arch.num_layers, settings)
            except Exception as exc:
                notes.append(f"no safetensors metadata from the hub ({_short(exc)}); "
                             "weight bytes from config fields")
    return _with_weights(arch, info) if info is not None else arch


def _hub_companion(repo_id: str, settings: HubSettings, notes: list[str]) -> dict[str, Any] | None:
    """The repository's hf_quant_config.json, None when it has none (HTTP 404, as for most models)."""
    from huggingface_hub import hf_hub_download
    try:
        path = hf_hub_download(repo_id, QUANT_COMPANION, cache_dir=str(settings.hub_cache()),
                               endpoint=settings.hub_endpoint(), etag_timeout=settings.timeout)
    except Exception as exc:
        if getattr(getattr(exc, "response", None), "status_code", None) != 404:
            notes.append(f"{QUANT_COMPANION} unreadable from the hub ({_short(exc)}); "
                         "quantization from config.json alone")
        return None
    return _read_json(Path(path))


def _hub_weights(api: Any, repo_id: str, num_layers: int, settings: HubSettings) -> weights_mod.WeightInfo:
    """Shard headers by HTTP range reads (`parse_safetensors_file_metadata`), the index kept in
    our HF cache: what `HfApi.get_safetensors_metadata` does, minus its writes to the default cache."""
    from huggingface_hub import hf_hub_download
    try:
        index = hf_hub_download(repo_id, "model.safetensors.index.json", cache_dir=str(settings.hub_cache()),
                                endpoint=settings.hub_endpoint(), etag_timeout=settings.timeout)
        shards = sorted(set((_read_json(Path(index)).get("weight_map") or {}).values()))
    except Exception as exc:
        if getattr(getattr(exc, "response", None), "status_code", None) != 404:
            raise
        shards = ["model.safetensors"]   # a single-file checkpoint
    metas = [api.parse_safetensors_file_metadata(repo_id, f, timeout=settings.timeout) for f in shards]
    return weights_mod.from_hub_metadata(metas, num_layers=num_layers,
                                         where=f"{settings.hub_endpoint()}/{repo_id} safetensors headers")


_HTTP_WHY = {401: "not found or unauthorized (private/gated models need HF_TOKEN)",
             403: "forbidden (gated model: accept its licence and set HF_TOKEN)", 404: "not found"}


def _short(exc: BaseException) -> str:
    """One short clause for an error of huggingface_hub / httpx (no URLs, no newlines)."""
    if exc.__class__.__name__ == "OfflineModeIsEnabled":
        return "offline (HF_HUB_OFFLINE was set when huggingface_hub was loaded)"
    resp = getattr(exc, "response", None)
    code = getattr(resp, "status_code", None)
    if isinstance(code, int):
        return f"HTTP {code} {_HTTP_WHY.get(code, '')}".strip()
    text = " ".join(str(exc).split()) or exc.__class__.__name__
    return f"{exc.__class__.__name__}: {text[:120]}"


def _try_catalog_exact(name: str, notes: list[str]) -> ModelArch | None:
    hit = catalog_lookup(name)
    if hit is None:
        return None
    model_id, alias = hit
    if alias:  # e.g. a base model listed under its Instruct entry: the catalog says they share fields
        notes.append(f"{name!r} is listed in the catalog as an alias of {model_id!r} (same config.json fields)")
    return catalog_resolve(model_id)


def _try_catalog_by_name(name: str, notes: list[str], tried: list[str]) -> ModelArch | None:
    try:
        arch = catalog_resolve(name)
    except InputError as exc:
        _, _, close = str(exc).partition("closest catalog names: ")
        tried.append("not a catalog id" + (f" (closest catalog names: {close})" if close and "see " not in close else ""))
        return None
    m = re.search(r"huggingface\.co/([^/\s]+/[^/\s]+)", arch.source or "")
    entry = m.group(1) if m else (arch.source or arch.name)
    notes.append(f"{name!r} matched by name to catalog entry {entry!r}: architecture assumed "
                 f"identical (give a config.json, the HF cache or hub access for the model's own)")
    return arch


# ---- the chain -------------------------------------------------------------------------------

_cache: dict[tuple, tuple[float, ResolvedModel | CatalogError]] = {}
_lock = threading.Lock()


def clear_cache() -> None:
    with _lock:
        _cache.clear()


def resolve_model(hint: str | Sequence[str | None] | None, served_name: str | None = None, root: str | None = None, *,
                  settings: HubSettings | None = None) -> ResolvedModel:
    """The first source that knows the model, in vLLM's order (module docstring).
    Raises CatalogError: `no config for X: not a catalog id, not in HF cache at ..., hub offline`."""
    settings = settings or HubSettings()
    key = _key(hint, served_name, root, settings)
    now = time.monotonic()
    hit = _valid(key, settings)
    if hit is not None:
        if isinstance(hit, CatalogError):
            raise hit
        return hit
    try:
        result: ResolvedModel | CatalogError = _resolve(hint, served_name, root, settings)
    except CatalogError as exc:
        result = exc
    with _lock:
        if len(_cache) > 4096:
            _cache.clear()
        _cache[key] = (now, result)
    if isinstance(result, CatalogError):
        raise result
    return result


_pool: ThreadPoolExecutor | None = None
_pending: dict[tuple, Future] = {}


def resolve_model_nowait(hint: str | Sequence[str | None] | None, served_name: str | None = None, root: str | None = None, *,
                         settings: HubSettings | None = None) -> ResolvedModel | None:
    """For an event loop (the daemon's evaluation): answers at once from the sources that need no
    network (local paths, the HF cache, exact catalog ids), else starts the full chain in a worker
    thread and returns None until it has finished (call again at the next evaluation). Raises
    CatalogError once every source failed (remembered for `settings.retry_seconds`)."""
    global _pool
    settings = settings or HubSettings()
    key = _key(hint, served_name, root, settings)
    with _lock:
        fut = _pending.get(key)
    if _valid(key, settings) or settings.is_offline():
        return resolve_model(hint, served_name, root, settings=settings)  # no network
    if fut is None:
        try:
            return _resolve(hint, served_name, root, replace(settings, offline=True), by_name=False)
        except CatalogError:
            pass
        with _lock:
            if _pool is None:
                _pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="model-resolve")
            fut = _pending.setdefault(key, _pool.submit(resolve_model, hint, served_name, root,
                                                        settings=settings))
    if not fut.done():
        return None
    with _lock:
        _pending.pop(key, None)
    return fut.result()   # the same ResolvedModel / CatalogError resolve_model cached


def _valid(key: tuple, settings: HubSettings) -> ResolvedModel | CatalogError | None:
    """A cached answer: a success, or a failure younger than `settings.retry_seconds`."""
    with _lock:
        hit = _cache.get(key)
    if hit is None:
        return None
    if isinstance(hit[1], ResolvedModel) or time.monotonic() - hit[0] < settings.retry_seconds:
        return hit[1]
    return None


def _key(hint: Any, served_name: str | None, root: str | None, settings: HubSettings) -> tuple:
    return (_hints(hint), served_name, root, settings, settings.is_offline(), str(settings.hub_cache()),
            settings.hub_endpoint())


def _hints(hint: Any) -> tuple[str, ...]:
    """One hint or several in order of preference (config's targets[].model, a `model` label)."""
    items = [hint] if isinstance(hint, str) or hint is None else list(hint)
    return tuple(h.strip() for h in items if isinstance(h, str) and h.strip())


def _resolve(hint: Any, served_name: str | None, root: str | None,
             settings: HubSettings, *, by_name: bool = True) -> ResolvedModel:
    names = [("hint", h) for h in _hints(hint)]
    names += [(v, n.strip()) for v, n in (("root", root), ("served_name", served_name))
              if isinstance(n, str) and n.strip()]
    names = [(v, n) for i, (v, n) in enumerate(names) if n not in [m for _, m in names[:i]]]
    if not names:
        raise CatalogError("no model name to resolve: no hint, no served name, no /v1/models root")
    tried: dict[str, list[str]] = {n: [] for _, n in names}
    for via, name in names:
        notes: list[str] = []
        t = tried[name]
        if _is_path(name):
            arch = _try_local(name, settings, notes, t)
            if arch is not None:
                return _done(arch, "local", via, name, notes)
            continue
        if not _HUB_ID.match(name):
            t.append("not a Hub id")
            continue
        arch = _try_cache(name, settings, notes, t)
        if arch is not None:
            return _done(arch, "hf-cache", via, name, notes)
        # an exact catalog id answers before the network: known models need no Hub round trip
        arch = _try_catalog_exact(name, notes)
        if arch is not None:
            return _done(arch, "catalog", via, name, notes)
        arch = _try_hub(name, settings, notes, t)
        if arch is not None:
            return _done(arch, "hub", via, name, notes)
    for via, name in names:  # 5. the shipped catalog, last
        if _is_path(name) or not by_name:
            continue
        notes = []
        arch = _try_catalog_by_name(name, notes, tried[name])
        if arch is not None:
            return _done(arch, "catalog", via, name, notes)
    for n in tried:  # the catalog first in the message, then the sources in the order tried
        tried[n].sort(key=lambda t: not t.startswith("not a catalog id"))
    what = "; ".join(f"{n} ({', '.join(dict.fromkeys(tried[n]))})" if len(names) > 1
                     else ", ".join(dict.fromkeys(tried[n])) for _, n in names)
    label = names[0][1] if len(names) == 1 else " / ".join(n for _, n in names)
    raise CatalogError(f"no config for {label}: {what}")


def _done(arch: ModelArch, source: str, via: str, name: str, notes: list[str]) -> ResolvedModel:
    # how a config.json was read matters for a model's own config, not for a curated catalog entry
    all_notes = [*(arch.notes if source != "catalog" else ()), *notes]
    w = arch.weights
    if w is not None:
        all_notes.append(f"weight bytes from safetensors headers ({w.files} file(s), "
                         f"{w.total_bytes / 2**30:.2f} GiB stored)")
    return ResolvedModel(arch=replace(arch, notes=tuple(all_notes)), source=source, via=via, name=name,
                         notes=tuple(all_notes))
