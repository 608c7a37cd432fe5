"""Token sampling and text streaming for generation: pure numpy over one row of logits.

The order of the logits processors is Hugging Face's (`generate` with `do_sample=True`):
repetition penalty, then temperature, then top-k, then top-p, then a draw. Temperature 0
means greedy (the argmax after the repetition penalty), as in llama.cpp's `--temp 0`.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import ValueDomainError


@dataclass(frozen=True)
class SamplingParams:
    """How to pick the next token. Defaults are greedy decoding."""
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = no limit
    top_p: float = 1.0  # 1 = no limit
    repetition_penalty: float = 1.0  # 1 = none; > 1 discourages tokens already in the context
    seed: int | None = None

    def __post_init__(self):
        checks = [("temperature", self.temperature >= 0, ">= 0"), ("top_k", self.top_k >= 0, ">= 0"),
                  ("top_p", 0 < self.top_p <= 1, "in (0, 1]"),
                  ("repetition_penalty", self.repetition_penalty > 0, "> 0")]
        for name, ok, want in checks:
            if not ok:
                raise ValueDomainError(f"sampling: {name} must be {want}, got {getattr(self, name)!r}")


def apply_repetition_penalty(logits: np.ndarray, previous: Sequence[int], penalty: float) -> np.ndarray:
    """CTRL's penalty (transformers' RepetitionPenaltyLogitsProcessor): each token id seen so far
    has its logit divided by `penalty` if positive, multiplied by it if negative."""
    if penalty == 1.0 or len(previous) == 0:
        return logits
    out = logits.copy()
    seen = np.unique(np.asarray(previous, dtype=np.int64))
    seen = seen[(seen >= 0) & (seen < len(out))]
    out[seen] = np.where(out[seen] > 0, out[seen] / penalty, out[seen] * penalty)
    return out


def probabilities(logits: np.ndarray, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> np.ndarray:
    """The sampling distribution (float64, sums to 1) after temperature, top-k and top-p.

    top-k keeps the k largest logits (ties at the k-th value are kept too, as in transformers);
    top-p keeps the smallest set of most likely tokens whose probability mass reaches top_p.
    """
    if temperature <= 0:
        raise ValueDomainError(f"probabilities: temperature must be > 0, got {temperature} (0 means greedy: use argmax)")
    z = np.asarray(logits, dtype=np.float64) / temperature
    if 0 < top_k < len(z):
        kth = np.partition(z, -top_k)[-top_k]
        z = np.where(z < kth, -np.inf, z)
    p = np.exp(z - z.max())
    p /= p.sum()
    if top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        mass_before = np.cumsum(p[order]) - p[order]  # mass of the strictly more likely tokens
        dropped = order[mass_before >= top_p]
        p[dropped] = 0.0
        p /= p.sum()
    return p


class Sampler:
    """Picks token ids from logits rows with SamplingParams and its own seeded numpy Generator."""

    def __init__(self, params: SamplingParams | None = None):
        self.params = params or SamplingParams()
        self.rng = np.random.default_rng(self.params.seed)

    def __call__(self, logits: np.ndarray, previous: Sequence[int] = ()) -> int:
        p = self.params
        logits = apply_repetition_penalty(np.asarray(logits, dtype=np.float32), previous, p.repetition_penalty)
        if p.temperature == 0:
            return int(np.argmax(logits))
        probs = probabilities(logits, p.temperature, p.top_k, p.top_p)
        # inverse CDF with one uniform draw: deterministic for a seed, independent of numpy's choice()
        index = int(np.searchsorted(np.cumsum(probs), self.rng.random() * probs.sum(), side="right"))
        return min(index, len(probs) - 1)


def generate_ids(next_logits: Callable[[list[int]], np.ndarray], prompt: Sequence[int], max_new_tokens: int,
                 sampler: Sampler, stop_ids: Iterable[int] = ()) -> Iterator[int]:
    """Yield up to `max_new_tokens` sampled ids, stopping after a stop id (which is not yielded).

    `next_logits(new_ids)` feeds the ids not yet seen by the model (the whole prompt first, then
    one token per step) and returns the logits row for the last position.
    """
    stop_ids = set(stop_ids)
    context = list(prompt)
    pending = list(prompt)
    for _ in range(max_new_tokens):
        token = sampler(next_logits(pending), context)
        if token in stop_ids:
            return
        yield token
        context.append(token)
        pending = [token]


def stop_at(pieces: Iterable[str], stop: Sequence[str] = ()) -> Iterator[str]:
    """Pass text pieces through, ending just before the first occurrence of any stop string.

    Text that could still be the start of a stop string is held back until it cannot.
    """
    stop = [s for s in stop if s]
    pending = ""  # received, not yet yielded
    for piece in pieces:
        pending += piece
        found = [i for i in (pending.find(s) for s in stop) if i >= 0]
        if found:
            if min(found):
                yield pending[:min(found)]
            return
        ready = len(pending) - _held_back(pending, stop)
        if ready:
            yield pending[:ready]
            pending = pending[ready:]
    if pending:
        yield pending


def _held_back(text: str, stop: Sequence[str]) -> int:
    """The length of the longest end of `text` that is a proper prefix of some stop string."""
    longest = 0
    for s in stop:
        for n in range(min(len(s) - 1, len(text)), longest, -1):
            if s.startswith(text[-n:]):
                longest = n
                break
    return longest
