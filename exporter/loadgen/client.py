"""One streamed request against an OpenAI-compatible server, timed like `vllm bench serve`.

Timing (all from the client's monotonic clock, as in vLLM's `benchmarks/lib/endpoint_request_func`):
TTFT is request start to the first SSE chunk carrying generated text; ITL the gaps between
consecutive such chunks; E2E request start to the end of the stream. Output tokens come from the
server's `usage` (`stream_options.include_usage`), never from counting chunks, unless the server
sends no usage (then chunks are counted and the result says so). Prompts for `/v1/completions` are
lists of random token ids (exact length, no tokenizer needed, no prefix-cache hits between
requests); chat prompts are random words (the server's `usage` says how many tokens they were).
"""
from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field

import httpx

# Inside every vocabulary of 4096 ids or more (the tiny CPU test model's is 4096; vLLM rejects a
# prompt id >= vocab with 'Token id N is out of vocabulary') and clear of the low special ids.
TOKEN_ID_RANGE = (1000, 4000)
_WORDS = ("alpha", "bravo", "delta", "echo", "gold", "hotel", "india", "kilo", "lima", "mike",
          "oscar", "papa", "river", "stone", "tango", "unit", "violet", "water", "yellow", "zone")


@dataclass
class RequestResult:
    ok: bool
    start: float                     # monotonic seconds
    end: float
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    usage_reported: bool = False
    error: str = ""

    @property
    def e2e(self) -> float:
        return self.end - self.start

    @property
    def tpot(self) -> float | None:
        """(E2E - TTFT) / (output tokens - 1), as `vllm bench serve` computes TPOT."""
        if not self.ok or self.ttft is None or not self.output_tokens or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


@dataclass(frozen=True)
class Api:
    base_url: str                    # http://host:port (no /v1)
    model: str                       # the served model name sent in each request
    chat: bool = False
    ignore_eos: bool = True

    @property
    def url(self) -> str:
        return self.base_url + ("/v1/chat/completions" if self.chat else "/v1/completions")

    def body(self, prompt_tokens: int, output_tokens: int, rng: random.Random) -> dict:
        body: dict = {"model": self.model, "max_tokens": output_tokens, "temperature": 0.0,
                      "stream": True, "stream_options": {"include_usage": True}}
        if self.ignore_eos:
            body["ignore_eos"] = True
        if self.chat:
            words = " ".join(rng.choice(_WORDS) for _ in range(max(1, prompt_tokens)))
            body["messages"] = [{"role": "user", "content": words}]
        else:
            lo, hi = TOKEN_ID_RANGE
            body["prompt"] = [rng.randrange(lo, hi) for _ in range(max(1, prompt_tokens))]
        return body


def _text_of(choice: dict, chat: bool) -> str:
    if chat:
        return (choice.get("delta") or {}).get("content") or ""
    return choice.get("text") or ""


async def send(client: httpx.AsyncClient, api: Api, prompt_tokens: int, output_tokens: int,
               rng: random.Random) -> RequestResult:
    body = api.body(prompt_tokens, output_tokens, rng)
    start = time.monotonic()
    res = RequestResult(ok=False, start=start, end=start)
    chunks = 0
    last = start
    try:
        async with client.stream("POST", api.url, json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode("utf-8", "replace")
                res.error = f"HTTP {resp.status_code}: {_message(text)}"
                res.end = time.monotonic()
                return res
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                now = time.monotonic()
                try:
                    doc = json.loads(data)
                except ValueError:
                    res.error = f"unreadable SSE chunk: {data[:60]!r}"
                    res.end = now
                    return res
                if doc.get("error") or doc.get("object") == "error":
                    res.error = f"server error in stream: {_message(data)}"
                    res.end = now
                    return res
                choices = doc.get("choices") or []
                if choices and _text_of(choices[0], api.chat):
                    if res.ttft is None:
                        res.ttft = now - start
                    else:
                        res.itl.append(now - last)
                    last = now
                    chunks += 1
                usage = doc.get("usage")
                if usage:
                    res.usage_reported = True
                    res.prompt_tokens = usage.get("prompt_tokens")
                    res.output_tokens = usage.get("completion_tokens")
        res.end = time.monotonic()
    except httpx.HTTPError as exc:
        res.end = time.monotonic()
        res.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return res
    if res.ttft is None:
        res.error = "stream ended without any generated text"
        return res
    if not res.usage_reported:
        res.output_tokens = chunks
    res.ok = True
    return res


def _message(text: str) -> str:
    try:
        doc = json.loads(text)
        msg = doc.get("message") or (doc.get("error") or {}).get("message") or doc.get("detail")
        if msg:
            return str(msg)[:200]
    except (ValueError, AttributeError):
        pass
    return " ".join(text.split())[:200]
