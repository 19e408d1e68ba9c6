"""Where targets come from. Every source implements `Source`; `Discovery` merges them.

A source is asked for its current targets at the start of each scrape cycle, so targets come and
go without a restart. Sources that read files or APIs keep their last good list when a read
fails, and report the failure through `errors()`.
"""
from __future__ import annotations

import zlib
from typing import Iterable, Protocol

from exporter.config import Config, TargetSpec


class Source(Protocol):
    name: str

    def targets(self) -> list[TargetSpec]:
        """The current targets (cheap to call every cycle)."""
        ...

    def close(self) -> None:
        ...


def shard_of(key: str, count: int) -> int:
    """Stable owner of a target among `count` replicas (a hash of the target key, mod count),
    the same on every replica and across restarts, as Prometheus' `hashmod` relabelling does."""
    return zlib.crc32(key.encode()) % count


def apply_defaults(spec: TargetSpec, defaults: TargetSpec | None) -> TargetSpec:
    if defaults is None:
        return spec
    fill = {k: v for k, v in defaults.model_dump(exclude={"url", "name", "source", "labels"}).items()
            if v is not None and getattr(spec, k) is None}
    return spec.model_copy(update=fill) if fill else spec


class Discovery:
    """All configured sources, merged; the first source to name a URL wins."""

    def __init__(self, sources: Iterable[Source], *, defaults: TargetSpec | None = None,
                 shard_index: int = 0, shard_count: int = 1) -> None:
        self.sources = list(sources)
        self.defaults = defaults
        self.shard_index, self.shard_count = shard_index, shard_count

    def targets(self) -> dict[str, TargetSpec]:
        out: dict[str, TargetSpec] = {}
        for source in self.sources:
            for spec in source.targets():
                if spec.url in out:
                    continue
                if self.shard_count > 1 and shard_of(spec.url, self.shard_count) != self.shard_index:
                    continue
                out[spec.url] = apply_defaults(spec, self.defaults)
        return out

    def close(self) -> None:
        for source in self.sources:
            source.close()


class StaticSource:
    name = "static"

    def __init__(self, specs: list[TargetSpec]) -> None:
        self._specs = list(specs)

    def targets(self) -> list[TargetSpec]:
        return self._specs

    def close(self) -> None:
        pass


def build_discovery(cfg: Config, *, on_error=None) -> Discovery:
    from exporter.discovery.file_sd import FileSDSource

    sources: list[Source] = [StaticSource(cfg.targets)]
    if cfg.file_sd:
        sources.append(FileSDSource(cfg.file_sd, refresh=cfg.file_sd_refresh, on_error=on_error))
    if cfg.kubernetes is not None:
        from exporter.discovery.kubernetes import KubernetesSource

        sources.append(KubernetesSource(cfg.kubernetes, on_error=on_error))
    return Discovery(sources, defaults=cfg.defaults, shard_index=cfg.shard.index, shard_count=cfg.shard.count)
