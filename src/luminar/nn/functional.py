"""torch.nn.functional's names in one place: ``import luminar.nn.functional as F``.

Everything here is the op library's function of the same name (also available as luminar.NAME),
plus ``dropout``, which takes an explicit seed (see luminar.nn.dropout).
"""
import luminar as _lm

from .dropout import dropout

_NAMES = (
    # activations
    "relu", "relu6", "leaky_relu", "elu", "selu", "celu", "gelu", "silu", "mish", "softplus", "softsign",
    "hardtanh", "hardsigmoid", "hardswish", "logsigmoid", "sigmoid", "tanh", "softmax", "log_softmax",
    # layers
    "linear", "embedding", "one_hot", "layer_norm", "rms_norm", "conv1d", "conv2d", "conv3d", "max_pool1d",
    "max_pool2d", "avg_pool1d", "avg_pool2d", "adaptive_avg_pool1d", "adaptive_avg_pool2d", "pad",
    # losses
    "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "cross_entropy", "nll_loss",
    "binary_cross_entropy_with_logits", "kl_div",
)
globals().update({name: getattr(_lm, name) for name in _NAMES})
__all__ = [*_NAMES, "dropout"]
