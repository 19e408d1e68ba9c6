"""Persistence of the daemon's drift state (windows and stable findings) in `state_dir`.

Why: a restart (deploy, crash, node drain) must not forget a 10-minute window or re-raise every
finding after its minimum duration again. The state is one JSON document, versioned, written
atomically (temp file in the same directory, fsync, rename, fsync of the directory) so a crash
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
from typing import Any, Callable

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
        now = self.clock()
        doc = {"format": "vllm-drift-state", "version": STATE_VERSION, "saved_at": now, "state": state}
        try:
            data = json.dumps(doc, separators=(",", ":")).encode()  # +Inf bucket bounds: Infinity
        except (TypeError, ValueError) as exc:
            self.error("save", f"cannot encode state: {exc}")
            return False
        tmp = None
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.dir)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
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
        except OSError as exc:
            self.error("save", f"cannot write: {exc.strerror or exc}")
            return False
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
        self.last_save = now
        return True
