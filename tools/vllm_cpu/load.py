"""Bounded streaming-completions load generator for a vLLM server on loopback.

Why: the captures in ``tests/fixtures/vllm-cpu`` must show a real engine under a known, repeatable
load. Prompts are sent as token-id lists so their length is exact (no tokenizer guesswork);
``ignore_eos`` plus ``min_tokens`` force the output length. Every run is bounded by a request
count *and* a wall-clock duration, and only loopback addresses are accepted.

Usage: python load.py --base-url http://127.0.0.1:8011 --model tiny-llama --concurrency 8
       --prompt-tokens 256 --output-tokens 128 --count 400 --duration 60 [--shared-prefix-tokens N]
       [--repetitive] [--no-stream] [--seed 0]
Prints one JSON summary on stdout.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from urllib.parse import urlparse

import httpx

LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}
FIRST_ORDINARY_TOKEN = 3  # ids 0..2 are <s>, </s>, <pad> in build_model.py's tokenizer


@dataclass(frozen=True)
class LoadSpec:
    base_url: str
    model: str
    concurrency: int = 8
    prompt_tokens: int = 256
    output_tokens: int = 128
    count: int = 1000
    duration_s: float = 60.0
    shared_prefix_tokens: int = 0
    repetitive: bool = False
    repeat_period: int = 8
    vocab: int = 4096
    seed: int = 0
    request_timeout_s: float = 300.0
    stream: bool = True


@dataclass
class LoadResult:
    started: int = 0
    completed: int = 0
    cancelled: int = 0
    errors: int = 0
    output_tokens: int = 0
    ttft_s: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0
    first_error: str | None = None


def check_loopback(url: str) -> None:
    host = urlparse(url).hostname
    if host not in LOOPBACK_HOSTS:
        raise SystemExit(f"refusing non-loopback target {url!r}: only 127.0.0.1/localhost/::1")


def make_prompt(spec: LoadSpec, rng: random.Random, prefix: list[int]) -> list[int]:
    """Token ids of exactly ``spec.prompt_tokens`` length."""
    lo, hi = FIRST_ORDINARY_TOKEN, spec.vocab - 1
    if spec.repetitive:
        # A short random phrase repeated: n-gram speculation finds its continuation in the prompt.
        phrase = [rng.randint(lo, hi) for _ in range(spec.repeat_period)]
        body = (phrase * (spec.prompt_tokens // spec.repeat_period + 1))[: spec.prompt_tokens]
        return body
    n_unique = max(spec.prompt_tokens - len(prefix), 1)
    return (prefix + [rng.randint(lo, hi) for _ in range(n_unique)])[: max(spec.prompt_tokens, 1)]


async def one_request(client: httpx.AsyncClient, spec: LoadSpec, prompt: list[int],
                      res: LoadResult) -> None:
    body = {
        "model": spec.model,
        "prompt": prompt,
        "max_tokens": spec.output_tokens,
        "min_tokens": spec.output_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
    }
    if spec.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    else:
        await one_plain_request(client, spec, body, res)
        return
    t0 = time.monotonic()
    first = True
    async with client.stream("POST", f"{spec.base_url}/v1/completions", json=body,
                             timeout=spec.request_timeout_s) as resp:
        if resp.status_code != 200:
            text = (await resp.aread()).decode(errors="replace")[:300]
            raise RuntimeError(f"HTTP {resp.status_code}: {text}")
        async for line in resp.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                break
            if first:
                res.ttft_s.append(time.monotonic() - t0)
                first = False
            # the last chunk carries the server's own token count (stream_options.include_usage)
            usage = json.loads(data).get("usage")
            if usage:
                res.output_tokens += usage.get("completion_tokens") or 0
    res.completed += 1


async def one_plain_request(client: httpx.AsyncClient, spec: LoadSpec, body: dict,
                            res: LoadResult) -> None:
    """Non-streaming: one response per request, so the API server does far less per token."""
    resp = await client.post(f"{spec.base_url}/v1/completions", json=body,
                             timeout=spec.request_timeout_s)
    if resp.status_code != 200:
        raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:300]}")
    res.output_tokens += (resp.json().get("usage") or {}).get("completion_tokens") or 0
    res.completed += 1


async def run_load(spec: LoadSpec) -> LoadResult:
    """Run the load until ``count`` requests were started and finished, or ``duration_s`` ran out
    (outstanding requests are then cancelled, i.e. aborted by the client)."""
    check_loopback(spec.base_url)
    rng = random.Random(spec.seed)
    prefix = [rng.randint(FIRST_ORDINARY_TOKEN, spec.vocab - 1)
              for _ in range(spec.shared_prefix_tokens)]
    res = LoadResult()
    deadline = time.monotonic() + spec.duration_s
    t_start = time.monotonic()
    limits = httpx.Limits(max_connections=spec.concurrency + 4)

    async with httpx.AsyncClient(limits=limits, timeout=spec.request_timeout_s) as client:
        async def worker() -> None:
            while res.started < spec.count and time.monotonic() < deadline:
                res.started += 1
                prompt = make_prompt(spec, rng, prefix)
                try:
                    await one_request(client, spec, prompt, res)
                except asyncio.CancelledError:
                    res.cancelled += 1
                    raise
                except Exception as exc:  # noqa: BLE001 - counted and reported, load goes on
                    res.errors += 1
                    if res.first_error is None:
                        res.first_error = f"{type(exc).__name__}: {exc}"
                    await asyncio.sleep(0.5)

        tasks = [asyncio.create_task(worker()) for _ in range(spec.concurrency)]
        remaining = max(deadline - time.monotonic(), 0.0)
        done, pending = await asyncio.wait(tasks, timeout=remaining)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    res.elapsed_s = time.monotonic() - t_start
    return res


def summary(spec: LoadSpec, res: LoadResult) -> dict:
    ttft = sorted(res.ttft_s)
    out = {"spec": asdict(spec), **{k: v for k, v in asdict(res).items() if k != "ttft_s"}}
    out["ttft_p50_s"] = ttft[len(ttft) // 2] if ttft else None
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--output-tokens", type=int, default=128)
    p.add_argument("--count", type=int, default=1000)
    p.add_argument("--duration", type=float, default=60.0)
    p.add_argument("--shared-prefix-tokens", type=int, default=0)
    p.add_argument("--repetitive", action="store_true")
    p.add_argument("--repeat-period", type=int, default=8)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--request-timeout", type=float, default=300.0)
    p.add_argument("--no-stream", action="store_true",
                   help="plain (non-streaming) completions; lighter on the API server")
    return p


def spec_from_args(a: argparse.Namespace) -> LoadSpec:
    return LoadSpec(
        base_url=a.base_url.rstrip("/"), model=a.model, concurrency=a.concurrency,
        prompt_tokens=a.prompt_tokens, output_tokens=a.output_tokens, count=a.count,
        duration_s=a.duration, shared_prefix_tokens=a.shared_prefix_tokens,
        repetitive=a.repetitive, repeat_period=a.repeat_period, vocab=a.vocab, seed=a.seed,
        request_timeout_s=a.request_timeout, stream=not a.no_stream,
    )


def main(argv: list[str] | None = None) -> int:
    spec = spec_from_args(parser().parse_args(argv))
    res = asyncio.run(run_load(spec))
    json.dump(summary(spec, res), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
