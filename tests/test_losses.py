"""Loss functions against torch.nn.functional: same names, arguments and results."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import luminar as lm
from conftest import check, rand, run_luminar

REDUCTIONS = ["none", "mean", "sum"]


def class_ids(*shape, classes, seed=0, dtype=np.int32):
    return np.random.default_rng(seed).integers(0, classes, size=shape).astype(dtype)


def probabilities(*shape, seed=0):
    return torch.softmax(torch.from_numpy(rand(*shape, seed=seed) * 3), dim=1 if len(shape) > 1 else 0).numpy()


# -- regression losses --------------------------------------------------------------------------------
POINTWISE = {
    "mse_loss": {}, "l1_loss": {},
    "smooth_l1_loss": {"beta": 0.5}, "smooth_l1_loss(beta=0)": {"beta": 0.0},
    "huber_loss": {"delta": 1.5},
}


@pytest.mark.parametrize("name", POINTWISE)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_pointwise_losses_match_torch(name, reduction, backend):
    """Errors on both sides of beta/delta, so both pieces of the smooth losses are exercised."""
    fn, options = name.split("(")[0], POINTWISE[name]
    check(lambda x, t: getattr(F, fn)(x, t, reduction=reduction, **options) if isinstance(x, torch.Tensor)
          else getattr(lm, fn)(x, t, reduction=reduction, **options),
          rand(4, 5, seed=1) * 3, rand(4, 5, seed=2), backend=backend)


@pytest.mark.parametrize("fn", ["mse_loss", "l1_loss", "huber_loss"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_weighted_regression_losses_match_torch(fn, reduction):
    """torch 2.13's weight: mse/l1 means divide by sum(weight), huber's by the element count."""
    check(lambda x, t, w: getattr(F if isinstance(x, torch.Tensor) else lm, fn)(x, t, reduction=reduction, weight=w),
          rand(3, 4, seed=1) * 2, rand(3, 4, seed=2), rand(3, 4, seed=3, low=0.1, high=2.0))


def test_smooth_losses_keep_infinite_errors_infinite():
    out = run_luminar(lambda x, t: lm.stack([lm.smooth_l1_loss(x, t, reduction="sum"),
                                              lm.huber_loss(x, t, reduction="sum")]),
                      np.array([np.inf, 1.0], np.float32), np.zeros(2, np.float32))
    assert np.all(np.isposinf(out))


def test_broadcast_target_warns_and_matches_torch():
    with pytest.warns(UserWarning, match="different to the input size"):
        check(lambda x, t: F.mse_loss(x, t) if isinstance(x, torch.Tensor) else lm.mse_loss(x, t),
              rand(3, 4, seed=1), rand(4, seed=2))


@pytest.mark.parametrize("size_average, reduce, expected", [(None, False, "none"), (False, None, "sum"),
                                                            (True, True, "mean"), (False, False, "none")])
def test_legacy_size_average_and_reduce(size_average, reduce, expected):
    x, t = rand(3, 4, seed=1), rand(3, 4, seed=2)
    ours = run_luminar(lambda a, b: lm.l1_loss(a, b, size_average=size_average, reduce=reduce), x, t)
    theirs = F.l1_loss(torch.from_numpy(x), torch.from_numpy(t), reduction=expected).numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)


# -- classification: class ids ------------------------------------------------------------------------
CLASS_CASES = {  # name: (input shape, target shape)
    "batched": ((6, 5), (6,)),
    "spatial": ((2, 4, 3, 2), (2, 3, 2)),
    "unbatched": ((5,), ()),
}


@pytest.mark.parametrize("case", CLASS_CASES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_cross_entropy_with_class_ids_matches_torch(case, reduction, weighted):
    shape, target_shape = CLASS_CASES[case]
    classes = shape[0] if len(shape) == 1 else shape[1]
    arrays = [rand(*shape, seed=1) * 3, class_ids(*target_shape, classes=classes)]
    if weighted:
        arrays.append(rand(classes, seed=3, low=0.2, high=2.0))
    check(lambda x, t, *w: lm.cross_entropy(x, t, *w, reduction=reduction), *arrays,
          torch_fn=lambda x, t, *w: F.cross_entropy(x, t.long(), *w, reduction=reduction), rtol=1e-5)


@pytest.mark.parametrize("ignore_index", [-100, 2])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cross_entropy_ignore_index_and_label_smoothing(ignore_index, label_smoothing, reduction, backend):
    targets = np.array([0, 2, ignore_index, 4, 2, 1], np.int32)
    options = dict(weight=None, ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing)
    check(lambda x, t, w: lm.cross_entropy(x, t, **{**options, "weight": w}),
          rand(6, 5, seed=1) * 3, targets, rand(5, seed=3, low=0.2, high=2.0), backend=backend,
          torch_fn=lambda x, t, w: F.cross_entropy(x, t.long(), **{**options, "weight": w}))


def test_cross_entropy_accepts_float_class_ids():
    targets = class_ids(6, classes=5).astype(np.float32)
    check(lambda x, t: lm.cross_entropy(x, t), rand(6, 5, seed=1), targets,
          torch_fn=lambda x, t: F.cross_entropy(x, t.long()))


def test_cross_entropy_is_stable_for_huge_logits():
    logits = np.array([[1e4, -1e4, 0.0], [-3e4, 3e4, 2e4]], np.float32)
    out = check(lambda x, t: lm.cross_entropy(x, t, reduction="none"), logits, np.array([1, 0], np.int32),
                torch_fn=lambda x, t: F.cross_entropy(x, t.long(), reduction="none"))
    assert np.all(np.isfinite(out))


def test_cross_entropy_mean_over_only_ignored_targets_is_nan_like_torch():
    out = run_luminar(lambda x, t: lm.cross_entropy(x, t), rand(3, 4), np.full(3, -100, np.int32))
    assert np.isnan(out)


@pytest.mark.parametrize("case", CLASS_CASES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_nll_loss_matches_torch(case, reduction, backend):
    shape, target_shape = CLASS_CASES[case]
    classes = shape[0] if len(shape) == 1 else shape[1]
    targets = class_ids(*target_shape, classes=classes)
    check(lambda x, t, w: lm.nll_loss(x, t, w, ignore_index=1, reduction=reduction),
          rand(*shape, seed=1), targets, rand(classes, seed=3, low=0.2, high=2.0), backend=backend,
          torch_fn=lambda x, t, w: F.nll_loss(x, t.long(), w, ignore_index=1, reduction=reduction))


# -- classification: class probabilities --------------------------------------------------------------
@pytest.mark.parametrize("shape", [(4, 5), (2, 3, 4), (5,)], ids=["batched", "spatial", "unbatched"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("label_smoothing", [0.0, 0.3])
def test_cross_entropy_with_probabilities_matches_torch(shape, reduction, label_smoothing):
    classes = shape[0] if len(shape) == 1 else shape[1]
    check(lambda x, t, w: (lm if not isinstance(x, torch.Tensor) else F).cross_entropy(
              x, t, w, reduction=reduction, label_smoothing=label_smoothing),
          rand(*shape, seed=1) * 3, probabilities(*shape, seed=2), rand(classes, seed=3, low=0.2, high=2.0))


# -- binary and divergence losses -----------------------------------------------------------------------
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weights", ["none", "weight", "pos_weight", "both"])
def test_binary_cross_entropy_with_logits_matches_torch(reduction, weights, backend):
    logits = rand(3, 4, seed=1) * 4
    logits[0, :2] = [80.0, -80.0]  # saturated sigmoid: the log-sigmoid form stays finite
    targets = (rand(3, 4, seed=2) > 0).astype(np.float32)
    weight, pos_weight = rand(3, 1, seed=3, low=0.5, high=2.0), rand(4, seed=4, low=0.5, high=3.0)

    def fn(x, t, w, pw):
        module = F if isinstance(x, torch.Tensor) else lm
        return module.binary_cross_entropy_with_logits(
            x, t, weight=w if weights in ("weight", "both") else None,
            pos_weight=pw if weights in ("pos_weight", "both") else None, reduction=reduction)
    check(fn, logits, targets, weight, pos_weight, backend=backend)


@pytest.mark.filterwarnings("ignore:reduction. 'mean' divides")  # torch's deprecation notice
@pytest.mark.parametrize("reduction", [*REDUCTIONS, "batchmean"])
@pytest.mark.parametrize("log_target", [False, True])
def test_kl_div_matches_torch(reduction, log_target, backend):
    log_input = torch.log_softmax(torch.from_numpy(rand(3, 5, seed=1) * 2), 1).numpy()
    target = probabilities(3, 5, seed=2)
    target[0, 1] = 0.0  # xlogy(0, 0) = 0
    if log_target:
        target = np.log(probabilities(3, 5, seed=2))
    check(lambda x, t: (F if isinstance(x, torch.Tensor) else lm).kl_div(x, t, reduction=reduction,
                                                                          log_target=log_target),
          log_input, target, backend=backend)


# -- symbolic batch ------------------------------------------------------------------------------------
@pytest.mark.parametrize("fn, make_target", [
    ("cross_entropy", lambda: class_ids(5, classes=4)),
    ("nll_loss", lambda: class_ids(5, classes=4)),
    ("cross_entropy_soft", lambda: probabilities(5, 4)),
    ("mse_loss", lambda: rand(5, 4, seed=2)),
    ("kl_div", lambda: probabilities(5, 4)),
])
def test_losses_with_a_symbolic_batch(fn, make_target, backend):
    """mean (and batchmean) divide by counts that are only known when the program runs."""
    target = make_target()
    name = fn.removesuffix("_soft")
    options = {"reduction": "batchmean"} if name == "kl_div" else {}

    def torch_fn(x, t):
        return getattr(F, name)(x, t.long() if t.dtype == torch.int32 else t, **options)
    check(lambda x, t: getattr(lm, name)(x, t, **options), rand(5, 4, seed=1), target, backend=backend,
          torch_fn=torch_fn, symbolic={0: ("b", None), 1: ("b",) + (None,) * (target.ndim - 1)})


# -- errors --------------------------------------------------------------------------------------------
def graph_with(*shapes):
    g = lm.Graph()
    return [g.tensor(f"t{k}", shape) for k, shape in enumerate(shapes)]


@pytest.mark.parametrize("fn", ["mse_loss", "l1_loss", "smooth_l1_loss", "cross_entropy", "nll_loss",
                                "binary_cross_entropy_with_logits", "kl_div"])
def test_unknown_reduction_is_rejected(fn):
    x, t = graph_with((3, 4), (3, 4))
    with pytest.raises(lm.ValueDomainError, match=f"{fn}: 'avg' is not a valid value for reduction"):
        getattr(lm, fn)(x, t, reduction="avg")


@pytest.mark.parametrize("call, error, message", [
    (lambda x, t, c, w: lm.mse_loss(x, t[:2]), lm.ShapeError, r"mse_loss: target shape \(2, 4\) cannot be broadcast"),
    (lambda x, t, c, w: lm.cross_entropy(x, c[:2]), lm.ShapeError, r"cross_entropy: target of class ids must have shape \(3,\)"),
    (lambda x, t, c, w: lm.nll_loss(x, t[:, :2]), lm.ShapeError, r"nll_loss: target of class ids"),
    (lambda x, t, c, w: lm.cross_entropy(x, c, weight=w[:3]), lm.ShapeError, r"weight must have one entry per class, shape \(4,\)"),
    (lambda x, t, c, w: lm.binary_cross_entropy_with_logits(x, t[0]), lm.ShapeError, r"target size \(4,\) must be the same as input size \(3, 4\)"),
    (lambda x, t, c, w: lm.binary_cross_entropy_with_logits(x, t, pos_weight=w[:3]), lm.ShapeError, "pos_weight of shape"),
    (lambda x, t, c, w: lm.mse_loss(x, t, weight=w), lm.ShapeError, r"mse_loss: weight must have the input's shape"),
    (lambda x, t, c, w: lm.smooth_l1_loss(x, t, beta=-1.0), lm.ValueDomainError, "beta must be >= 0"),
    (lambda x, t, c, w: lm.huber_loss(x, t, delta=0.0), lm.ValueDomainError, "delta must be > 0"),
    (lambda x, t, c, w: lm.cross_entropy(x, c, label_smoothing=1.5), lm.ValueDomainError, "label_smoothing must be between"),
    (lambda x, t, c, w: lm.cross_entropy(x, t, ignore_index=1), lm.UnsupportedError, "ignore_index .* probability"),
    (lambda x, t, c, w: lm.cross_entropy(x[0, 0], c[0]), lm.ShapeError, "must have a class dimension"),
    (lambda x, t, c, w: lm.mse_loss(x, np.zeros((3, 4))), lm.UnsupportedError, "target must be a GraphTensor"),
])
def test_bad_arguments_raise_luminar_errors(call, error, message):
    x, t, c, w = graph_with((3, 4), (3, 4), (3,), (4,))
    with pytest.raises(error, match=message):
        call(x, t, c, w)


def test_targets_from_another_graph_are_rejected():
    (x,), (t,) = graph_with((3, 4)), graph_with((3, 4))
    with pytest.raises(lm.ShapeError, match="different graph"):
        lm.l1_loss(x, t)
