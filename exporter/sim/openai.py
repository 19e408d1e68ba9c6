"""The simulator's OpenAI endpoints: `POST /v1/completions` and `/v1/chat/completions`, streaming
(SSE, as vLLM's frontend sends it) or not, each request run through the simulated engine.

A request is queued in the engine at the sim time of its arrival (`Engine.submit`); the engine's
steps report its tokens with their sim times, and each chunk is written at the wall time that
sim time maps to (`wall_start + (sim - warmup) / speed`), so a client measures the engine's own
TTFT/TPOT/ITL. Token counts in `usage` are the engine's: a string prompt counts one token per
whitespace-separated word (the simulator has no tokenizer), a list of token ids its length; chat
adds 4 tokens of template per message. `max_tokens` (`max_completion_tokens`) caps the output,
`ignore_eos` makes it exact; without it the output stops at a length drawn from the scenario's
output distribution, like an EOS. A client that disconnects aborts its request.
"""
from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from collections import deque
from typing import Any

PATHS = ("/v1/completions", "/v1/chat/completions")
CHAT_TEMPLATE_TOKENS = 4
_WORDS = ("the", "model", "is", "a", "simulated", "engine", "and", "its", "tokens", "arrive",
          "on", "time", "for", "each", "step", "of", "batch")
_rng = random.Random(0)


class BadRequest(Exception):
    def __init__(self, message: str, status: str = "400 Bad Request"):
        super().__init__(message)
        self.status = status


def _error_body(message: str, status: str) -> bytes:
    code = int(status.split()[0])
    kind = "NotFoundError" if code == 404 else "BadRequestError"
    return json.dumps({"object": "error", "message": message, "type": kind, "param": None,
                       "code": code}).encode()


def _head(status: str, ctype: bytes, *, length: int | None, keep: bool) -> bytes:
    hdr = [b"HTTP/1.1 " + status.encode(), b"server: uvicorn", b"content-type: " + ctype]
    hdr.append(b"transfer-encoding: chunked" if length is None else b"content-length: " + str(length).encode())
    if not keep:
        hdr.append(b"connection: close")
    return b"\r\n".join(hdr) + b"\r\n\r\n"


def _words(text: Any) -> int:
    return len(text.split()) if isinstance(text, str) else 0


def prompt_tokens(path: str, body: dict) -> int:
    """The prompt's token count as the simulated tokenizer sees it."""
    if path.endswith("/chat/completions"):
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise BadRequest("'messages' must be a non-empty list")
        n = 0
        for m in msgs:
            if not isinstance(m, dict):
                raise BadRequest("each message must be an object")
            content = m.get("content")
            if isinstance(content, list):   # content parts: count the text ones
                n += sum(_words(p.get("text")) for p in content if isinstance(p, dict))
            else:
                n += _words(content)
            n += CHAT_TEMPLATE_TOKENS
        return n
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]                  # a batch of one
    if isinstance(prompt, str):
        return max(1, _words(prompt))
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    raise BadRequest("'prompt' must be a string or a list of token ids (one prompt)")


def parse(path: str, payload: bytes, served: set[str]) -> dict:
    try:
        body = json.loads(payload or b"null")
    except ValueError:
        raise BadRequest("request body is not JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    model = body.get("model")
    if model is not None and model not in served:
        raise BadRequest(f"The model `{model}` does not exist.", "404 Not Found")
    n = prompt_tokens(path, body)
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)
                                   or max_tokens < 1):
        raise BadRequest(f"max_tokens must be at least 1, got {max_tokens}.")
    if body.get("n", 1) != 1:
        raise BadRequest("the simulator serves n=1 only")
    opts = body.get("stream_options") or {}
    return {"prompt": n, "max_tokens": max_tokens, "ignore_eos": bool(body.get("ignore_eos")),
            "stream": bool(body.get("stream")),
            "usage": bool(isinstance(opts, dict) and opts.get("include_usage")),
            "model": model or next(iter(sorted(served)))}


def _text(start: int, n: int) -> str:
    return "".join(" " + _WORDS[(start + i) % len(_WORDS)] for i in range(n))


async def serve_request(endpoint: Any, path: str, payload: bytes, writer: asyncio.StreamWriter, *,
                        keep: bool) -> bool:
    """Answer one completion request; False when the connection cannot be reused."""
    st = endpoint.state
    served = {st.model_name, st.scenario.model}
    try:
        req = parse(path, payload, served)
    except BadRequest as exc:
        body = _error_body(str(exc), exc.status)
        writer.write(_head(exc.status, b"application/json", length=len(body), keep=keep) + body)
        await writer.drain()
        return True
    chat = path.endswith("/chat/completions")
    if endpoint.wall_start is not None:
        st.tick(time.monotonic() - endpoint.wall_start)
    engine = st.current
    offset, speed, warmup = st.offset, st.speed, st.scenario.warmup_s
    wall0 = endpoint.wall_start if endpoint.wall_start is not None else time.monotonic() - (
        st.sim_time - warmup) / speed
    arrival = warmup + (time.monotonic() - wall0) * speed - offset
    cap = min(st.max_model_len, (engine.cfg.num_gpu_blocks - 1) * engine.cfg.block_size)
    max_tokens = req["max_tokens"] or max(1, cap - req["prompt"])
    stop_len = max_tokens
    if not req["ignore_eos"]:
        stop_len = min(max_tokens, engine.traffic_at(engine.now).output.sample(_rng))
    events: deque = deque()
    ready = asyncio.Event()

    def listener(t: float, n: int, reason: str | None) -> None:
        events.append((t, n, reason))
        ready.set()

    handle = engine.submit(req["prompt"], max_tokens, listener, stop_len=stop_len, at=arrival)
    if handle is None:
        status = "400 Bad Request"
        body = _error_body(f"This model's maximum context length is {cap} tokens. However, you "
                           f"requested {req['prompt'] + max_tokens} tokens "
                           f"({req['prompt']} in the messages, {max_tokens} in the completion). "
                           "Please reduce the length of the messages or completion.", status)
        writer.write(_head(status, b"application/json", length=len(body), keep=keep) + body)
        await writer.drain()
        return True

    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    created = int(time.time())
    obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(text: str | None, finish: str | None, first: bool) -> dict:
        if chat:
            delta = {"role": "assistant", "content": text or ""} if first else (
                {"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish,
                      "stop_reason": None}
        return {"id": rid, "object": obj, "created": created, "model": req["model"], "choices": [choice]}

    def sse(doc: Any) -> bytes:
        data = b"data: " + (doc if isinstance(doc, bytes) else json.dumps(doc, separators=(",", ":")).encode()) + b"\n\n"
        return f"{len(data):x}\r\n".encode() + data + b"\r\n"

    produced = 0
    reason = None
    try:
        if req["stream"]:
            writer.write(_head("200 OK", b"text/event-stream; charset=utf-8", length=None, keep=keep))
        while reason is None:
            if not events:
                ready.clear()
                try:
                    await asyncio.wait_for(ready.wait(), 1.0)
                except asyncio.TimeoutError:
                    # the simulated server redeployed meanwhile, or dropped the queued request
                    if st.current is not engine or (handle not in engine.waiting
                                                    and handle not in engine.running):
                        reason = "abort"
                    continue
            t, n, fin = events.popleft()
            if events and events[0][2] is not None and events[0][0] == t:
                fin = events.popleft()[2]           # the last token carries the finish reason
            due = wall0 + (offset + t - warmup) / speed
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if fin is not None:
                reason = fin
            if req["stream"] and (n or fin is not None):
                writer.write(sse(chunk(_text(produced, n), fin, produced == 0 and chat)))
                await writer.drain()
            produced += n
        usage = {"prompt_tokens": req["prompt"], "total_tokens": req["prompt"] + produced,
                 "completion_tokens": produced, "prompt_tokens_details": None}
        if req["stream"]:
            if req["usage"]:
                writer.write(sse({"id": rid, "object": obj, "created": created, "model": req["model"],
                                  "choices": [], "usage": usage}))
            writer.write(sse(b"[DONE]") + b"0\r\n\r\n")
        else:
            text = _text(0, produced)
            choice = ({"index": 0, "message": {"role": "assistant", "content": text},
                       "logprobs": None, "finish_reason": reason}
                      if chat else {"index": 0, "text": text, "logprobs": None,
                                    "finish_reason": reason, "stop_reason": None})
            body = json.dumps({"id": rid, "object": "chat.completion" if chat else "text_completion",
                               "created": created, "model": req["model"], "choices": [choice],
                               "usage": usage}).encode()
            writer.write(_head("200 OK", b"application/json", length=len(body), keep=keep) + body)
        await writer.drain()
        return True
    except (ConnectionError, asyncio.CancelledError):
        engine.cancel(handle)
        raise
    finally:
        if reason is None:
            engine.cancel(handle)
