"""The daemon's configuration: YAML in, one validated, frozen `Config` out.

Validation is pydantic's; this module turns its errors into one line that names the file, the key
path in the form users write it (`targets[3].url`) and what was expected. With no file at all the
defaults make a sidecar for `http://127.0.0.1:8000`.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import yaml
from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, ValidationError, field_validator,
                      model_validator)

from exporter import yamlfile
from exporter.errors import ConfigError, InputError
from exporter.model.architectures import normalize_quantization
from exporter.model.calibrate import Row, read_rows
from exporter.model.gpus import GpuRow

SIDECAR_TARGET = "http://127.0.0.1:8000"
DEFAULT_LISTEN = "0.0.0.0:9877"

_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_duration(value: Any) -> float:
    """`15s`, `2m`, `1h30m`, `250ms` or a bare number of seconds -> seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 15s or 2m")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and value.strip():
        text = value.strip()
        pos, seconds = 0, 0.0
        for m in _DURATION_RE.finditer(text):
            if m.start() != pos:
                break
            seconds += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
            pos = m.end()
        if pos != len(text):
            try:
                seconds = float(text)
            except ValueError:
                raise ValueError(f"expected a duration such as 15s or 2m, got {value!r}") from None
    else:
        raise ValueError(f"expected a duration such as 15s or 2m, got {value!r}")
    if seconds <= 0:
        raise ValueError(f"a duration must be positive, got {value!r}")
    return seconds


def parse_size(value: Any) -> int:
    """`16MiB`, `10MB`, `4096` -> bytes."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as 16MiB")
    if isinstance(value, (int, float)):
        size = int(value)
    elif isinstance(value, str) and (m := _SIZE_RE.match(value)):
        size = int(float(m.group(1)) * _SIZE_UNITS[(m.group(2) or "b").lower()])
    else:
        raise ValueError(f"expected a size such as 16MiB, got {value!r}")
    if size <= 0:
        raise ValueError(f"a size must be positive, got {value!r}")
    return size


def check_url(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("not a URL: expected a string such as http://10.0.0.5:8000")
    parts = urlsplit(value.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not a URL: {value!r} (expected http(s)://host:port)")
    try:
        parts.port
    except ValueError:
        raise ValueError(f"not a URL: {value!r} has a bad port") from None
    return normalise_url(value)


def normalise_url(url: str) -> str:
    """The base URL of a vLLM server as a target name: no trailing slash, no `/metrics`."""
    url = url.strip().rstrip("/")
    return url[: -len("/metrics")] if url.endswith("/metrics") else url


def check_listen(value: Any) -> str:
    if not isinstance(value, str) or ":" not in value:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    host, _, port = value.rpartition(":")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT with a port 0-65535, got {value!r}")
    return value


Duration = Annotated[float, BeforeValidator(parse_duration)]
Size = Annotated[int, BeforeValidator(parse_size)]
URL = Annotated[str, BeforeValidator(check_url)]
Listen = Annotated[str, BeforeValidator(check_listen)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SLO(_Strict):
    ttft_p99: Duration | None = None
    tpot_p99: Duration | None = None


class TargetSpec(_Strict):
    """One vLLM server, with the hints its metrics cannot tell."""

    url: URL
    name: str | None = None          # display name; defaults to the URL
    gpu: str | None = None           # GPU catalog name, e.g. H100-SXM-80GB
    tp: int | None = Field(default=None, ge=1)
    pp: int | None = Field(default=None, ge=1)
    model: str | None = None         # model id or path, when the served name does not say
    quantization: str | None = None
    max_num_seqs: int | None = Field(default=None, ge=1)
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    enforce_eager: bool | None = None   # the server runs --enforce-eager (no CUDA graphs)
    dp: int | None = Field(default=None, ge=1)  # --data-parallel-size (else the engines its /metrics shows)
    expert_parallel: bool | None = None  # --enable-expert-parallel (whole MoE experts per rank)
    async_scheduling: bool | None = None  # --[no-]async-scheduling (unset: the release's default)
    slo: SLO | None = None
    labels: dict[str, str] = Field(default_factory=dict)  # extra discovery labels, kept as hints
    source: str = "static"

    @field_validator("max_num_batched_tokens", mode="before")
    @classmethod
    def _token_count(cls, v: Any) -> Any:
        """As vLLM's flag reads it: `16k` is 16,000, `16K` 16,384."""
        if isinstance(v, str):
            from exporter.discovery.vllm_args import token_count   # here: discovery imports config
            try:
                return token_count(v)
            except ValueError as exc:
                raise ValueError(f"max_num_batched_tokens: {exc}") from None
        return v

    @field_validator("quantization")
    @classmethod
    def _known_scheme(cls, v: str | None) -> str | None:
        """A scheme the calculator knows (as `calc --quantization` takes it), kept as written."""
        try:
            normalize_quantization(v)
        except InputError as exc:
            raise ValueError(str(exc)) from None
        return v

    @property
    def key(self) -> str:
        return self.url


class ScrapeConfig(_Strict):
    interval: Duration = 15.0
    timeout: Duration = 5.0
    max_body_bytes: Size = 16 * 2**20
    concurrency: int = Field(default=64, ge=1, le=4096)
    metadata_refresh: Duration = 300.0   # how often /v1/models and /version are re-read (+-25 % per target, spread)
    jitter: Duration = 1.0

    @model_validator(mode="after")
    def _timeout_fits(self) -> "ScrapeConfig":
        if self.timeout > self.interval:
            raise ValueError(f"timeout ({self.timeout:g}s) must not exceed interval ({self.interval:g}s)")
        return self


class EvaluationConfig(_Strict):
    interval: Duration = 30.0
    window: Duration = 600.0

    @model_validator(mode="after")
    def _window_fits(self) -> "EvaluationConfig":
        if self.window < self.interval:
            raise ValueError(f"window ({self.window:g}s) must be at least the interval ({self.interval:g}s)")
        return self


class KubernetesConfig(_Strict):
    namespace: str | None = None       # None: all namespaces the service account may list
    label_selector: str = ""
    port: int = Field(default=8000, ge=1, le=65535)
    scheme: str = "http"
    kubeconfig: str | None = None

    @model_validator(mode="after")
    def _client_installed(self) -> "KubernetesConfig":
        from exporter.discovery.kubernetes import require_client   # lazy: it imports this module

        require_client()   # the client is the optional [kubernetes] extra
        return self


class ShardConfig(_Strict):
    index: int = Field(default=0, ge=0)
    count: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _index_in_range(self) -> "ShardConfig":
        if self.index >= self.count:
            raise ValueError(f"index ({self.index}) must be below count ({self.count})")
        return self


class PrometheusConfig(_Strict):
    """Query mode: read the vLLM series from a Prometheus-compatible HTTP API (Prometheus, Thanos,
    Mimir) that already scrapes the fleet, instead of scraping the targets."""

    url: URL                                   # base URL of the query API (without /api/v1)
    selector: str = '{job="vllm"}'             # PromQL matchers naming the vLLM targets' series
    target_label: str = "instance"             # the label that tells targets apart
    timeout: Duration = 10.0
    concurrency: int = Field(default=8, ge=1, le=256)
    backfill: bool = True                      # fill a new target's window from history at once
    target_metadata: bool = False              # also read /version and /v1/models from the targets
    federate: bool = False                     # read through /federate (Prometheus only): cheaper
    bearer_token_file: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)   # e.g. X-Scope-OrgID for Mimir

    @field_validator("selector")
    @classmethod
    def _braced(cls, v: str) -> str:
        v = v.strip()
        if not (v.startswith("{") and v.endswith("}")):
            raise ValueError(f"expected label matchers in braces such as {{job=\"vllm\"}}, got {v!r}")
        return v


class DCGMConfig(_Strict):
    """GPU telemetry from NVIDIA DCGM exporters (or from Prometheus in query mode)."""

    urls: list[URL] = Field(default_factory=list)   # DCGM exporter endpoints, e.g. http://node:9400
    from_prometheus: bool = False                    # read DCGM_FI_* through `prometheus:`
    selector: str = '{job="dcgm-exporter"}'          # when from_prometheus
    interval: Duration = 60.0


class HuggingFaceConfig(_Strict):
    """Where a served model's config.json is looked up (exporter/model/resolve.py)."""

    offline: bool | None = None        # None: follow HF_HUB_OFFLINE; true: HF cache + catalog only
    endpoint: URL | None = None        # None: HF_ENDPOINT or https://huggingface.co
    timeout: Duration = 10.0           # per Hub request
    cache_dir: str | None = None       # None: HF_HUB_CACHE, else HF_HOME/hub
    weights: bool = True               # read safetensors headers for exact weight bytes


_BCRYPT = re.compile(r"\$2[aby]\$\d\d\$[./A-Za-z0-9]{53}")


class WebConfig(_Strict):
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    client_ca_file: str | None = None
    basic_auth_users: dict[str, str] = Field(default_factory=dict)   # user -> bcrypt hash
    open_health: bool = True          # leave /-/healthy open when auth is on

    @field_validator("basic_auth_users")
    @classmethod
    def _bcrypt_hashes(cls, v: dict[str, str]) -> dict[str, str]:
        """A plaintext password here would lock everyone out at run time; refuse it at load,
        without echoing the value (it may be a real password)."""
        for user, hashed in v.items():
            if not _BCRYPT.fullmatch(hashed):
                raise ValueError(f"the value for user {user!r} is not a bcrypt hash ($2b$..., 60 characters; "
                                 "make one with `htpasswd -nbBC 12 USER PASSWORD`); the value is not shown")
        return v

    @model_validator(mode="after")
    def _tls_pair(self) -> "WebConfig":
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("tls_cert_file and tls_key_file go together")
        if self.client_ca_file and not self.tls_cert_file:
            raise ValueError("client_ca_file needs tls_cert_file and tls_key_file")
        return self


class Config(_Strict):
    listen: Listen = DEFAULT_LISTEN
    scrape: ScrapeConfig = ScrapeConfig()
    evaluation: EvaluationConfig = EvaluationConfig()
    targets: list[TargetSpec] = Field(default_factory=list)
    file_sd: list[str] = Field(default_factory=list)
    file_sd_refresh: Duration = 30.0
    kubernetes: KubernetesConfig | None = None
    shard: ShardConfig = ShardConfig()
    prometheus: PrometheusConfig | None = None
    dcgm: DCGMConfig | None = None
    prices: dict[str, float] = Field(default_factory=dict)
    gpus: list[GpuRow] = Field(default_factory=list)   # GPU rows added to / overriding the catalog
    defaults: TargetSpec | None = None   # hints applied to every target lacking its own
    slo: SLO = SLO()
    state_dir: str | None = None
    web: WebConfig = WebConfig()
    huggingface: HuggingFaceConfig = HuggingFaceConfig()
    # measured runs (the CSV `sweep --out` writes) that seed the step-time calibration
    calibration_files: list[str] = Field(default_factory=list)
    _calibration_rows: list[Row] = PrivateAttr(default_factory=list)

    @model_validator(mode="after")
    def _read_calibration(self) -> "Config":
        try:
            self._calibration_rows = read_rows(self.calibration_files)
        except InputError as exc:
            raise ValueError(str(exc)) from None
        return self

    @property
    def calibration_rows(self) -> list[Row]:
        """The rows of `calibration_files`, read once when the config was loaded."""
        return self._calibration_rows

    @field_validator("prices")
    @classmethod
    def _positive_prices(cls, v: dict[str, float]) -> dict[str, float]:
        for name, price in v.items():
            if price < 0:
                raise ValueError(f"price for {name} must not be negative")
        return v

    @model_validator(mode="after")
    def _unique_targets(self) -> "Config":
        seen: set[str] = set()
        for i, t in enumerate(self.targets):
            if t.url in seen:
                raise ValueError(f"targets[{i}].url: {t.url} is listed twice")
            seen.add(t.url)
        return self

    def has_discovery(self) -> bool:
        return bool(self.targets or self.file_sd or self.kubernetes or self.prometheus)


def _key_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not str(part).startswith("function-"):
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def describe_error(err: dict[str, Any]) -> str:
    """One pydantic error in the words the config's messages use."""
    kind, msg = err["type"], err["msg"]
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    return msg


def config_from_dict(data: Any, *, source: str = "<config>") -> Config:
    """Validate a loaded YAML document; errors name the source and the key path."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of keys, got {type(data).__name__}")
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        errs = exc.errors()
        first = errs[0]
        more = f" (and {len(errs) - 1} more problem{'s' if len(errs) > 2 else ''})" if len(errs) > 1 else ""
        raise ConfigError(f"{source}: {_key_path(first['loc'])}: {describe_error(first)}{more}") from None


def load_config(path: str | Path) -> Config:
    """Read and validate a YAML config file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    try:
        data = yamlfile.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}:{where}: not valid YAML: {problem}") from None
    return config_from_dict(data, source=str(path))


def build_config(path: str | None, *, targets: list[str] | None = None, listen: str | None = None) -> Config:
    """The config `serve` runs with: the file (if any), then `--target`/`--listen` on top; with
    neither a file nor targets, the sidecar default."""
    base = load_config(path) if path else Config()
    updates: dict[str, Any] = {}
    if targets:
        specs = list(base.targets)
        known = {t.url for t in specs}
        for i, url in enumerate(targets):
            try:
                spec = TargetSpec(url=url, source="flag")
            except ValidationError as exc:
                raise ConfigError(f"--target #{i + 1}: {describe_error(exc.errors()[0])}") from None
            if spec.url not in known:
                specs.append(spec)
                known.add(spec.url)
        updates["targets"] = specs
    if listen is not None:
        try:
            check_listen(listen)
        except ValueError as exc:
            raise ConfigError(f"--listen: {exc}") from None
        updates["listen"] = listen
    cfg = base.model_copy(update=updates)
    if not cfg.has_discovery():
        cfg = cfg.model_copy(update={"targets": [TargetSpec(url=SIDECAR_TARGET, source="sidecar")]})
    return cfg
