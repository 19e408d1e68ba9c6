"""`vllm-drift demo`: the product in one command, without a GPU. Starts one simulated vLLM server
per scenario on loopback (each with a known misconfiguration, plus healthy ones), runs the
drift daemon against them with short windows, and shows a live table: each server's URL, the
finding its scenario injects with a countdown to the time the scenario promises it by
(`detect_within` in its YAML), what the daemon reports at warning or above, and a verdict. Stops
on Ctrl-C or after `--duration` seconds (counted from the command's start).

The daemon gets the hints a real deployment would give it in its config (GPU, TP, model), since
those cannot be read from `/metrics`.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from exporter.errors import InputError

WIDTH = 100                    # the table fits this many columns
DEFAULT_PROMISE_S = 60.0       # a scenario without `detect_within`
LOUD = ("warning", "critical")
STOP_MARGIN_S = 0.5            # --duration: the daemon stops this much early, to drain and exit


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "demo", help="simulated fleet + drift daemon on loopback, with a live findings table",
        description=__doc__.split("\n\n")[0])
    p.add_argument("--scenarios", default=None,
                   help="comma-separated scenario names or files (default: all built-ins)")
    p.add_argument("--listen", default="127.0.0.1:9877",
                   help="daemon address (default 127.0.0.1:9877; port 0 = any free port)")
    p.add_argument("--port", type=int, default=0,
                   help="first port of the simulated servers (default 0 = free ports)")
    p.add_argument("--vllm-version", default=None, help="exposition era of the simulated servers")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--speed", type=float, default=None, help="sim seconds per wall second")
    p.add_argument("--window", type=float, default=60.0, help="evaluation window, s (default 60)")
    p.add_argument("--refresh", type=float, default=5.0,
                   help="findings poll, s (default 5; the countdown ticks every second)")
    p.add_argument("--duration", type=float, default=None, metavar="S",
                   help="stop S seconds after the start (default: run until Ctrl-C)")
    p.set_defaults(func=run)


def _config_text(urls: list[str], states, listen: str, window: float) -> str:
    lines = [f"listen: {listen}",
             "scrape: {interval: 2s, timeout: 2s}",
             f"evaluation: {{interval: 5s, window: {int(window)}s}}",
             "targets:"]
    for url, st in zip(urls, states):
        sc = st.scenario
        lines += [f"  - url: {url}", f"    name: {sc.name}", f"    gpu: {sc.gpu}", f"    tp: {sc.tp}",
                  f"    model: {sc.model}",
                  f"    max_num_seqs: {st.engine.cfg.max_num_seqs}",
                  f"    max_num_batched_tokens: {st.engine.cfg.max_num_batched_tokens}"]
    return "\n".join(lines) + "\n"


@dataclass
class Row:
    """One simulated server as the table shows it, with what was seen so far."""

    name: str
    url: str
    truth: tuple[str, ...]
    acceptable: tuple[str, ...]
    promise_s: float
    loud: dict[str, str] = field(default_factory=dict)        # finding -> severity, latest poll
    first_seen: dict[str, float] = field(default_factory=dict)  # finding -> s after start
    evaluated: bool = False

    def update(self, target: dict | None, elapsed: float) -> None:
        if target is None:
            return
        self.evaluated = self.evaluated or bool(target.get("model_name"))
        self.loud = {f["finding"]: f["severity"] for f in target.get("findings") or []
                     if str(f.get("severity", "")).lower() in LOUD}
        for name in self.loud:
            self.first_seen.setdefault(name, round(elapsed, 1))

    @property
    def found_at(self) -> float | None:
        """Seconds after the start at which every injected finding had shown."""
        if not self.truth or any(t not in self.first_seen for t in self.truth):
            return None
        return max(self.first_seen[t] for t in self.truth)

    @property
    def false_alarms(self) -> list[str]:
        ok = set(self.truth) | set(self.acceptable)
        return sorted(f for f in self.first_seen if f not in ok)

    def verdict(self, elapsed: float) -> Text:
        left = self.promise_s - elapsed
        if self.truth:
            t = self.found_at
            if t is not None:
                return Text(f"found at {t:.0f} s", style="green" if t <= self.promise_s else "yellow")
            if left > 0:
                return Text(f"due in {_mmss(left)}", style="cyan")
            return Text(f"late by {_mmss(-left)}", style="bold red")
        if self.false_alarms:
            return Text("false alarm", style="bold red")
        if left > 0:
            return Text(f"clean, {_mmss(left)} left", style="cyan")
        return Text("healthy", style="green")


def _mmss(s: float) -> str:
    s = max(0, int(round(s)))
    return f"{s} s" if s < 60 else f"{s // 60}:{s % 60:02d}"


def render(rows: list[Row], elapsed: float, *, daemon: str, remaining: float | None,
           width: int = WIDTH) -> Group:
    """The live view: header with the daemon's URLs, then one row per simulated server. At 100
    columns the other findings have their own column; narrower (down to 80) they are listed
    under the injected ones, so no name or URL is ever cut."""
    wide = width >= WIDTH - 1
    stop = "Ctrl-C to stop" if remaining is None else f"stops in {_mmss(remaining)}"
    head = Text.assemble(("vllm-drift demo", "bold"), f" — {elapsed:4.0f} s — {stop}")
    urls = Text(f"daemon: {daemon}/metrics\n        {daemon}/api/v1/findings", style="dim")
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, expand=False,
                  caption="findings at warning or above; red = critical, yellow = warning"
                          + ("" if wide else "; + = also reported"),
                  caption_justify="left")
    table.add_column("scenario / server", width=26, min_width=26, no_wrap=True)
    table.add_column("injected (✓ seen)", width=24, min_width=24)
    if wide:
        table.add_column("also reported", width=22, min_width=22)
    table.add_column("verdict", width=16, min_width=16, no_wrap=True)
    for r in rows:
        who = Text(r.name + "\n", style="bold")
        who.append(r.url, style="dim")
        inj = Text()
        for i, t in enumerate(r.truth or ("none",)):
            if i:
                inj.append("\n")
            mark = "✓ " if t in r.first_seen else "· "
            inj.append(mark + t, style=_sev_style(r.loud.get(t)))
        other = Text()
        extra = [f for f in r.loud if f not in r.truth]
        for i, f in enumerate(extra):
            if i or not wide:
                other.append("\n")
            other.append(("" if wide else "+ ") + f,
                         style=_sev_style(r.loud[f]) if f not in r.acceptable else "dim")
        if wide and not extra:
            other.append("—" if r.evaluated else "(not evaluated yet)", style="dim")
        if wide:
            table.add_row(who, inj, other, r.verdict(elapsed))
        else:
            table.add_row(who, inj + other, r.verdict(elapsed))
    return Group(head, urls, table)


def _sev_style(sev: str | None) -> str:
    return {"critical": "red", "warning": "yellow"}.get(sev or "", "")


def run(args: argparse.Namespace) -> int:
    from exporter import logs
    from exporter.config import build_config
    from exporter.daemon import Daemon
    from exporter.sim.scenario import build, builtin_names, load_scenario
    from exporter.sim.server import Endpoint

    t_start = time.monotonic()
    names = [s.strip() for s in args.scenarios.split(",")] if args.scenarios else builtin_names()
    if not names or not all(names):
        raise InputError("--scenarios: give at least one scenario name")
    if args.window < 5:
        raise InputError(f"--window must be at least 5 s (got {args.window})")
    if args.duration is not None and args.duration <= 0:
        raise InputError(f"--duration must be positive (got {args.duration})")
    if args.refresh <= 0:
        raise InputError(f"--refresh must be positive (got {args.refresh})")
    deadline = None if args.duration is None else t_start + args.duration
    now = time.time()
    states = []
    for i, n in enumerate(names):
        sc = load_scenario(n)
        states.append(build(sc, seed=args.seed + i, version=args.vllm_version, speed=args.speed,
                            start_time=now - sc.warmup_s))
    ports = [0 if args.port == 0 else args.port + i for i in range(len(states))]
    bindings = [("127.0.0.1", p, Endpoint(st)) for p, st in zip(ports, states)]
    logs.configure("console", "warning")
    interactive = sys.stdout.isatty()
    console = Console(width=max(80, min(WIDTH, Console().width)) if interactive else WIDTH,
                      force_terminal=interactive, highlight=False)

    sim = SimThread(bindings, states)
    urls = sim.start()

    async def main() -> None:
        import httpx

        cfg_file = tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="vllm-drift-demo-",
                                               delete=False)
        try:
            cfg_file.write(_config_text(urls, states, args.listen, args.window))
            cfg_file.close()
            cfg = build_config(cfg_file.name)
            daemon = Daemon(cfg, config_path=cfg_file.name)
            port: asyncio.Future = asyncio.get_running_loop().create_future()
            left = None if deadline is None else max(0.1, deadline - time.monotonic() - STOP_MARGIN_S)
            task = asyncio.create_task(daemon.run(duration=left,
                                                  on_listen=lambda p: port.set_result(p)))
            done, _ = await asyncio.wait({task, port}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
            if task in done:
                await task                      # surfaces a listen error
                return
            host = args.listen.rsplit(":", 1)[0]
            base = f"http://{host}:{port.result()}"
            rows = [Row(st.scenario.name, u, tuple(st.scenario.ground_truth),
                        tuple(st.scenario.acceptable),
                        st.scenario.detect_within_s or DEFAULT_PROMISE_S) for u, st in zip(urls, states)]
            by_url = {r.url: r for r in rows}
            console.print("simulated vLLM servers:")
            for r in rows:
                console.print(f"  {r.name:28s} {r.url}/metrics")
            console.print(f"daemon metrics:   {base}/metrics")
            console.print(f"daemon findings:  {base}/api/v1/findings")
            t0 = time.monotonic()

            def view():
                el = time.monotonic() - t0
                rem = None if deadline is None else deadline - time.monotonic()
                return render(rows, el, daemon=base, remaining=rem, width=console.width)

            async def poll(client) -> None:
                try:
                    data = (await client.get(base + "/api/v1/findings")).json()
                except (httpx.HTTPError, ValueError):
                    return
                el = time.monotonic() - t0
                targets = {t.get("target", "").rstrip("/"): t for t in data.get("targets", [])}
                for url, row in by_url.items():
                    row.update(targets.get(url), el)

            async with httpx.AsyncClient(timeout=5.0) as client:
                if interactive:
                    with Live(view(), console=console, refresh_per_second=4, transient=False) as live:
                        next_poll = time.monotonic() + args.refresh
                        while not task.done():
                            await asyncio.wait({task}, timeout=1.0)
                            if time.monotonic() >= next_poll and not task.done():
                                next_poll += args.refresh
                                await poll(client)
                            live.update(view())
                else:
                    while not task.done():
                        await asyncio.wait({task}, timeout=args.refresh)
                        if task.done():
                            break
                        await poll(client)
                        console.print(view())
                        console.print()
            await task
            console.print(summary(rows, time.monotonic() - t_start))
        finally:
            try:
                os.unlink(cfg_file.name)
            except OSError:
                pass

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        return 0
    except OSError as exc:
        print(f"vllm-drift demo: error: {exc}", file=sys.stderr)
        return 1
    finally:
        sim.stop()
    return 0


class SimThread:
    """The simulated servers on their own event loop in a thread, so the daemon's loop holds only
    the daemon's work (its shutdown drains its own jobs, not the servers' open connections)."""

    def __init__(self, bindings, states) -> None:
        self.bindings, self.states = bindings, states
        self.loop = asyncio.new_event_loop()
        self.stop_event: asyncio.Event | None = None
        self.urls: list[str] = []
        self.error: BaseException | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="demo-sim", daemon=True)

    def _main(self) -> None:
        from exporter.sim.server import serve

        asyncio.set_event_loop(self.loop)

        async def go() -> None:
            self.stop_event = asyncio.Event()

            def ready(urls: list[str]) -> None:
                self.urls = urls
                self._ready.set()
            await serve(self.bindings, self.states, tick_s=0.25, stop=self.stop_event, on_ready=ready)
        try:
            self.loop.run_until_complete(go())
        except BaseException as exc:  # noqa: BLE001 -- reported by start()
            self.error = exc
        finally:
            self._ready.set()
            self.loop.close()

    def start(self) -> list[str]:
        self._thread.start()
        self._ready.wait(30)
        if self.error is not None:
            raise OSError(f"simulated servers did not start: {self.error}")
        if not self.urls:
            raise OSError("simulated servers did not start in 30 s")
        return self.urls

    def stop(self) -> None:
        if self._thread.is_alive() and self.stop_event is not None:
            try:
                self.loop.call_soon_threadsafe(self.stop_event.set)
            except RuntimeError:
                pass
            self._thread.join(5)


def summary(rows: list[Row], ran_s: float) -> Text:
    """The closing lines: each scenario's time to its finding against its promise."""
    out = Text(f"stopped after {ran_s:.1f} s\n")
    for r in rows:
        if r.truth:
            t = r.found_at
            said = f"promised within {r.promise_s:.0f} s"
            out.append(f"  {r.name:28s} " + (f"found at {t:.0f} s ({said})" if t is not None
                                             else f"not found yet ({said})") + "\n")
        else:
            out.append(f"  {r.name:28s} " + (f"false alarm: {', '.join(r.false_alarms)}"
                                             if r.false_alarms else "nothing at warning or above")
                       + "\n")
    return out
