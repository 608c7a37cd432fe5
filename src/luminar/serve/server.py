"""An OpenAI-compatible HTTP server on Starlette + uvicorn (`luminar serve`).

    POST /v1/chat/completions   messages -> the assistant's answer (stream: server-sent events)
    POST /v1/completions        prompt -> its continuation (stream too)
    POST /v1/embeddings         input -> sentence embeddings (all-MiniLM-L6-v2, compiled on first use)
    GET  /v1/models, /health, /metrics (Prometheus text)

Generation requests go to a BatchingEngine (engine.py) that runs them together. Sampling fields:
max_tokens (or max_completion_tokens), temperature, top_p, stop (a string or up to 4), seed.
Every bad request gets a 4xx with OpenAI's error object {"error": {"message", "type", "param",
"code"}}: malformed JSON, a field of the wrong type or out of range, a prompt longer than the
context, an unknown model (404), a body over the size limit (413), a full queue (429 with
Retry-After). A client that disconnects cancels its request (its slot is freed at the next step);
a request past its timeout ends with 504 (or an error event when streaming).
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from ..errors import LuminarError
from ..models.generate import SamplingParams, _held_back
from .engine import BatchingEngine, EngineStopped, Event, QueueFull, Request

EMBEDDING_MODEL = "all-MiniLM-L6-v2"


@dataclass
class Limits:
    max_body_bytes: int = 1 << 20
    request_timeout: float = 600.0  # seconds from submission to the last token
    default_max_tokens: int = 256
    max_embedding_inputs: int = 256
    shutdown_grace: float = 10.0  # seconds in-flight requests get to finish at shutdown


class APIError(Exception):
    """An error answered as OpenAI's error object with an HTTP status."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


# -- request fields ----------------------------------------------------------------------------------
def _field(body: dict, name: str, kinds: tuple, default=None, check=None, want: str = ""):
    """body[name] if it has one of `kinds` (and passes `check`), `default` when absent or null."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds) or (check and not check(value)):
        raise APIError(400, f"'{name}' must be {want}, got {json.dumps(value)[:80]}", param=name,
                       code="invalid_value" if isinstance(value, kinds) else "invalid_type")
    return value


def _sampling(body: dict) -> tuple[SamplingParams, int | None]:
    temperature = _field(body, "temperature", (int, float), 1.0, lambda v: 0 <= v <= 2, "a number in [0, 2]")
    top_p = _field(body, "top_p", (int, float), 1.0, lambda v: 0 < v <= 1, "a number in (0, 1]")
    seed = _field(body, "seed", (int,), None, None, "an integer")
    n = _field(body, "n", (int,), 1, lambda v: v == 1, "1 (one choice per request)")
    max_tokens = _field(body, "max_tokens", (int,), None, lambda v: v >= 1, "an integer >= 1")
    max_tokens = _field(body, "max_completion_tokens", (int,), max_tokens, lambda v: v >= 1, "an integer >= 1")
    del n
    return SamplingParams(temperature=float(temperature), top_p=float(top_p), seed=seed), max_tokens


def _stops(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and len(stop) <= 4 and all(isinstance(s, str) for s in stop):
        return stop
    raise APIError(400, "'stop' must be a string or a list of at most 4 strings", param="stop", code="invalid_type")


def _messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "'messages' must be a non-empty list of {role, content} objects", param="messages")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("system", "user", "assistant"):
            raise APIError(400, f"messages[{i}] must be an object whose role is system, user or assistant",
                           param=f"messages[{i}]")
        content = message.get("content")
        if isinstance(content, list):  # content parts: only text parts can be read by a text model
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise APIError(400, f"messages[{i}].content parts must be text parts", param=f"messages[{i}].content")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise APIError(400, f"messages[{i}].content must be a string", param=f"messages[{i}].content",
                           code="invalid_type")
        out.append({"role": message["role"], "content": content})
    return out


class _StopText:
    """Incremental stop strings over streamed text: what may be shown now, and whether one matched."""

    def __init__(self, stops: list[str]):
        self.stops, self.pending = [s for s in stops if s], ""

    def feed(self, piece: str) -> tuple[str, bool]:
        self.pending += piece
        found = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if found:
            text, self.pending = self.pending[:min(found)], ""
            return text, True
        ready = len(self.pending) - _held_back(self.pending, self.stops)
        text, self.pending = self.pending[:ready], self.pending[ready:]
        return text, False

    def flush(self) -> str:
        text, self.pending = self.pending, ""
        return text


class _Generation:
    """One request in the engine, seen from the event loop: text pieces, then a finish reason."""

    def __init__(self, server: Server, prompt: list[int], params: SamplingParams, max_tokens: int, stops: list[str],
                 prompt_field: str):
        loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        self.server, self.prompt_tokens, self.completion_tokens = server, len(prompt), 0
        self.finish_reason: str | None = None

        def deliver(event: Event):
            try:
                loop.call_soon_threadsafe(self.queue.put_nowait, event)
            except RuntimeError:  # the loop closed (shutdown): nobody is listening any more
                pass

        self.request = Request(prompt, max_tokens, params, deliver, frozenset(server.tokenizer.stop_ids),
                               timeout=server.limits.request_timeout)
        self.decoder = server.tokenizer.stream_decoder()
        self.stop_text = _StopText(stops)
        try:
            server.engine.submit(self.request)
        except QueueFull as e:
            retry = max(1, round(server.retry_after()))
            raise APIError(429, f"the server is busy: {e}; retry after {retry} s", code="rate_limit_exceeded",
                           kind="rate_limit_error", headers={"Retry-After": str(retry)}) from None
        except EngineStopped as e:
            raise APIError(503, str(e), kind="server_error", code="shutting_down") from None
        except LuminarError as e:  # the engine's check: the prompt does not fit the context
            raise APIError(400, str(e), param=prompt_field, code="context_length_exceeded") from None

    async def pieces(self) -> AsyncIterator[str]:
        """The generated text in pieces; finish_reason is set when it ends. Leaving early (a client
        disconnect cancels the task iterating this) cancels the request in the engine."""
        try:
            while True:
                event = await self.queue.get()
                if event.token is not None:
                    self.completion_tokens += 1
                    text, stopped = self.stop_text.feed(self.decoder.step(event.token))
                    if text:
                        yield text
                    if stopped:
                        self.finish_reason = "stop"
                        return
                    continue
                if event.finish in ("stop", "length"):
                    rest = self.stop_text.feed(self.decoder.flush())[0] + self.stop_text.flush()
                    if rest:
                        yield rest
                    self.finish_reason = event.finish
                    return
                if event.finish == "timeout":
                    raise APIError(504, event.message, kind="timeout_error", code="timeout")
                raise APIError(500, event.message or "generation failed", kind="server_error")
        finally:
            if self.finish_reason is None or self.finish_reason == "stop":
                self.server.engine.cancel(self.request)  # a stop string, an error or a disconnect: free the slot


class Server:
    """The Starlette application around a BatchingEngine and the model's tokenizer."""

    def __init__(self, engine: BatchingEngine, tokenizer, model_name: str, limits: Limits | None = None,
                 embedder_loader: Callable | None = None):
        if tokenizer is None:
            raise LuminarError("serve: the model has no tokenizer, so it cannot read text requests")
        self.engine, self.tokenizer, self.model_name = engine, tokenizer, model_name
        self.limits = limits or Limits()
        self.metrics = engine.metrics
        self.embedder_loader, self.embedder, self.embedder_lock = embedder_loader, None, threading.Lock()
        self.started = int(time.time())

    def app(self):
        from starlette.applications import Starlette
        from starlette.routing import Route
        routes = [Route("/v1/chat/completions", self._endpoint(self.chat), methods=["POST"]),
                  Route("/v1/completions", self._endpoint(self.completions), methods=["POST"]),
                  Route("/v1/embeddings", self._endpoint(self.embeddings), methods=["POST"]),
                  Route("/v1/models", self._endpoint(self.models), methods=["GET"]),
                  Route("/health", self._endpoint(self.health), methods=["GET"]),
                  Route("/metrics", self._endpoint(self.prometheus), methods=["GET"])]
        return Starlette(routes=routes, lifespan=self._lifespan)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app):
        """The engine runs while the app does; at shutdown (after uvicorn has let the open requests
        finish for its graceful timeout) whatever still runs is ended, in a thread: stop() waits."""
        if not self.engine.running:
            self.engine.start()
        yield
        await asyncio.to_thread(self.engine.stop, self.limits.shutdown_grace)

    def retry_after(self) -> float:
        """Seconds until a queue place probably frees: the queue's length times a decode step's mean."""
        steps = self.metrics.step_seconds
        mean = steps.sum / steps.count if steps.count else 0.1
        return len(self.engine.waiting) * mean * 16

    # -- plumbing --------------------------------------------------------------------------------------
    def _endpoint(self, handler):
        from starlette.responses import JSONResponse

        async def endpoint(request):
            try:
                response = await handler(request)
            except APIError as e:
                response = JSONResponse(e.body(), status_code=e.status, headers=e.headers)
            except LuminarError as e:
                response = JSONResponse(APIError(400, str(e)).body(), status_code=400)
            except Exception as e:  # a bug answers this request with a 500, and the server keeps serving
                error = APIError(500, f"internal error: {type(e).__name__}: {e}", kind="server_error")
                response = JSONResponse(error.body(), status_code=500)
            self.metrics.requests.inc(str(response.status_code))
            return response
        return endpoint

    async def _body(self, request) -> dict:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limits.max_body_bytes:
            raise APIError(413, f"the request body has {declared} bytes; the limit is {self.limits.max_body_bytes}",
                           code="request_too_large")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.limits.max_body_bytes:
                raise APIError(413, f"the request body exceeds the limit of {self.limits.max_body_bytes} bytes",
                               code="request_too_large")
            chunks.append(chunk)
        try:
            body = json.loads(b"".join(chunks))
        except (ValueError, UnicodeDecodeError) as e:
            raise APIError(400, f"the request body is not valid JSON ({e})", code="invalid_json") from None
        if not isinstance(body, dict):
            raise APIError(400, "the request body must be a JSON object", code="invalid_json")
        return body

    def _check_model(self, body: dict, served: str) -> str:
        model = body.get("model")
        if not isinstance(model, str):
            raise APIError(400, "'model' must be a string naming the model", param="model", code="invalid_type")
        if model != served:
            raise APIError(404, f"the model {model!r} does not exist; this server serves {served!r}"
                           + (f" and {EMBEDDING_MODEL!r} (embeddings)" if self.embedder_loader else ""),
                           param="model", code="model_not_found")
        return model

    async def _generate(self, request, body: dict, prompt: list[int], prompt_field: str, chunk: Callable,
                        whole: Callable):
        params, max_tokens = _sampling(body)
        stream = _field(body, "stream", (bool,), False, None, "a boolean")
        stops = _stops(body)
        if max_tokens is None:
            max_tokens = min(self.limits.default_max_tokens, max(1, self.engine.context - len(prompt) - 1))
        generation = _Generation(self, prompt, params, max_tokens, stops, prompt_field)
        ident, created = f"{uuid.uuid4().hex[:24]}", int(time.time())
        if stream:
            return self._stream(generation, ident, created, chunk)
        task = asyncio.ensure_future(self._collect(generation))
        disconnect = asyncio.ensure_future(self._disconnected(request))
        done, _ = await asyncio.wait({task, disconnect}, return_when=asyncio.FIRST_COMPLETED)
        if task not in done:  # the client left: cancelling the task cancels the request in the engine
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise APIError(499, "the client disconnected", code="client_closed_request")
        disconnect.cancel()
        from starlette.responses import JSONResponse
        usage = {"prompt_tokens": generation.prompt_tokens, "completion_tokens": generation.completion_tokens,
                 "total_tokens": generation.prompt_tokens + generation.completion_tokens}
        return JSONResponse(whole(ident, created, task.result(), generation.finish_reason, usage))

    @staticmethod
    async def _collect(generation: _Generation) -> str:
        return "".join([piece async for piece in generation.pieces()])

    @staticmethod
    async def _disconnected(request) -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    def _stream(self, generation: _Generation, ident: str, created: int, chunk: Callable):
        from starlette.responses import StreamingResponse

        async def events():
            yield _sse(chunk(ident, created, None, None, first=True))
            try:
                async for piece in generation.pieces():
                    yield _sse(chunk(ident, created, piece, None))
                yield _sse(chunk(ident, created, None, generation.finish_reason))
            except APIError as e:  # headers are sent: the error travels as an event, as OpenAI's does
                yield _sse(e.body())
            yield "data: [DONE]\n\n"
        return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    # -- endpoints ---------------------------------------------------------------------------------------
    async def chat(self, request):
        body = await self._body(request)
        model = self._check_model(body, self.model_name)
        messages = _messages(body)
        try:
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        except LuminarError as e:
            raise APIError(400, f"the chat template cannot render these messages: {e}", param="messages") from None
        prompt = self.tokenizer.encode(text)

        def chunk(ident, created, piece, finish, first=False):
            delta = {"role": "assistant", "content": ""} if first else ({"content": piece} if piece else {})
            return {"id": f"chatcmpl-{ident}", "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        def whole(ident, created, text, finish, usage):
            return {"id": f"chatcmpl-{ident}", "object": "chat.completion", "created": created, "model": model,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                 "finish_reason": finish}], "usage": usage}
        return await self._generate(request, body, prompt, "messages", chunk, whole)

    async def completions(self, request):
        body = await self._body(request)
        model = self._check_model(body, self.model_name)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str) or not prompt:
            raise APIError(400, "'prompt' must be a non-empty string", param="prompt", code="invalid_type")
        if body.get("echo") or body.get("logprobs") is not None or body.get("suffix") is not None:
            raise APIError(400, "echo, logprobs and suffix are not supported", param="echo")
        ids = self.tokenizer.encode(prompt)

        def chunk(ident, created, piece, finish, first=False):
            if first:
                piece = ""
            return {"id": f"cmpl-{ident}", "object": "text_completion", "created": created, "model": model,
                    "choices": [{"index": 0, "text": piece or "", "logprobs": None, "finish_reason": finish}]}

        def whole(ident, created, text, finish, usage):
            return {"id": f"cmpl-{ident}", "object": "text_completion", "created": created, "model": model,
                    "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
                    "usage": usage}
        return await self._generate(request, body, ids, "prompt", chunk, whole)

    async def embeddings(self, request):
        from starlette.responses import JSONResponse
        body = await self._body(request)
        if self.embedder_loader is None:
            raise APIError(404, "this server serves no embedding model", param="model", code="model_not_found")
        model = self._check_model(body, EMBEDDING_MODEL)
        texts = body.get("input")
        texts = [texts] if isinstance(texts, str) else texts
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
            raise APIError(400, "'input' must be a non-empty string or list of non-empty strings", param="input",
                           code="invalid_type")
        if len(texts) > self.limits.max_embedding_inputs:
            raise APIError(400, f"'input' has {len(texts)} texts; the limit is {self.limits.max_embedding_inputs}",
                           param="input")
        encoding = body.get("encoding_format") or "float"
        if encoding not in ("float", "base64"):
            raise APIError(400, "encoding_format must be 'float' or 'base64'", param="encoding_format")
        vectors, tokens = await asyncio.to_thread(self._embed, texts)

        def encoded(vector):  # base64: the little-endian float32 bytes (what the openai client asks for)
            if encoding == "base64":
                return base64.b64encode(vector.astype("<f4").tobytes()).decode()
            return [float(x) for x in vector]
        return JSONResponse({"object": "list", "model": model,
                             "data": [{"object": "embedding", "index": i, "embedding": encoded(vector)}
                                      for i, vector in enumerate(vectors)],
                             "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    def _embed(self, texts: list[str]):
        with self.embedder_lock:  # one compile on first use; one batch at a time
            if self.embedder is None:
                self.embedder = self.embedder_loader()
            tokens = sum(len(ids) for ids in self.embedder.tokenize(texts))
            return self.embedder.encode(texts), tokens

    async def models(self, request):
        from starlette.responses import JSONResponse
        names = [self.model_name] + ([EMBEDDING_MODEL] if self.embedder_loader else [])
        return JSONResponse({"object": "list", "data": [{"id": name, "object": "model", "created": self.started,
                                                         "owned_by": "luminar"} for name in names]})

    async def health(self, request):
        from starlette.responses import JSONResponse
        ok = self.engine.accepting and self.engine.thread is not None and self.engine.thread.is_alive()
        return JSONResponse({"status": "ok" if ok else "unavailable", "running": self.engine.busy,
                             "waiting": len(self.engine.waiting)}, status_code=200 if ok else 503)

    async def prometheus(self, request):
        from starlette.responses import PlainTextResponse
        self.metrics.queue_depth.set(len(self.engine.waiting))
        return PlainTextResponse(self.metrics.render(), media_type="text/plain; version=0.0.4")


def _sse(data: dict) -> str:
    return f"data: {json.dumps(data)}\n\n"
