"""Training: optimizers as graph updates, learning-rate schedules, gradient clipping, and
TrainStep, which compiles forward + backward + update into one program.

Mirrors torch.optim (SGD, Adam, AdamW), torch.optim.lr_scheduler (StepLR, CosineAnnealingLR,
LinearLR, LambdaLR, SequentialLR) and torch.nn.utils.clip_grad_norm_.
"""
from .clip import clip_grad_norm
from .lr_scheduler import CosineAnnealingLR, LambdaLR, LinearLR, LRScheduler, SequentialLR, StepLR, warmup_cosine
from .optimizers import SGD, Adam, AdamW, Optimizer
from .train import TrainStep

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "LRScheduler", "LambdaLR", "StepLR", "CosineAnnealingLR",
           "LinearLR", "SequentialLR", "warmup_cosine", "clip_grad_norm", "TrainStep"]
