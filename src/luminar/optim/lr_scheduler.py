"""Learning-rate schedules: Python objects giving the learning rate of each optimizer step.

They mirror torch.optim.lr_scheduler. `schedule(step)` is the learning rate torch's scheduler
holds after `step` calls of `scheduler.step()`, i.e. the lr of the (step + 1)-th optimizer step
in the usual loop (optimizer.step(); scheduler.step()). The lr is a graph input, so a schedule
changes it per step without recompiling; `TrainStep` feeds it.

    opt = AdamW(lr=3e-4)
    warmup = LinearLR(opt, start_factor=0.1, total_iters=100)
    cosine = CosineAnnealingLR(opt, T_max=900, eta_min=1e-5)
    schedule = SequentialLR(opt, [warmup, cosine], milestones=[100])
    schedule(0), schedule(100), schedule(999)

Deviation: each schedule is computed in closed form from the step (stateless, so a resumed run
needs only the step count). torch updates most of them recursively from the previous lr; the two
agree to rounding (about 1e-15 relative). Like torch, a schedule's base lr is its optimizer's lr
(a plain number is accepted too).
"""
from __future__ import annotations

import math
import operator
from bisect import bisect_right
from typing import Callable

from ..errors import ValueDomainError


class LRScheduler:
    """Base class: holds the base learning rate; subclasses define `factor` or `__call__`."""

    def __init__(self, optimizer):
        base = getattr(optimizer, "lr", optimizer)
        if isinstance(base, bool) or not isinstance(base, (int, float)) or not math.isfinite(base) or base < 0:
            raise ValueDomainError(f"{type(self).__name__}: expected an optimizer or a base learning rate >= 0, "
                                   f"got {optimizer!r}")
        self.base_lr = float(base)

    def __call__(self, step: int) -> float:
        """The learning rate after `step` scheduler steps (step 0: before any)."""
        return self.base_lr * self.factor(_check_step(self, step))

    def factor(self, step: int) -> float:
        raise NotImplementedError

    def __repr__(self):
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"


class LambdaLR(LRScheduler):
    """torch.optim.lr_scheduler.LambdaLR: base_lr * lr_lambda(step)."""

    def __init__(self, optimizer, lr_lambda: Callable[[int], float]):
        super().__init__(optimizer)
        if not callable(lr_lambda):
            raise ValueDomainError(f"LambdaLR: lr_lambda must be callable, got {lr_lambda!r}")
        self.lr_lambda = lr_lambda

    def factor(self, step):
        return float(self.lr_lambda(step))


class StepLR(LRScheduler):
    """torch.optim.lr_scheduler.StepLR: base_lr * gamma ** (step // step_size)."""

    def __init__(self, optimizer, step_size: int, gamma: float = 0.1):
        super().__init__(optimizer)
        self.step_size = _check_int(self, "step_size", step_size, low=1)
        self.gamma = _check_float(self, "gamma", gamma)

    def factor(self, step):
        return self.gamma ** (step // self.step_size)


class CosineAnnealingLR(LRScheduler):
    """torch.optim.lr_scheduler.CosineAnnealingLR (SGDR without restarts):
    eta_min + (base_lr - eta_min) * (1 + cos(pi * step / T_max)) / 2. Past T_max the cosine
    continues (the lr rises again with period 2 * T_max), as torch's does."""

    def __init__(self, optimizer, T_max: int, eta_min: float = 0.0):
        super().__init__(optimizer)
        self.T_max = _check_int(self, "T_max", T_max, low=1)
        self.eta_min = _check_float(self, "eta_min", eta_min)

    def __call__(self, step):
        step = _check_step(self, step)
        if step == 0:
            return self.base_lr  # torch's initial lr, exactly
        return self.eta_min + (self.base_lr - self.eta_min) * (1 + math.cos(math.pi * step / self.T_max)) / 2


class LinearLR(LRScheduler):
    """torch.optim.lr_scheduler.LinearLR (linear warmup or decay): the factor moves linearly
    from start_factor to end_factor over total_iters steps, then stays at end_factor."""

    def __init__(self, optimizer, start_factor: float = 1.0 / 3, end_factor: float = 1.0, total_iters: int = 5):
        super().__init__(optimizer)
        self.start_factor = _check_float(self, "start_factor", start_factor)
        self.end_factor = _check_float(self, "end_factor", end_factor)
        if not 0 < self.start_factor <= 1:
            raise ValueDomainError(f"LinearLR: start_factor must be in (0, 1], got {start_factor}")
        if not 0 <= self.end_factor <= 1:
            raise ValueDomainError(f"LinearLR: end_factor must be in [0, 1], got {end_factor}")
        self.total_iters = _check_int(self, "total_iters", total_iters, low=1)

    def factor(self, step):
        progress = min(self.total_iters, step) / self.total_iters
        return self.start_factor + (self.end_factor - self.start_factor) * progress


class SequentialLR(LRScheduler):
    """torch.optim.lr_scheduler.SequentialLR: `schedulers[k]` runs from `milestones[k - 1]` on,
    restarted at its own step 0 there (warmup, then cosine: the composition most training uses)."""

    def __init__(self, optimizer, schedulers: list, milestones: list[int]):
        super().__init__(optimizer)
        schedulers, milestones = list(schedulers), list(milestones)
        if not schedulers or not all(callable(s) for s in schedulers):
            raise ValueDomainError(f"SequentialLR: expected at least one schedule, got {schedulers!r}")
        if len(milestones) != len(schedulers) - 1:
            raise ValueDomainError(f"SequentialLR: {len(schedulers)} schedulers need {len(schedulers) - 1} "
                                   f"milestones, got {len(milestones)}")
        milestones = [_check_int(self, "milestone", m, low=1) for m in milestones]
        if milestones != sorted(set(milestones)):
            raise ValueDomainError(f"SequentialLR: milestones must be strictly increasing, got {milestones}")
        self.schedulers, self.milestones = schedulers, milestones

    def __call__(self, step):
        step = _check_step(self, step)
        index = bisect_right(self.milestones, step)
        start = self.milestones[index - 1] if index else 0
        return self.schedulers[index](step - start)


def warmup_cosine(optimizer, warmup_steps: int, total_steps: int, start_factor: float = 1e-3,
                  eta_min: float = 0.0) -> SequentialLR:
    """Linear warmup from start_factor * lr to lr over `warmup_steps`, then cosine annealing to
    eta_min at `total_steps`: SequentialLR([LinearLR, CosineAnnealingLR], [warmup_steps])."""
    warmup_steps = _check_int(None, "warmup_steps", warmup_steps, low=1)
    total_steps = _check_int(None, "total_steps", total_steps, low=warmup_steps + 1)
    return SequentialLR(optimizer, [LinearLR(optimizer, start_factor, 1.0, warmup_steps),
                                    CosineAnnealingLR(optimizer, total_steps - warmup_steps, eta_min)],
                        milestones=[warmup_steps])


def _owner(schedule) -> str:
    return type(schedule).__name__ if schedule is not None else "warmup_cosine"


def _check_step(schedule, step) -> int:
    return _check_int(schedule, "step", step, low=0)


def _check_int(schedule, what: str, value, low: int) -> int:
    """`value` as an int >= low (numpy integers accepted, bools and floats not)."""
    try:
        number = operator.index(value) if not isinstance(value, bool) else None
    except TypeError:
        number = None
    if number is None:
        raise ValueDomainError(f"{_owner(schedule)}: {what} must be an int, got {value!r}")
    if number < low:
        raise ValueDomainError(f"{_owner(schedule)}: {what} must be >= {low}, got {value}")
    return number


def _check_float(schedule, what: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueDomainError(f"{_owner(schedule)}: {what} must be a finite number, got {value!r}")
    return float(value)
