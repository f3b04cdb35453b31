"""The OpenAI-compatible HTTP layer (FastAPI): request checks, prompts -> ids, jobs -> responses.

Every refusal is an OpenAI error body {"error": {"message", "type", "param", "code"}} whose
message names the field, the bad value and what is valid. Nothing here runs torch: prompts are
tokenised in the thread pool, decoding happens on the scheduler's worker thread, and handlers
only await its events.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from dataclasses import dataclass
from typing import Optional

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..sampling import Sampling
from .mailbox import sender
from .metrics import CONTENT_TYPE, Metrics
from .protocol import APIError, ChatRequest, CompletionRequest, describe_validation, error_body
from .scheduler import Job, QueueFull, Scheduler, ShuttingDown, describe
from .text import text_so_far

# how often a non-streamed request checks whether its client is still there
_POLL_S = 0.25


@dataclass
class Served:
    """What the app serves: the loaded run, its engine and scheduler, and the limits."""

    loaded: object  # rundir.LoadedRun
    engine: object  # decoding.Engine
    scheduler: Scheduler
    metrics: Metrics
    model_name: str
    max_model_len: int
    api_key: Optional[str] = None
    max_body_bytes: int = 1 << 20
    retry_after_s: int = 1


def create_app(served: Served) -> FastAPI:
    app = FastAPI(title="domino-graft serve", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.served = served
    _errors(app, served)

    def auth(request: Request) -> None:
        # a dependency runs before the body's fields are checked: a client without the key
        # learns that first, not what is wrong with its request
        _auth(served, request)

    v1 = [Depends(auth)]

    @app.get("/health")
    async def health():
        status, body = health_status(served.scheduler)
        return JSONResponse(body, status)

    @app.get("/metrics")
    async def metrics():
        return Response(served.metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models", dependencies=v1)
    async def models():
        loaded = served.loaded
        return {"object": "list", "data": [{
            "id": served.model_name, "object": "model", "created": 0, "owned_by": "domino-graft",
            "root": str(loaded.path), "family": loaded.adapter.family, "max_model_len": served.max_model_len,
        }]}

    @app.post("/v1/completions", dependencies=v1)
    async def completions(body: CompletionRequest, request: Request):
        _model(served, body.model)
        where = "prompt"
        kw = {"prompt_ids": body.prompt} if isinstance(body.prompt, list) else {"prompt": body.prompt, "raw": True}
        ids = await run_in_threadpool(_encode, served, where, kw)
        return await _respond(served, request, body, ids, chat=False)

    @app.post("/v1/chat/completions", dependencies=v1)
    async def chat(body: ChatRequest, request: Request):
        _model(served, body.model)
        messages = [{"role": m.role, "content": m.content} for m in body.messages]
        ids = await run_in_threadpool(_encode, served, "messages", {"messages": messages})
        return await _respond(served, request, body, ids, chat=True)

    return app


def health_status(s: Scheduler) -> tuple[int, dict]:
    """/health: 200 "ok" once the worker serves (with what its warm start did); 503 "warming" while it
    warms up (requests sent meanwhile wait in the queue), 503 "error" if it died or the warm start failed."""
    if not s.alive:
        return 503, {"status": "error", "error": s.error or "the model worker is not running"}
    body = {"status": "warming" if s.warming else "ok", "mode": s.mode, "running": s.running,
            "queued": s.queue_depth(), "verify_budget": describe(s)["verify_budget"]}
    if s.warming:
        return 503, body
    body["warm_start"] = None if s.warm is None else s.warm.status()
    # how new requests joined: batches built (each re-prefills its rows) and prefills into freed rows
    body["batches"] = {"admit_in_place": s.admit_in_place, "rebuilds": s.rebuilds,
                       "admitted_in_place": s.admitted_in_place, "admissions": s.admissions,
                       "cohorts": s.cohorts.on}
    return 200, body


# --------------------------------------------------------------------------- checks
def _auth(served: Served, request: Request) -> None:
    if served.api_key is None:
        return
    header = request.headers.get("authorization", "")
    if not hmac.compare_digest(header.encode(), f"Bearer {served.api_key}".encode()):  # constant time
        what = "no Authorization header" if not header else "a wrong API key"
        raise APIError(401, f"Authorization: {what}; valid: 'Bearer <the --api-key the server was started with>'",
                       type="authentication_error", code="invalid_api_key")


def _model(served: Served, name: str) -> None:
    if name != served.model_name:
        raise APIError(400, f"model: {name!r} is not served here; valid: {served.model_name!r} (GET /v1/models)",
                       param="model", code="model_not_found")


def _encode(served: Served, where: str, kw: dict) -> list[int]:
    """Prompt or messages -> ids with the library's rules (chat template, reserved ids)."""
    from ..decoding import encode_prompt, stop_token_ids

    loaded = served.loaded
    try:
        return encode_prompt(loaded.target, chat=loaded.recipe.target.chat, where=where,
                             reserved=stop_token_ids(loaded.target) | loaded.adapter.reserved_token_ids(),
                             placeholders=loaded.adapter.reserved_token_ids(), **kw)
    except ValueError as e:
        message = str(e).replace(f"{where}: {where}:", f"{where}:", 1)  # the library names `where` twice
        raise APIError(400, message, param=where, code="invalid_prompt") from None


def _budget(served: Served, body, n_prompt: int, chat: bool) -> int:
    """max_tokens checked against the positions the prompt leaves (its default when absent)."""
    total = served.max_model_len
    left = total - n_prompt
    if left < 1:
        raise APIError(400, f"prompt: {n_prompt:,} tokens; the model has {total:,} positions (max_model_len) and "
                            f"needs at least one for the answer; valid: at most {total - 1:,} prompt tokens",
                       param="messages" if chat else "prompt", code="context_length_exceeded")
    if body.max_tokens is None:
        return left if chat else min(16, left)  # OpenAI's defaults: chat to the end, completions 16
    if body.max_tokens > left:
        raise APIError(400, f"max_tokens: {body.max_tokens:,} is beyond the positions left: the prompt takes "
                            f"{n_prompt:,} of the model's {total:,} (max_model_len); valid: 1..{left:,}",
                       param="max_tokens", code="context_length_exceeded")
    return body.max_tokens


# ------------------------------------------------------------------------ responses
async def _respond(served: Served, request: Request, body, ids: list[int], *, chat: bool):
    max_tokens = _budget(served, body, len(ids), chat)
    loop = asyncio.get_running_loop()
    events: asyncio.Queue = asyncio.Queue()
    job = Job(ids, max_tokens=max_tokens,
              sampling=Sampling(temperature=body.temperature, top_k=body.top_k, top_p=body.top_p, seed=body.seed),
              stop=body.stop_strings(), stop_ids=served.engine.stop_ids, text=text_so_far(served.loaded.target),
              send=sender(loop, events))
    try:
        served.scheduler.submit(job)
    except QueueFull as e:
        raise APIError(429, f"{e}; retry after {served.retry_after_s} s", type="rate_limit_error",
                       code="queue_full", headers={"Retry-After": str(served.retry_after_s)}) from None
    except ShuttingDown as e:
        raise APIError(503, f"{e}; retry on another replica", type="server_error", code="shutting_down",
                       headers={"Retry-After": str(served.retry_after_s)}) from None
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
    created = int(time.time())
    if body.stream:
        usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(_stream(served, job, events, rid, created, chat, usage),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    text, reason = [], None
    checked = time.monotonic()
    while reason is None:
        # deltas may arrive every few ms: the client is checked by the clock, not on a quiet queue
        if time.monotonic() - checked >= _POLL_S:
            checked = time.monotonic()
            if await request.is_disconnected():
                job.cancel()
                return Response(status_code=499)
        try:
            ev = await asyncio.wait_for(events.get(), _POLL_S)
        except asyncio.TimeoutError:
            continue
        if ev[0] == "delta":
            text.append(ev[1])
        elif ev[0] == "done":
            reason = ev[1]
        else:
            raise APIError(500, ev[1], type="server_error", code="decoding_failed")
    content = "".join(text)
    choice = ({"index": 0, "message": {"role": "assistant", "content": content}} if chat
              else {"index": 0, "text": content, "logprobs": None})
    choice["finish_reason"] = reason
    return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
            "model": served.model_name, "choices": [choice], "usage": _usage(job)}


def _merged_deltas(text: str, events: asyncio.Queue) -> tuple[str, Optional[tuple]]:
    """A delta's text with the deltas queued behind it, and the first other event queued (None if none): when
    the client's stream falls behind the worker, one chunk carries what several would (each chunk is a JSON
    encoding and a write on the event loop, which the other streams wait for). The text is the same."""
    parts = [text]
    while not events.empty():
        ev = events.get_nowait()
        if ev[0] != "delta":
            return "".join(parts), ev
        parts.append(ev[1])
    return "".join(parts), None


def _usage(job: Job) -> dict:
    return {"prompt_tokens": len(job.prompt_ids), "completion_tokens": len(job.tokens),
            "total_tokens": len(job.prompt_ids) + len(job.tokens)}


async def _stream(served: Served, job: Job, events: asyncio.Queue, rid: str, created: int, chat: bool,
                  usage: bool):
    """Server-sent events as OpenAI sends them; the client going away (this generator closed by
    Starlette) cancels the job, and the worker frees its row at the next block."""
    kind = "chat.completion.chunk" if chat else "text_completion"

    def chunk(delta: Optional[str], reason: Optional[str], first: bool = False) -> str:
        if chat:
            d = {} if delta is None else {"content": delta}
            if first:
                d["role"] = "assistant"
            choice = {"index": 0, "delta": d, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": delta or "", "logprobs": None, "finish_reason": reason}
        obj = {"id": rid, "object": kind, "created": created, "model": served.model_name, "choices": [choice]}
        return f"data: {json.dumps(obj)}\n\n"

    try:
        if chat:
            yield chunk("", None, first=True)
        while True:
            ev = await events.get()
            if ev[0] == "delta":
                text, ev = _merged_deltas(ev[1], events)
                if text:
                    yield chunk(text, None)
                if ev is None:
                    continue
            if ev[0] == "done":
                yield chunk(None, ev[1])
                break
            else:
                yield f"data: {json.dumps(error_body(ev[1], type='server_error', code='decoding_failed'))}\n\n"
                break
        if usage:
            obj = {"id": rid, "object": kind, "created": created, "model": served.model_name, "choices": [],
                   "usage": _usage(job)}
            yield f"data: {json.dumps(obj)}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        if job.finish_reason is None:
            job.cancel()


# --------------------------------------------------------------------------- errors
def _errors(app: FastAPI, served: Served) -> None:
    models = {"/v1/completions": CompletionRequest, "/v1/chat/completions": ChatRequest}

    def refuse(status: int, body: dict, headers: Optional[dict] = None) -> JSONResponse:
        served.metrics.http_errors.labels(status=str(status)).inc()
        return JSONResponse(body, status_code=status, headers=headers)

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError):
        return refuse(e.status, e.body(), e.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError):
        message, param, code = describe_validation(list(e.errors()), models.get(request.url.path))
        return refuse(400, error_body(message, param=param, code=code))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException):
        what = {404: f"{request.url.path}: no such endpoint; valid: /v1/completions, /v1/chat/completions, "
                     "/v1/models, /health, /metrics",
                405: f"{request.method} {request.url.path}: method not allowed"}.get(e.status_code, str(e.detail))
        return refuse(e.status_code, error_body(what, code=str(e.status_code)), getattr(e, "headers", None))


class BodyLimit:
    """Refuses a request body over `limit` bytes with 413 before it is parsed: by its
    Content-Length, or, for a chunked body, as soon as the bytes read pass the limit."""

    def __init__(self, app, limit: int, metrics: Optional[Metrics] = None):
        self.app, self.limit, self.metrics = app, limit, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or ())
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await self._refuse(int(declared), scope, receive, send)
        seen = 0
        started = False

        class TooLarge(Exception):
            pass

        async def limited_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise TooLarge
            return message

        async def tracked_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracked_send)
        except TooLarge:
            if not started:
                await self._refuse(seen, scope, receive, send)

    async def _refuse(self, size: int, scope, receive, send):
        if self.metrics is not None:
            self.metrics.http_errors.labels(status="413").inc()
        body = error_body(f"body: {size:,} bytes or more; valid: at most {self.limit:,} bytes (--max-body-bytes)",
                          param="body", code="body_too_large")
        await JSONResponse(body, status_code=413)(scope, receive, send)
