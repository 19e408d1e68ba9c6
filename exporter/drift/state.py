"""Persistence of the daemon's drift state (windows and stable findings) in `state_dir`.

Why: a restart (deploy, crash, node drain) must not forget a 10-minute window or re-raise every
finding after its minimum duration again. The state is one JSON document, versioned, written
entry by entry (bounded memory, in steps a daemon can spread) and atomically (temp file in the same directory, fsync, rename, fsync of the directory) so a crash
mid-write leaves the previous file intact. A file that cannot be read, does not parse, or has
another format version is reported (log + `vllm_drift_state_errors_total{operation}`) and set
aside as `<name>.corrupt-<unix time>`; the daemon then starts fresh. Never fatal.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import structlog

log = structlog.get_logger("vllm_drift")

STATE_VERSION = 1
STATE_FILE = "drift-state.json"


class StateStore:
    """Load and save one JSON state document; counts failures by operation."""

    def __init__(self, state_dir: str | os.PathLike, *, name: str = STATE_FILE,
                 clock: Callable[[], float] = time.time) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / name
        self.errors: dict[str, float] = {}
        self.clock = clock
        self.last_save: float | None = None
        self.last_result = False         # whether the last save (or `saving`) wrote the file

    def error(self, operation: str, message: str) -> None:
        self.errors[operation] = self.errors.get(operation, 0.0) + 1.0
        log.error("state file problem", operation=operation, path=str(self.path), error=message)

    def load(self) -> dict[str, Any] | None:
        """The saved document's payload, or None (no file, or a bad one that was set aside)."""
        self.remove_stale_temps()
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            self.error("load", f"cannot read: {exc.strerror or exc}")
            return None
        try:
            doc = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:   # RecursionError: nested too deep
            self.error("load", f"not valid JSON: {exc}")
            self.set_aside()
            return None
        if not isinstance(doc, dict) or doc.get("format") != "vllm-drift-state":
            self.error("load", "not a vllm-drift state file")
            self.set_aside()
            return None
        if doc.get("version") != STATE_VERSION:
            self.error("load", f"state format version {doc.get('version')!r}, this build reads "
                                f"{STATE_VERSION}")
            self.set_aside()
            return None
        payload = doc.get("state")
        if not isinstance(payload, dict):
            self.error("load", "state file has no state object")
            self.set_aside()
            return None
        log.info("state loaded", path=str(self.path), saved_at=doc.get("saved_at"))
        return payload

    def remove_stale_temps(self) -> int:
        """Delete temp files a killed writer left behind (`.<name>.*.tmp`). Called at start-up,
        when this process is the directory's only writer; without it every crash mid-save would
        leave a state-sized file in the volume for good."""
        removed = 0
        try:
            stale = list(self.dir.glob(f".{self.path.name}.*.tmp"))
        except OSError:
            return 0
        for p in stale:
            try:
                p.unlink()
                removed += 1
            except OSError:
                pass
        if removed:
            log.info("removed temp files of an interrupted save", path=str(self.dir), count=removed)
        return removed

    def set_aside(self) -> Path | None:
        dest = self.path.with_name(f"{self.path.name}.corrupt-{int(self.clock())}")
        try:
            os.replace(self.path, dest)
        except OSError as exc:
            self.error("set_aside", f"cannot rename to {dest.name}: {exc.strerror or exc}")
            return None
        log.warning("state file set aside", path=str(dest))
        return dest

    def save(self, state: dict[str, Any]) -> bool:
        """Write atomically; False (and counted) on failure."""
        steps = self.saving(state)
        for _ in steps:
            pass
        return self.last_result

    def saving(self, state: dict[str, Any], *, step: int = 200) -> Iterator[None]:
        """`save` in steps: a generator that writes the document and yields after every `step`
        entries of a `Streamed` value, so that a daemon can let other work run between steps
        (`Daemon.save_state_spread`). Values are JSON-encoded one entry at a time straight to
        the temp file: memory holds one window's document, not the whole state's (13 MB of
        JSON per 1,000 targets with full windows, and several times that as objects). The
        outcome is in `last_result`; the file on disk changes only when all went well."""
        self.last_result = False
        now = self.clock()
        tmp = None
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.dir)
            with os.fdopen(fd, "wb") as fh:
                write = fh.write
                write(b'{"format":"vllm-drift-state","version":%d,"saved_at":%s,"state":{'
                      % (STATE_VERSION, _json(now).encode()))
                for i, (name, value) in enumerate(state.items()):
                    write(b"%s%s:" % (b"," if i else b"", _json(name).encode()))
                    if isinstance(value, Streamed):
                        write(b"{")
                        for n, (key, item) in enumerate(value.items):
                            write(b"%s%s:%s" % (b"," if n else b"", _json(key).encode(), _json(item).encode()))
                            if n % step == step - 1:
                                yield
                        write(b"}")
                    else:
                        write(_json(value).encode())
                write(b"}}")
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
            tmp = None
            try:
                dfd = os.open(self.dir, os.O_RDONLY)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
            except OSError:
                pass  # some filesystems cannot fsync a directory; the rename is still atomic
        except (TypeError, ValueError) as exc:
            self.error("save", f"cannot encode state: {exc}")
            return
        except OSError as exc:
            self.error("save", f"cannot write: {exc.strerror or exc}")
            return
        finally:   # also when the caller stops the steps early (a cancelled save)
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
        self.last_save = now
        self.last_result = True


class Streamed:
    """A JSON object of the state written entry by entry: `items` yields (key, value) pairs,
    each value made only when it is written (a window's document, say)."""

    __slots__ = ("items",)

    def __init__(self, items: Iterable[tuple[str, Any]]) -> None:
        self.items = items


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))   # +Inf bucket bounds: Infinity
