"""The server's metrics in Prometheus' text exposition format (GET /metrics).

Counters, gauges and histograms with fixed buckets, updated from the engine thread and the
event loop (a lock each), rendered by `Metrics.render()`.
"""
from __future__ import annotations

import threading

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


class Counter:
    kind = "counter"

    def __init__(self, name: str, help: str):
        self.name, self.help, self.value, self.lock = name, help, 0.0, threading.Lock()

    def inc(self, amount: float = 1.0) -> None:
        with self.lock:
            self.value += amount

    def samples(self) -> list[str]:
        return [f"{self.name} {self.value:g}"]


class Gauge(Counter):
    kind = "gauge"

    def set(self, value: float) -> None:
        with self.lock:
            self.value = value


class LabeledCounter(Counter):
    """A counter per value of one label (requests by status code, finishes by reason)."""

    def __init__(self, name: str, help: str, label: str):
        super().__init__(name, help)
        self.label, self.values = label, {}

    def inc(self, key: str = "", amount: float = 1.0) -> None:
        with self.lock:
            self.values[key] = self.values.get(key, 0.0) + amount

    def samples(self) -> list[str]:
        with self.lock:
            return [f'{self.name}{{{self.label}="{key}"}} {value:g}' for key, value in sorted(self.values.items())]


class Histogram(Counter):
    kind = "histogram"

    def __init__(self, name: str, help: str, buckets=_LATENCY_BUCKETS):
        super().__init__(name, help)
        self.bounds, self.counts, self.sum, self.count = tuple(buckets), [0] * len(buckets), 0.0, 0

    def observe(self, value: float) -> None:
        with self.lock:
            for i, bound in enumerate(self.bounds):
                if value <= bound:
                    self.counts[i] += 1
            self.sum += value
            self.count += 1

    def samples(self) -> list[str]:
        with self.lock:
            lines = [f'{self.name}_bucket{{le="{bound:g}"}} {n}' for bound, n in zip(self.bounds, self.counts)]
            return lines + [f'{self.name}_bucket{{le="+Inf"}} {self.count}', f"{self.name}_sum {self.sum:g}",
                            f"{self.name}_count {self.count}"]


class Metrics:
    def __init__(self):
        self.requests = LabeledCounter("luminar_requests_total", "HTTP requests answered, by status code", "code")
        self.finishes = LabeledCounter("luminar_generations_total", "Generations ended, by reason", "reason")
        self.rejected = Counter("luminar_rejected_total", "Requests refused because the queue was full (429)")
        self.prompt_tokens = Counter("luminar_prompt_tokens_total", "Prompt tokens prefilled")
        self.generated_tokens = Counter("luminar_generated_tokens_total", "Tokens generated")
        self.queue_depth = Gauge("luminar_queue_depth", "Requests waiting for a slot")
        self.batch_size = Histogram("luminar_batch_size", "Sequences per decode step", _BATCH_BUCKETS)
        self.step_seconds = Histogram("luminar_decode_step_seconds", "Seconds per batched decode step")
        self.time_to_first_token = Histogram("luminar_time_to_first_token_seconds",
                                             "Seconds from submission to the first token")
        self.inter_token_latency = Histogram("luminar_inter_token_latency_seconds", "Seconds between tokens")
        self.request_seconds = Histogram("luminar_generation_seconds", "Seconds from submission to the end")

    def finished(self, reason: str, seconds: float) -> None:
        self.finishes.inc(reason)
        self.request_seconds.observe(seconds)

    def render(self) -> str:
        lines = []
        for metric in vars(self).values():
            lines += [f"# HELP {metric.name} {metric.help}", f"# TYPE {metric.name} {metric.kind}", *metric.samples()]
        return "\n".join(lines) + "\n"
