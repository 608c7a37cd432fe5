"""Normalizations, convolutions and pooling against torch.nn.functional."""
import itertools

import pytest
import torch.nn.functional as F

import luminar as lm
from conftest import check, rand

CONV_TOL = dict(rtol=1e-4, atol=1e-5)  # float32 sums in a different order than torch's kernels


def nnf(name, **kwargs):
    """One function for both sides: lm.NAME on GraphTensors, torch.nn.functional.NAME on torch tensors."""
    def call(*args):
        return getattr(lm if isinstance(args[0], lm.GraphTensor) else F, name)(*args, **kwargs)
    return call


def graph_tensors(*shapes):
    g = lm.Graph()
    return [g.tensor(f"t{i}", s) for i, s in enumerate(shapes)]


# -- layer_norm / rms_norm --------------------------------------------------------------------------
@pytest.mark.parametrize("normalized_shape", [(6,), (3, 6)])
@pytest.mark.parametrize("affine", ["none", "weight", "weight+bias"])
def test_layer_norm(normalized_shape, affine, backend):
    params = [rand(*normalized_shape, seed=1), rand(*normalized_shape, seed=2)]
    params = params[:{"none": 0, "weight": 1, "weight+bias": 2}[affine]]
    check(lambda x, *p: nnf("layer_norm")(x, normalized_shape, *p), rand(2, 3, 6, high=3.0), *params,
          backend=backend, rtol=1e-4, atol=1e-5)


def test_norms_accept_an_int_normalized_shape(backend):
    # like torch.nn.LayerNorm / RMSNorm (F.layer_norm itself wants a list)
    check(lambda x: lm.layer_norm(x, 6), rand(2, 6), backend=backend, rtol=1e-4, atol=1e-5,
          torch_fn=lambda x: F.layer_norm(x, (6,)))
    check(lambda x: lm.rms_norm(x, 6), rand(2, 6), backend=backend, rtol=1e-4, atol=1e-5,
          torch_fn=lambda x: F.rms_norm(x, (6,)))


def test_layer_norm_eps_and_symbolic_sequence(backend):
    check(lambda x, w, b: nnf("layer_norm", eps=1e-2)(x, (6,), w, b), rand(2, 5, 6), rand(6, seed=1),
          rand(6, seed=2), backend=backend, rtol=1e-4, atol=1e-5, symbolic={0: (None, "s", None)})


def test_layer_norm_over_a_symbolic_dim(backend):
    # normalized_shape may name the symbolic dim itself: the mean divides by s at run time
    check(lambda x: nnf("layer_norm")(x, tuple(x.shape[-2:])), rand(2, 5, 6), backend=backend,
          rtol=1e-4, atol=1e-5, symbolic={0: (None, "s", None)})


def test_layer_norm_of_a_transposed_view(backend):
    check(lambda x: nnf("layer_norm")(x.transpose(1, 2), (4,)), rand(2, 4, 3), backend=backend, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("eps", [None, 1e-3])
@pytest.mark.parametrize("with_weight", [False, True])
def test_rms_norm(eps, with_weight, backend):
    params = [rand(6, seed=1)] if with_weight else []
    check(lambda x, *w: nnf("rms_norm", eps=eps)(x, (6,), *w), rand(2, 5, 6), *params, backend=backend,
          rtol=1e-4, atol=1e-5, symbolic={0: (None, "s", None)})


def test_rms_norm_default_eps_is_float32_eps(backend):
    # a tiny input makes eps dominate, so only torch's exact default matches
    check(lambda x: nnf("rms_norm")(x, (4,)), rand(3, 4, low=-1e-4, high=1e-4), backend=backend, rtol=1e-4)


@pytest.mark.parametrize("name", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("shapes, normalized_shape, message", [
    ([(2, 3, 6)], (3, 5), r"input shape \(2, 3, 6\) does not end with normalized_shape \(3, 5\)"),
    ([(6,)], (2, 6), r"does not end with normalized_shape"),
    ([(2, 6)], (), r"at least one dimension"),
    ([(2, 6), (5,)], (6,), r"weight must have shape normalized_shape \(6,\), got \(5,\)"),
])
def test_norms_reject_bad_shapes(name, shapes, normalized_shape, message):
    with pytest.raises(lm.ShapeError, match=f"{name}: .*{message}"):
        getattr(lm, name)(graph_tensors(*shapes)[0], normalized_shape, *graph_tensors(*shapes)[1:])


def test_layer_norm_rejects_a_bias_of_the_wrong_shape():
    x, w, b = graph_tensors((2, 6), (6,), (1,))
    with pytest.raises(lm.ShapeError, match=r"layer_norm: bias must have shape normalized_shape \(6,\), got \(1,\)"):
        lm.layer_norm(x, 6, w, b)


# -- conv2d / conv1d / conv3d -----------------------------------------------------------------------
CONV2D_GRID = [(s, p, d, g) for s, p, d, g in itertools.product(
    [1, 2, (2, 1)], [0, 1, (2, 0), "valid", "same"], [1, 2], [1, 2]) if not (p == "same" and s != 1)]


@pytest.mark.filterwarnings("ignore:Using padding='same'")  # torch's note about its own copy
@pytest.mark.parametrize("stride, padding, dilation, groups", CONV2D_GRID)
def test_conv2d_grid(stride, padding, dilation, groups, backend):
    # a non-square (3, 2) kernel on a non-square image; 4 in-channels, 6 out-channels
    x, w = rand(2, 4, 7, 6), rand(6, 4 // groups, 3, 2, seed=1)
    check(nnf("conv2d", stride=stride, padding=padding, dilation=dilation, groups=groups), x, w,
          backend=backend, **CONV_TOL)


@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("with_bias", [True, False])
def test_conv2d_bias_and_unbatched_input(batched, with_bias, backend):
    x = rand(2, 3, 6, 5) if batched else rand(3, 6, 5)
    params = [rand(4, 3, 3, 3, seed=1)] + ([rand(4, seed=2)] if with_bias else [])
    check(nnf("conv2d", padding=1), x, *params, backend=backend, **CONV_TOL)


@pytest.mark.parametrize("multiplier", [1, 2])
def test_conv2d_depthwise(multiplier, backend):
    check(nnf("conv2d", padding="same", groups=4), rand(2, 4, 6, 6), rand(4 * multiplier, 1, 3, 3, seed=1),
          rand(4 * multiplier, seed=2), backend=backend, **CONV_TOL)


def test_conv2d_even_kernel_same_padding_puts_the_extra_row_after(backend):
    check(nnf("conv2d", padding="same", dilation=(1, 3)), rand(1, 2, 5, 7), rand(3, 2, 4, 2, seed=1),
          backend=backend, **CONV_TOL)


def test_conv2d_of_a_transposed_view(backend):
    check(lambda x, w: nnf("conv2d", stride=2, padding=1)(x.transpose(2, 3), w), rand(2, 3, 5, 7),
          rand(4, 3, 3, 3, seed=1), backend=backend, **CONV_TOL)


def test_conv2d_with_symbolic_batch_and_image_size(backend):
    check(nnf("conv2d", stride=2, padding=1, groups=2), rand(2, 4, 7, 6), rand(6, 2, 3, 3, seed=1),
          rand(6, seed=2), backend=backend, symbolic={0: ("n", None, "h", "w")}, **CONV_TOL)


@pytest.mark.parametrize("stride, padding, dilation, groups", [
    (1, 0, 1, 1), (2, 1, 1, 1), (1, "same", 2, 1), (1, "same", 1, 3), (3, 2, 2, 3), (1, "valid", 1, 1),
])
@pytest.mark.parametrize("batched", [True, False])
def test_conv1d(stride, padding, dilation, groups, batched, backend):
    x = rand(2, 6, 11) if batched else rand(6, 11)
    check(nnf("conv1d", stride=stride, padding=padding, dilation=dilation, groups=groups), x,
          rand(9, 6 // groups, 4, seed=1), rand(9, seed=2), backend=backend, **CONV_TOL)


def test_conv1d_with_symbolic_length(backend):
    check(nnf("conv1d", padding=1), rand(2, 3, 9), rand(4, 3, 3, seed=1), backend=backend,
          symbolic={0: ("b", None, "s")}, **CONV_TOL)


def test_conv3d(backend):
    check(nnf("conv3d", stride=(1, 2, 1), padding=1, groups=2), rand(1, 4, 4, 5, 3), rand(2, 2, 3, 2, 2, seed=1),
          rand(2, seed=2), backend=backend, **CONV_TOL)


@pytest.mark.parametrize("shapes, kwargs, message", [
    ([(2, 5, 8, 8), (4, 3, 3, 3)], {},
     r"conv2d: expected input with 3 channels \(weight \(4, 3, 3, 3\), groups=1\), got 5 channels"),
    ([(2, 6, 8, 8), (4, 3, 3, 3)], {"groups": 3}, r"conv2d: groups=3 must divide out_channels"),
    ([(2, 5, 8, 8), (4, 2, 3, 3)], {"groups": 2}, r"conv2d: expected input with 4 channels .* got 5 channels"),
    ([(2, 3, 4, 4), (4, 3, 7, 3)], {"padding": 1}, r"conv2d: padded input size \(6, 6\) is smaller than the kernel"),
    ([(2, 3, 4, 4), (4, 3, 3, 3)], {"dilation": 3}, r"smaller than the kernel \(3, 3\) \(dilation \(3, 3\)\)"),
    ([(3, 8), (4, 3, 3, 3)], {}, r"conv2d: expected 3-D \(unbatched\) or 4-D \(batched\) input, got 2-D"),
    ([(1, 2, 3, 8, 8), (4, 3, 3, 3)], {}, r"conv2d: expected 3-D .* got 5-D"),
    ([(2, 3, 8, 8), (4, 3, 3)], {}, r"conv2d: weight must be 4-D"),
    ([(2, 3, 8, 8), (4, 3, 3, 3), (3,)], {}, r"conv2d: bias must have shape \(4,\), got \(3,\)"),
    ([(2, 3, 8, 8), (4, 3, 3, 3)], {"groups": 0}, r"conv2d: groups must be a positive int"),
    ([(2, 3, 8, 8), (4, 3, 3, 3)], {"stride": 2, "padding": "same"}, r"'same' is not supported for strided"),
    ([(2, 3, 8, 8), (4, 3, 3, 3)], {"padding": "full"}, r"padding must be an int, ints, 'valid' or 'same'"),
    ([(2, 3, 8, 8), (4, 3, 3, 3)], {"stride": (1, 2, 3)}, r"stride must be an int or 2 ints"),
    ([(2, 3, 8, 8), (4, 3, 3, 3)], {"padding": -1}, r"padding must be >= 0"),
    ([(2, 3, 8), (4, 3, 3, 3)], {}, r"conv1d: weight must be 3-D"),
])
def test_conv_rejects_bad_arguments(shapes, kwargs, message):
    op = "conv1d" if "conv1d" in message else "conv2d"
    with pytest.raises(lm.ShapeError, match=message):
        getattr(lm, op)(*graph_tensors(*shapes), **kwargs)


# -- pooling ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kernel, stride, padding, dilation", [
    (2, None, 0, 1), (3, 2, 1, 1), ((3, 2), (1, 2), (1, 0), 1), (2, 1, 1, 2), (3, 2, 0, (1, 2)),
])
@pytest.mark.parametrize("ceil_mode", [False, True])
def test_max_pool2d(kernel, stride, padding, dilation, ceil_mode, backend):
    check(nnf("max_pool2d", kernel_size=kernel, stride=stride, padding=padding, dilation=dilation,
              ceil_mode=ceil_mode), rand(2, 3, 8, 7), backend=backend)


@pytest.mark.parametrize("kernel", [2, (2, 3), (4, 1)])
def test_max_pool2d_with_windows_tiling_the_input(kernel, backend):
    """stride == kernel over divisible sizes: the windows are a reshape of the input (also transposed)."""
    pool = nnf("max_pool2d", kernel_size=kernel)
    check(pool, rand(2, 3, 8, 6), backend=backend)
    check(lambda x: pool(x.transpose(2, 3)), rand(2, 3, 6, 8), backend=backend)


def test_max_pool2d_padding_never_wins_over_negative_inputs(backend):
    check(nnf("max_pool2d", kernel_size=3, stride=2, padding=1), rand(1, 2, 5, 5, low=-1e30, high=-1e29),
          backend=backend)


@pytest.mark.parametrize("kernel, stride, padding", [(2, None, 0), (3, 2, 1), ((3, 2), (2, 1), (1, 1))])
@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("count_include_pad", [True, False])
def test_avg_pool2d(kernel, stride, padding, ceil_mode, count_include_pad, backend):
    check(nnf("avg_pool2d", kernel_size=kernel, stride=stride, padding=padding, ceil_mode=ceil_mode,
              count_include_pad=count_include_pad), rand(2, 3, 8, 7), backend=backend)


def test_avg_pool2d_divisor_override(backend):
    check(nnf("avg_pool2d", kernel_size=3, stride=2, padding=1, divisor_override=5), rand(2, 3, 7, 7),
          backend=backend)


@pytest.mark.parametrize("name", ["max_pool2d", "avg_pool2d"])
def test_pool2d_unbatched_transposed_and_symbolic(name, backend):
    pool = nnf(name, kernel_size=3, stride=2, padding=1)
    check(lambda x: pool(x.transpose(1, 2)), rand(3, 6, 7), backend=backend)
    check(pool, rand(2, 3, 7, 6), backend=backend, symbolic={0: ("n", None, "h", "w")})


@pytest.mark.parametrize("name, kwargs", [
    ("max_pool1d", dict(kernel_size=3, stride=2, padding=1, dilation=2)),
    ("max_pool1d", dict(kernel_size=2, ceil_mode=True)),
    ("avg_pool1d", dict(kernel_size=3, stride=2, padding=1, count_include_pad=False)),
    ("avg_pool1d", dict(kernel_size=4, stride=3, padding=2, ceil_mode=True)),
])
@pytest.mark.parametrize("batched", [True, False])
def test_pool1d(name, kwargs, batched, backend):
    check(nnf(name, **kwargs), rand(2, 3, 9) if batched else rand(3, 9), backend=backend)


@pytest.mark.parametrize("output_size", [1, (2, 3), (3, None), (5, 4), (4, 7)])
def test_adaptive_avg_pool2d(output_size, backend):
    # (5, 4) and (4, 7) do not divide (7, 6): windows of different sizes, some overlapping
    check(nnf("adaptive_avg_pool2d", output_size=output_size), rand(2, 3, 7, 6), backend=backend)


def test_adaptive_avg_pool_with_symbolic_size(backend):
    check(nnf("adaptive_avg_pool1d", output_size=3), rand(3, 8), backend=backend, symbolic={0: (None, "s")})
    check(nnf("adaptive_avg_pool2d", output_size=(2, 2)), rand(2, 3, 5, 7), backend=backend,
          symbolic={0: ("n", None, "h", "w")})


@pytest.mark.parametrize("call, error, message", [
    (lambda x: lm.max_pool2d(x, 2, padding=2), lm.ShapeError, r"max_pool2d: padding must be at most half"),
    (lambda x: lm.avg_pool2d(x, 3, padding=(1, 2)), lm.ShapeError, r"avg_pool2d: padding must be at most half"),
    (lambda x: lm.max_pool2d(x, 9), lm.ShapeError, r"max_pool2d: padded input size \(6, 6\) is smaller"),
    (lambda x: lm.max_pool2d(x, (2, 2, 2)), lm.ShapeError, r"kernel_size must be an int or 2 ints"),
    (lambda x: lm.max_pool2d(x, 2, stride=0), lm.ShapeError, r"stride must be >= 1"),
    (lambda x: lm.max_pool1d(x, 2), lm.ShapeError, r"max_pool1d: expected 2-D \(unbatched\) or 3-D"),
    (lambda x: lm.avg_pool2d(x, 2, divisor_override=0), lm.ShapeError, r"divisor_override must be a positive"),
    (lambda x: lm.max_pool2d(x, 2, return_indices=True), lm.UnsupportedError, r"return_indices"),
    (lambda x: lm.adaptive_avg_pool2d(x, (2, 0)), lm.ShapeError, r"output_size must be a positive int"),
])
def test_pool_rejects_bad_arguments(call, error, message):
    with pytest.raises(error, match=message):
        call(graph_tensors((2, 3, 6, 6))[0])


def test_ceil_mode_needs_known_spatial_sizes():
    x = lm.Graph().tensor("x", (2, 3, "h", 8))
    with pytest.raises(lm.UnsupportedError, match="ceil_mode=True needs known spatial sizes"):
        lm.max_pool2d(x, 2, ceil_mode=True)
