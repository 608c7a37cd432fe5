"""Continuous batching: many generation requests share one graph call per decode step.

One engine thread owns the model. Each turn of its loop it

1. drops the sequences whose client went away or whose time ran out (their slot is freed),
2. admits one waiting request, if a slot is free: its prompt runs through the prefill graph
   (LlamaModel's program) and its keys/values are copied into the free slot of the slotted KV
   cache; its first token is sampled from the prefill's logits,
3. runs one decode step for every running sequence in one call of the batched graph
   (models/batched.py): row i feeds its newest token and its slot, and gets its next token.

So sequences join and leave between steps, and a new prompt's prefill is interleaved with the
running ones' decode (one prefill per turn, then a step for all). The running sequences occupy
slot columns 0..b-1 of the cache: when one leaves, the last one's column moves into its place,
so the graph's batch is a dense prefix. The cache's length passed to the graph is rounded up
to a multiple of CACHE_BLOCK: fewer distinct shapes, and row results that do not depend on the
other rows' lengths (the kernels' vector paths; tests/test_serve.py checks greedy output batched
against the same request alone).

Requests come from other threads (the HTTP server's event loop) through `submit`, which refuses
with QueueFull when `max_queue` requests already wait; events go back through each request's
`deliver` callback, from the engine thread.
"""
from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..errors import LuminarError, ShapeError
from ..models.generate import Sampler, SamplingParams
from .metrics import Metrics

CACHE_BLOCK = 16


class QueueFull(LuminarError):
    """The engine's waiting queue is full: try again later (HTTP 429)."""


class EngineStopped(LuminarError):
    """The engine is shutting down and takes no new requests (HTTP 503)."""


@dataclass
class Event:
    """What the engine tells a request: a new token, or the end ("stop", "length", "timeout",
    "cancelled", "error" with a message)."""
    token: int | None = None
    finish: str | None = None
    message: str = ""


@dataclass(eq=False)
class Request:
    """One generation: prompt ids, at most `max_tokens` new ones, sampling, and where events go."""
    prompt: list[int]
    max_tokens: int
    params: SamplingParams
    deliver: Callable[[Event], None]
    stop_ids: frozenset = frozenset()
    timeout: float | None = None  # seconds from submission
    submitted: float = field(default_factory=time.perf_counter)
    cancelled: bool = False  # set by cancel(); the engine frees the slot at its next turn

    @property
    def deadline(self) -> float:
        return float("inf") if self.timeout is None else self.submitted + self.timeout


@dataclass(eq=False)
class _Running:
    request: Request
    sampler: Sampler
    context: list[int]  # prompt + generated, for the sampler's repetition penalty
    seen: int  # tokens in the cache slot
    pending: int  # the newest token, not yet in the cache
    generated: int = 1
    last_token_at: float = 0.0


class BatchingEngine:
    """Runs requests on a LlamaModel (prefill) and its compiled batched decode program."""

    def __init__(self, model, batched_program, max_batch: int = 8, context: int | None = None,
                 max_queue: int = 64, metrics: Metrics | None = None):
        c = model.config
        if c.has_sliding:
            raise ShapeError(f"{c.architecture}: continuous batching supports full-attention models only")
        self.model, self.batched, self.config = model, batched_program, c
        self.max_batch, self.max_queue = max_batch, max_queue
        self.context = min(context or c.max_position_embeddings, c.max_position_embeddings)
        positions = -(-(self.context + 1) // CACHE_BLOCK) * CACHE_BLOCK
        shape = (positions, max_batch, c.num_hidden_layers, c.num_key_value_heads, c.head_dim)
        self.k, self.v = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
        self.empty_cache = np.zeros((1, c.num_hidden_layers, c.num_key_value_heads, c.head_dim), np.float32)
        self.metrics = metrics or Metrics()
        self.waiting: collections.deque[Request] = collections.deque()
        self.rows: list[_Running] = []
        self.lock = threading.Condition()
        self.accepting, self.running = True, False
        self.thread: threading.Thread | None = None

    # -- the caller's side ------------------------------------------------------------------------
    def check(self, prompt_tokens: int, max_tokens: int) -> None:
        """ShapeError unless a prompt of `prompt_tokens` and max_tokens >= 1 fit the context."""
        if prompt_tokens < 1:
            raise ShapeError("the prompt is empty")
        if prompt_tokens >= self.context:
            raise ShapeError(f"the prompt has {prompt_tokens} tokens; this server's context is {self.context} "
                             f"tokens, and at least one must be left to generate")
        if max_tokens < 1:
            raise ShapeError(f"max_tokens must be >= 1, got {max_tokens}")

    def submit(self, request: Request) -> None:
        self.check(len(request.prompt), request.max_tokens)
        with self.lock:
            if not self.accepting:
                raise EngineStopped("the server is shutting down")
            if len(self.waiting) >= self.max_queue:
                self.metrics.rejected.inc()
                raise QueueFull(f"{len(self.waiting)} requests are already waiting (the queue holds {self.max_queue})")
            self.waiting.append(request)
            self.metrics.queue_depth.set(len(self.waiting))
            self.lock.notify()

    def cancel(self, request: Request) -> None:
        """Stop `request` (its client left, or a stop string ended it); its slot frees at the next turn."""
        with self.lock:
            request.cancelled = True
            self.lock.notify()

    def start(self) -> BatchingEngine:
        self.running = True
        self.thread = threading.Thread(target=self._loop, name="luminar-engine", daemon=True)
        self.thread.start()
        return self

    def stop(self, grace: float = 10.0) -> None:
        """Graceful shutdown: take no new requests, let the running and waiting ones finish for up to
        `grace` seconds, then end the rest with an "error" event and stop the thread."""
        with self.lock:
            self.accepting = False
            self.lock.notify()
        end = time.perf_counter() + grace
        while time.perf_counter() < end and (self.rows or self.waiting) and self.thread and self.thread.is_alive():
            time.sleep(0.02)
        with self.lock:
            self.running = False
            self.lock.notify()
        if self.thread is not None:
            self.thread.join(timeout=30)
        for request in [r.request for r in self.rows] + list(self.waiting):
            request.deliver(Event(finish="error", message="the server shut down before the request finished"))
        self.rows.clear()
        self.waiting.clear()

    @property
    def busy(self) -> int:
        return len(self.rows)

    # -- the engine thread ----------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self.lock:
                while self.running and not self.rows and not self.waiting:
                    self.lock.wait()
                if not self.running:
                    return
                admit = self.waiting.popleft() if self.waiting and len(self.rows) < self.max_batch else None
                self.metrics.queue_depth.set(len(self.waiting))
            # a failed graph call ends the requests it was for, never the engine or the server
            self._drop_finished()
            if admit is not None:
                try:
                    self._prefill(admit)
                except Exception as e:
                    if self.rows and self.rows[-1].request is admit:
                        self.rows.pop()
                    admit.deliver(Event(finish="error", message=f"prefill failed: {e}"))
            if self.rows:
                try:
                    self._decode_step()
                except Exception as e:
                    for row in self.rows:
                        row.request.deliver(Event(finish="error", message=f"decode failed: {e}"))
                    self.rows.clear()

    def _drop_finished(self) -> None:
        now = time.perf_counter()
        for i in reversed(range(len(self.rows))):
            request = self.rows[i].request
            if request.cancelled:
                self._finish(i, "cancelled")
            elif now > request.deadline:
                self._finish(i, "timeout", f"the request ran past its timeout of {request.timeout:g} s")
        with self.lock:
            for request in [r for r in self.waiting if r.cancelled or now > r.deadline]:
                self.waiting.remove(request)
                if not request.cancelled:
                    request.deliver(Event(finish="timeout",
                                          message=f"the request waited past its timeout of {request.timeout:g} s"))

    def _prefill(self, request: Request) -> None:
        if request.cancelled:
            return
        c = self.config
        ids = np.asarray(request.prompt, np.int32)
        program = getattr(self.model, "prefill_program", None) or self.model.program  # (prompts: the dequantizing program)
        out = program.run({"tokens": ids, "k_cache": self.empty_cache, "v_cache": self.empty_cache}, dims={"r": 1})
        column, n = len(self.rows), len(ids)
        for layer in range(c.num_hidden_layers):
            self.k[1:1 + n, column, layer] = out[f"k{layer}"]
            self.v[1:1 + n, column, layer] = out[f"v{layer}"]
        sampler = Sampler(request.params)
        token = sampler(out["logits"][-1], request.prompt)
        now = time.perf_counter()
        self.metrics.prompt_tokens.inc(n)
        self.metrics.time_to_first_token.observe(now - request.submitted)
        row = _Running(request, sampler, [*request.prompt, token], seen=n, pending=token, last_token_at=now)
        self.rows.append(row)
        if not self._emit(row, token):
            self._finish(len(self.rows) - 1, self._end_reason(row, token))

    def _decode_step(self) -> None:
        c = self.config
        b = len(self.rows)
        seen = np.array([row.seen for row in self.rows], np.int32)
        length = -(-(int(seen.max()) + 1) // CACHE_BLOCK) * CACHE_BLOCK
        started = time.perf_counter()
        out = self.batched.run({"tokens": np.array([row.pending for row in self.rows], np.int32), "seen": seen,
                                "k_slots": self.k[:length], "v_slots": self.v[:length]})
        self.metrics.batch_size.observe(b)
        self.metrics.step_seconds.observe(time.perf_counter() - started)
        columns = np.arange(b)
        for layer in range(c.num_hidden_layers):
            self.k[seen + 1, columns, layer] = out[f"k{layer}"]
            self.v[seen + 1, columns, layer] = out[f"v{layer}"]
        now = time.perf_counter()
        finished = []
        for i, row in enumerate(self.rows):
            row.seen += 1
            token = row.sampler(out["logits"][i], row.context)
            row.context.append(token)
            row.pending = token
            row.generated += 1
            self.metrics.inter_token_latency.observe(now - row.last_token_at)
            row.last_token_at = now
            if not self._emit(row, token):
                finished.append((i, self._end_reason(row, token)))
        for i, reason in reversed(finished):
            self._finish(i, reason)

    def _emit(self, row: _Running, token: int) -> bool:
        """Deliver `token` unless it ends the sequence; False when the sequence is done."""
        if token in row.request.stop_ids:
            return False
        row.request.deliver(Event(token=token))
        self.metrics.generated_tokens.inc()
        return row.generated < row.request.max_tokens and row.seen + 1 < self.context

    @staticmethod
    def _end_reason(row: _Running, token: int) -> str:
        return "stop" if token in row.request.stop_ids else "length"

    def _finish(self, i: int, reason: str, message: str = "") -> None:
        """End row i: tell its request, and move the last row's cache column into its place."""
        row = self.rows[i]
        last = len(self.rows) - 1
        if i != last:
            top = self.rows[last].seen + 1
            self.k[:top, i] = self.k[:top, last]
            self.v[:top, i] = self.v[:top, last]
            self.rows[i] = self.rows[last]
        self.rows.pop()
        self.metrics.finished(reason, time.perf_counter() - row.request.submitted)
        if reason != "cancelled":
            row.request.deliver(Event(finish=reason, message=message))
