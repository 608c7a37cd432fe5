"""Loss modules (torch.nn.MSELoss, CrossEntropyLoss, ...): the functions of library/losses.py with
their options stored. Class weights and pos_weight are buffers, as in torch, so they appear in
state_dict and become graph inputs when the loss is applied."""
from __future__ import annotations

from ..library import losses
from .module import Module


class _Loss(Module):
    """A loss with a reduction ("none", "mean", "sum"); forward(input, target)."""

    function = None  # the library function
    options: tuple[str, ...] = ()  # keyword options forwarded besides reduction
    tensors: tuple[str, ...] = ()  # array options registered as buffers

    def __init__(self, reduction: str = "mean", *, prefix: str = "", **options):
        super().__init__(prefix=prefix)
        self.reduction = reduction
        for name, value in options.items():
            if name in self.tensors:
                self.register_buffer(name, value)
            else:
                setattr(self, name, value)

    def forward(self, input, target):
        graph = input.graph
        kwargs = {name: getattr(self, name) for name in self.options}
        kwargs.update({name: None if self._buffers.get(name) is None else self.graph_tensor(graph, name)
                       for name in self.tensors})
        return type(self).function(input, target, reduction=self.reduction, **kwargs)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}"


class MSELoss(_Loss):
    """torch.nn.MSELoss(reduction)."""
    function = staticmethod(losses.mse_loss)


class L1Loss(_Loss):
    """torch.nn.L1Loss(reduction)."""
    function = staticmethod(losses.l1_loss)


class SmoothL1Loss(_Loss):
    """torch.nn.SmoothL1Loss(reduction, beta)."""
    function, options = staticmethod(losses.smooth_l1_loss), ("beta",)

    def __init__(self, reduction: str = "mean", beta: float = 1.0, *, prefix: str = ""):
        super().__init__(reduction, prefix=prefix, beta=beta)


class HuberLoss(_Loss):
    """torch.nn.HuberLoss(reduction, delta)."""
    function, options = staticmethod(losses.huber_loss), ("delta",)

    def __init__(self, reduction: str = "mean", delta: float = 1.0, *, prefix: str = ""):
        super().__init__(reduction, prefix=prefix, delta=delta)


class CrossEntropyLoss(_Loss):
    """torch.nn.CrossEntropyLoss(weight, ignore_index, reduction, label_smoothing); weight is a buffer."""
    function = staticmethod(losses.cross_entropy)
    options, tensors = ("ignore_index", "label_smoothing"), ("weight",)

    def __init__(self, weight=None, ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0,
                 *, prefix: str = ""):
        super().__init__(reduction, prefix=prefix, weight=weight, ignore_index=ignore_index,
                         label_smoothing=label_smoothing)


class NLLLoss(_Loss):
    """torch.nn.NLLLoss(weight, ignore_index, reduction); weight is a buffer."""
    function, options, tensors = staticmethod(losses.nll_loss), ("ignore_index",), ("weight",)

    def __init__(self, weight=None, ignore_index: int = -100, reduction: str = "mean", *, prefix: str = ""):
        super().__init__(reduction, prefix=prefix, weight=weight, ignore_index=ignore_index)


class BCEWithLogitsLoss(_Loss):
    """torch.nn.BCEWithLogitsLoss(weight, reduction, pos_weight); weight and pos_weight are buffers."""
    function, tensors = staticmethod(losses.binary_cross_entropy_with_logits), ("weight", "pos_weight")

    def __init__(self, weight=None, reduction: str = "mean", pos_weight=None, *, prefix: str = ""):
        super().__init__(reduction, prefix=prefix, weight=weight, pos_weight=pos_weight)


class KLDivLoss(_Loss):
    """torch.nn.KLDivLoss(reduction, log_target)."""
    function, options = staticmethod(losses.kl_div), ("log_target",)

    def __init__(self, reduction: str = "mean", log_target: bool = False, *, prefix: str = ""):
        super().__init__(reduction, prefix=prefix, log_target=log_target)
