"""luminar.grad against torch.autograd.grad: the backward graph of every op family.

Each case is one function `fn(F, *tensors)` written once for both libraries: F is the luminar
module or (for torch) torch.nn.functional with torch as fallback, and tensor methods share
their names. `grad_check` runs it in torch (float64) and in luminar, takes the loss
sum(fn(...) * cotangent) with a random cotangent, and compares the gradients of every float
input at rtol 1e-4 (atol 1e-5 times the largest gradient). Most cases run on the reference
backend; CPU_CASES and a few random graphs also run compiled.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import luminar as lm
from conftest import BACKENDS, rand


class _TorchF:
    """torch.nn.functional, falling back to torch: the torch twin of the luminar namespace."""

    def __getattr__(self, name):
        return getattr(torch.nn.functional, name, None) or getattr(torch, name)


TORCH = _TorchF()


def _torch_grads(fn, arrays, wrt, cotangent_seed):
    tensors = [torch.tensor(a, dtype=torch.float64, requires_grad=k in wrt) if a.dtype.kind == "f"
               else torch.tensor(a, dtype=torch.long) for k, a in enumerate(arrays)]
    out = fn(TORCH, *tensors)
    cotangent = rand(*out.shape, seed=cotangent_seed)
    loss = (out * torch.from_numpy(cotangent).double()).sum()
    grads = torch.autograd.grad(loss, [tensors[k] for k in wrt], allow_unused=True, materialize_grads=True)
    return cotangent, [g.numpy() for g in grads]


def grad_check(fn, *arrays, backend="reference", wrt=None, symbolic=None, rtol=1e-4, atol=1e-5, cotangent_seed=7):
    """Assert luminar.grad == torch.autograd.grad for the loss sum(fn(F, *inputs) * cotangent).

    `wrt`: positions of the inputs to differentiate (default: every float input); `symbolic`
    maps an input position to dim names (None keeps a size), as in conftest.check.
    """
    arrays = [np.asarray(a) for a in arrays]
    wrt = [k for k, a in enumerate(arrays) if a.dtype.kind == "f"] if wrt is None else list(wrt)
    cotangent, expected = _torch_grads(fn, arrays, wrt, cotangent_seed)
    g = lm.Graph()
    inputs = []
    for k, a in enumerate(arrays):
        names = (symbolic or {}).get(k, (None,) * a.ndim)
        shape = tuple(s if n is None else n for n, s in zip(names, a.shape))
        inputs.append(g.tensor(f"in{k}", shape, "float32" if a.dtype.kind == "f" else "int32"))
    out = fn(lm, *inputs)
    loss = (out * g.tensor("cotangent", out.dims)).sum()
    for k, gr in enumerate(lm.grad(loss, [inputs[k] for k in wrt])):
        gr.output(f"grad{k}")
    feeds = {f"in{k}": a.astype(np.float32 if a.dtype.kind == "f" else np.int32) for k, a in enumerate(arrays)}
    result = g.compile(backend)(**feeds, cotangent=cotangent)
    for k, want in enumerate(expected):
        got = result[f"grad{k}"]
        assert got.shape == want.shape, f"grad of input {wrt[k]}: shape {got.shape} != torch {want.shape}"
        scale = max(1.0, float(np.abs(want).max(initial=0.0)))  # absolute error relative to the largest gradient
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol * scale, err_msg=f"grad of input {wrt[k]}")


def positive(*shape, seed=0):
    return rand(*shape, seed=seed, low=0.5, high=2.0)


def indices(*shape, high, seed=0):
    return np.random.default_rng(seed).integers(0, high, size=shape).astype(np.int32)


# -- one case per primitive ---------------------------------------------------------------------
PRIMITIVE_CASES = {
    "exp2": (lambda F, x: x.exp2(), [rand(3, 4)]),
    "log2": (lambda F, x: x.log2(), [positive(3, 4)]),
    "sin": (lambda F, x: x.sin(), [rand(3, 4, low=-4, high=4)]),
    "sqrt": (lambda F, x: x.sqrt(), [positive(3, 4)]),
    "recip": (lambda F, x: x.reciprocal(), [positive(3, 4)]),
    "add": (lambda F, x, y: x + y, [rand(3, 4), rand(3, 4, seed=1)]),
    "mul": (lambda F, x, y: x * y, [rand(3, 4), rand(3, 4, seed=1)]),
    "mod": (lambda F, x, y: x.fmod(y), [rand(3, 4, low=-5, high=5), positive(3, 4, seed=1)]),
    "less_than": (lambda F, x, y: x * x.lt(y), [rand(3, 4), rand(3, 4, seed=1)]),
    "sum_reduce": (lambda F, x: x.sum(1), [rand(3, 4)]),
    "max_reduce": (lambda F, x: x.amax(0), [rand(3, 4)]),
}


@pytest.mark.parametrize("name", PRIMITIVE_CASES)
def test_primitive(name):
    fn, arrays = PRIMITIVE_CASES[name]
    grad_check(fn, *arrays)


def test_every_primitive_has_a_gradient_rule():
    assert all(p.grad is not None for p in lm.PRIMITIVES.values())
    assert set(PRIMITIVE_CASES) == set(lm.PRIMITIVES)


def test_max_ties_split_the_gradient_evenly():
    x = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, -1.0]], np.float32)
    grad_check(lambda F, x: x.amax(1), x)


def test_less_than_passes_no_gradient():
    g = lm.Graph()
    x, y = g.tensor("x", (3,)), g.tensor("y", (3,))
    gx, gy = lm.grad(x.lt(y).sum(), [x, y])
    out = _run(g, gx=gx, gy=gy)(x=rand(3), y=rand(3, seed=1))
    assert not out["gx"].any() and not out["gy"].any()


# -- elementwise ops --------------------------------------------------------------------------------
X, Y = rand(3, 5, low=-2, high=2), rand(3, 5, seed=1, low=-2, high=2)
ELEMENTWISE = {
    "exp": lambda F, x: x.exp(),
    "log": lambda F, x: (x * x + 0.5).log(),
    "log10": lambda F, x: (x * x + 0.5).log10(),
    "log1p": lambda F, x: (x * x).log1p(),
    "expm1": lambda F, x: x.expm1(),
    "rsqrt": lambda F, x: (x * x + 0.5).rsqrt(),
    "cos": lambda F, x: x.cos(),
    "tan": lambda F, x: (x * 0.5).tan(),
    "tanh": lambda F, x: x.tanh(),
    "sigmoid": lambda F, x: x.sigmoid(),
    "erf": lambda F, x: x.erf(),
    "gelu": lambda F, x: F.gelu(x),
    "gelu_tanh": lambda F, x: F.gelu(x, approximate="tanh"),
    "silu": lambda F, x: F.silu(x),
    "softplus": lambda F, x: F.softplus(x),
    "relu": lambda F, x: x.relu(),
    "leaky_relu": lambda F, x: F.leaky_relu(x, 0.1),
    "elu": lambda F, x: F.elu(x),
    "abs": lambda F, x: x.abs(),
    "neg_square": lambda F, x: -x.square(),
    "pow_int": lambda F, x: x ** 3,
    "pow_float": lambda F, x: (x * x + 0.5) ** 1.5,
    "floor_has_zero_grad": lambda F, x: x.floor() * x,
    "round_has_zero_grad": lambda F, x: x.round() + x.trunc(),
    "frac": lambda F, x: x.frac(),
}
BINARY = {
    "sub": lambda F, x, y: x - y,
    "div": lambda F, x, y: x / (y * y + 0.5),
    "pow_tensor": lambda F, x, y: (x * x + 0.5) ** y,
    "remainder": lambda F, x, y: F.remainder(x * 3.0, y.abs() + 0.5),
    "maximum": lambda F, x, y: F.maximum(x, y),
    "minimum": lambda F, x, y: F.minimum(x, y),
    "where": lambda F, x, y: F.where(x > y, x * 2.0, y.sin()),
    "clamp_numbers": lambda F, x, y: x.clamp(-0.5, 0.7) * y,
    "clamp_tensors": lambda F, x, y: F.clamp(x, min=y - 1.0, max=y),
    "comparisons_mask": lambda F, x, y: x * (x >= y) + y * (x < 0.3) + (x != y) * x * y,
    "broadcast_add": lambda F, x, y: x + y[:1],
    "broadcast_mul_row": lambda F, x, y: x * y[:, 2:3],
}


@pytest.mark.parametrize("name", ELEMENTWISE)
def test_elementwise(name):
    grad_check(ELEMENTWISE[name], X)


@pytest.mark.parametrize("name", BINARY)
def test_binary(name):
    grad_check(BINARY[name], X, Y)


# -- reductions ----------------------------------------------------------------------------------------
REDUCTIONS = {
    "sum_all": lambda F, x: x.sum(),
    "sum_dims_keepdim": lambda F, x: x.sum((0, 2), keepdim=True),
    "mean": lambda F, x: x.mean(-1),
    "amax": lambda F, x: x.amax(1),
    "amax_keepdim_neg_dim": lambda F, x: x.amax(-1, keepdim=True),
    "var": lambda F, x: x.var(1),
    "std_biased": lambda F, x: x.std(-1, unbiased=False),
    "logsumexp": lambda F, x: x.logsumexp(1),
    "softmax": lambda F, x: x.softmax(-1),
    "log_softmax": lambda F, x: x.log_softmax(0),
    "norm": lambda F, x: x.norm(dim=-1),
}


@pytest.mark.parametrize("name", REDUCTIONS)
def test_reduction(name):
    grad_check(REDUCTIONS[name], rand(2, 3, 4, low=-2, high=2))


# -- matmul and normalization -----------------------------------------------------------------------
MATMUL_SHAPES = [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((3, 4), (2, 4, 5)), ((4,), (4, 5)), ((3, 4), (4,)),
                 ((2, 1, 3, 4), (3, 4, 2))]


@pytest.mark.parametrize("a, b", MATMUL_SHAPES)
def test_matmul(a, b):
    grad_check(lambda F, x, y: x @ y, rand(*a), rand(*b, seed=1))


def test_linear_with_bias():
    grad_check(lambda F, x, w, b: F.linear(x, w, b), rand(2, 3, 4), rand(5, 4, seed=1), rand(5, seed=2))


def test_layer_norm():
    grad_check(lambda F, x, w, b: F.layer_norm(x, (3, 4), w, b), rand(2, 3, 4), rand(3, 4, seed=1),
               rand(3, 4, seed=2))


def test_rms_norm():
    grad_check(lambda F, x, w: F.rms_norm(x, (4,), w, eps=1e-6), rand(2, 3, 4), rand(4, seed=1))


# -- convolution and pooling ------------------------------------------------------------------------
CONVS = {
    "conv1d_stride_pad_dilation_groups": (
        lambda F, x, w, b: F.conv1d(x, w, b, stride=2, padding=1, dilation=2, groups=2),
        [rand(2, 4, 9), rand(6, 2, 3, seed=1), rand(6, seed=2)]),
    "conv2d_stride_pad_dilation": (lambda F, x, w, b: F.conv2d(x, w, b, stride=(2, 1), padding=1, dilation=(1, 2)),
                                   [rand(2, 3, 7, 6), rand(4, 3, 3, 2, seed=1), rand(4, seed=2)]),
    "conv2d_groups": (lambda F, x, w: F.conv2d(x, w, groups=2), [rand(1, 4, 5, 5), rand(4, 2, 3, 3, seed=1)]),
    "conv2d_same": (lambda F, x, w: F.conv2d(x, w, padding="same"), [rand(2, 2, 5, 4), rand(3, 2, 3, 3, seed=1)]),
    "max_pool2d": (lambda F, x: F.max_pool2d(x, 2), [rand(1, 2, 6, 6)]),
    "max_pool2d_tiles_transposed": (lambda F, x: F.max_pool2d(x.transpose(2, 3), (2, 3)), [rand(2, 2, 6, 4)]),
    "max_pool2d_overlapping_padded": (lambda F, x: F.max_pool2d(x, 3, stride=2, padding=1), [rand(2, 2, 7, 6)]),
    "avg_pool2d": (lambda F, x: F.avg_pool2d(x, 2), [rand(1, 2, 6, 6)]),
    "avg_pool2d_padded_exclude_pad": (lambda F, x: F.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=False),
                                      [rand(2, 2, 7, 6)]),
    "avg_pool2d_ceil_mode": (lambda F, x: F.avg_pool2d(x, 2, ceil_mode=True), [rand(1, 2, 5, 5)]),
}


@pytest.mark.parametrize("name", CONVS)
def test_conv_and_pool(name):
    fn, arrays = CONVS[name]
    grad_check(fn, *arrays)


# -- indexing, joining, views -------------------------------------------------------------------------
INDEXING = {
    "embedding": (lambda F, i, w: F.embedding(i, w), [indices(2, 3, high=5), rand(5, 4)]),
    "gather": (lambda F, x, i: F.gather(x, 1, i), [rand(3, 4), indices(3, 6, high=4)]),
    "index_select": (lambda F, x, i: F.index_select(x, 0, i), [rand(3, 4), indices(5, high=3)]),
    "cat": (lambda F, x, y: F.cat([x, y, x], 1), [rand(2, 3), rand(2, 4, seed=1)]),
    "stack": (lambda F, x, y: F.stack([x, y], -1), [rand(2, 3), rand(2, 3, seed=1)]),
    "pad_and_crop": (lambda F, x: F.pad(x, (1, -1, 2, 0)), [rand(3, 4)]),
    "pad_value": (lambda F, x: F.pad(x, (2, 1), value=0.5) * x.sum(), [rand(3, 4)]),
}
VIEWS = {
    "permute": lambda F, x: x.permute(2, 0, 1),
    "transpose": lambda F, x: x.transpose(0, 2),
    "reshape_contiguous": lambda F, x: x.reshape(6, 4),
    "reshape_needs_copy": lambda F, x: x.transpose(1, 2).reshape(-1),
    "expand": lambda F, x: x[:, :1].expand(2, 5, 4),
    "slice_steps": lambda F, x: x[:, ::2, 1::3],
    "slice_negative_bounds": lambda F, x: x[-1:, 1:-1],
    "flip": lambda F, x: x.flip((0, 2)),
    "unfold": lambda F, x: x.unfold(2, 2, 1),
    "unfold_strided": lambda F, x: x.unfold(1, 2, 2),
    "narrow": lambda F, x: x.narrow(1, 1, 2),
    "getitem_int_none_ellipsis": lambda F, x: x[1, None, ..., 2],
    "view_chain": lambda F, x: x.flip(1).transpose(0, 1)[::2].unsqueeze(0).expand(3, 2, 2, 4).permute(3, 1, 0, 2),
    "reuse_through_views": lambda F, x: x * x.flip(2) + x.transpose(1, 2).sum(1, keepdim=True).transpose(1, 2),
}


@pytest.mark.parametrize("name", INDEXING)
def test_indexing_and_joining(name):
    fn, arrays = INDEXING[name]
    grad_check(fn, *arrays)


@pytest.mark.parametrize("name", VIEWS)
def test_view(name):
    grad_check(VIEWS[name], rand(2, 3, 4))


# -- models ---------------------------------------------------------------------------------------------
def mlp(F, x, w1, b1, w2, b2, target):
    """Two linear layers with gelu, and the cross-entropy of their logits against class indices."""
    logits = F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)
    picked = (logits.log_softmax(-1) * F.one_hot(target, 5)).sum(-1)
    return -picked.mean()


def attention_block(F, x, wq, wk, wv, wo, ln_w):
    """Pre-norm causal single-head self-attention with a residual connection."""
    h = F.layer_norm(x, (x.shape[-1],), ln_w)
    q, k, v = h @ wq, h @ wk, h @ wv
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    n = x.shape[-2]
    causal = F.ones(n, n).tril() if F is TORCH else x.graph.ones(n, n).tril()
    scores = F.where(causal > 0, scores, -1e9)
    return x + (scores.softmax(-1) @ v) @ wo


MLP_ARRAYS = [rand(6, 4), rand(8, 4, seed=1), rand(8, seed=2), rand(5, 8, seed=3), rand(5, seed=4),
              indices(6, high=5)]
ATTENTION_ARRAYS = [rand(2, 5, 8)] + [rand(8, 8, seed=k) * 0.5 for k in range(1, 5)] + [rand(8, seed=5)]


def test_mlp_with_cross_entropy():
    grad_check(mlp, *MLP_ARRAYS)


def test_attention_block():
    grad_check(attention_block, *ATTENTION_ARRAYS)


def test_llama_gradients_match_transformers():
    """Every weight's gradient through luminar's Llama graph (RoPE, GQA, rms_norm, SiLU MLP,
    embedding, KV-cache concat, symbolic s/t/r dims) equals transformers' own backward; a weight
    stacked from several (q/k/v, gate/up: Weights.linears) has their gradients stacked."""
    transformers = pytest.importorskip("transformers")
    from luminar.models.llama import LlamaConfig, Weights, build_graph, rope_inv_freq
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config).float()
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    names = list(state)
    weights = Weights.from_state_dict(state)
    ours = LlamaConfig.from_hf(config.to_dict())
    g = build_graph(ours, weights)
    logits = lm.GraphTensor(g, *g.outputs["logits"])
    loss = (logits * g.tensor("cotangent", logits.dims)).sum()
    declared = [name for graph, name in weights.declared if graph == id(g)]
    assert sorted(part for name in declared for part in weights.stacked.get(name, [name])) == sorted(names)
    for k, gr in enumerate(lm.grad(loss, [weights.declared[id(g), n] for n in declared])):
        gr.output(f"grad{k}")
    ids = np.array([3, 17, 99, 5, 64, 2], np.int32)
    cotangent = rand(len(ids), 128)
    empty_cache = np.zeros((1, 2, 2, 16), np.float32)  # only the dummy slot: no earlier tokens
    result = g.compile("reference").run(dict(tokens=ids, k_cache=empty_cache, v_cache=empty_cache, cotangent=cotangent,
                                             inv_freq=rope_inv_freq(ours).astype(np.float32), **weights.arrays),
                                        dims={"r": len(ids)})
    (model(torch.tensor(ids[None].astype(np.int64))).logits[0] * torch.from_numpy(cotangent)).sum().backward()
    params = dict(model.named_parameters())
    for k, name in enumerate(declared):
        want = np.concatenate([params[part].grad.numpy() for part in weights.stacked.get(name, [name])])
        np.testing.assert_allclose(result[f"grad{k}"], want, rtol=1e-4, atol=1e-5 * np.abs(want).max(), err_msg=name)


# symbolic dims bound at run time: the backward graph has the forward graph's dims
SYMBOLIC = {
    "mlp_batch": (mlp, MLP_ARRAYS, {0: ("s", None), 5: ("s",)}),
    "sequence_views": (lambda F, x, w: (x[:, 1::2].flip(1) @ w).softmax(1).unfold(1, 2, 1).amax(-1),
                       [rand(2, 7, 3), rand(3, 4, seed=1)], {0: (None, "s", None)}),
    "padded_strided_windows": (lambda F, x: F.pad(x[:, 2:-1:3], (0, 0, 1, 2)).unfold(1, 3, 2).sum(-1) * x[:, :1],
                               [rand(2, 11, 3)], {0: (None, "s", None)}),
    "max_pool_batch": (lambda F, x: F.max_pool2d(x, 3, stride=2, padding=1), [rand(2, 2, 9, 7)],
                       {0: ("b", None, None, None)}),
}


@pytest.mark.parametrize("name", SYMBOLIC)
def test_symbolic_dims(name, backend):
    fn, arrays, symbolic = SYMBOLIC[name]
    grad_check(fn, *arrays, symbolic=symbolic, backend=backend)


# -- the cpu backend ---------------------------------------------------------------------------------
CPU_CASES = {
    **{name: PRIMITIVE_CASES[name] for name in ("mod", "max_reduce", "sin")},
    "gelu": (ELEMENTWISE["gelu"], [X]),
    "where": (BINARY["where"], [X, Y]),
    "log_softmax": (REDUCTIONS["log_softmax"], [rand(2, 3, 4)]),
    "batched_matmul": (lambda F, x, y: x @ y, [rand(2, 3, 4), rand(4, 5, seed=1)]),
    **{name: CONVS[name] for name in ("conv2d_stride_pad_dilation", "max_pool2d_overlapping_padded", "avg_pool2d")},
    **{name: INDEXING[name] for name in ("embedding", "cat")},
    **{name: (VIEWS[name], [rand(2, 3, 4)]) for name in ("view_chain", "slice_steps")},
    "mlp": (mlp, MLP_ARRAYS),
    "attention_block": (attention_block, ATTENTION_ARRAYS),
}


@pytest.mark.skipif("cpu" not in BACKENDS, reason="needs a C compiler")
@pytest.mark.parametrize("name", CPU_CASES)
def test_cpu_backend(name):
    fn, arrays = CPU_CASES[name]
    grad_check(fn, *arrays, backend="cpu")


# -- how grad behaves ----------------------------------------------------------------------------------
def _run(graph, **outputs):
    for name, t in outputs.items():
        t.output(name)
    return graph.compile("reference")


def test_unused_param_gets_zeros():
    g = lm.Graph()
    x, y = g.tensor("x", (2, 3)), g.tensor("y", (4,))
    gx, gy = lm.grad((x * x).sum(), [x, y])
    out = _run(g, gx=gx, gy=gy)(x=rand(2, 3), y=rand(4))
    np.testing.assert_allclose(out["gx"], 2 * rand(2, 3))
    assert out["gy"].shape == (4,) and not out["gy"].any()


def test_single_param_and_loss_through_a_view():
    g = lm.Graph()
    x = g.tensor("x", (2, 3))
    (gx,) = lm.grad((x * 3.0)[1, 2], x)  # a one-element view of a bigger node is a valid loss
    out = _run(g, gx=gx)(x=rand(2, 3))
    np.testing.assert_array_equal(out["gx"], [[0, 0, 0], [0, 0, 3]])


def test_grad_of_an_intermediate_tensor():
    """Like torch.autograd.grad on a non-leaf: the gradient w.r.t. a hidden activation."""
    g = lm.Graph()
    x, w = g.tensor("x", (3, 4)), g.tensor("w", (4, 5))
    h = x @ w
    (gh,) = lm.grad((h.tanh() * h).sum(), [h])
    xs, ws = rand(3, 4), rand(4, 5, seed=1)
    th = torch.tensor(xs @ ws, requires_grad=True)
    (expected,) = torch.autograd.grad((th.tanh() * th).sum(), th)
    np.testing.assert_allclose(_run(g, gh=gh)(x=xs, w=ws)["gh"], expected.numpy(), rtol=1e-4, atol=1e-6)


def test_a_reshaped_input_is_a_valid_param():
    """A reshape that keeps the elements in order is the same buffer: its gradient is reshaped too."""
    g = lm.Graph()
    x = g.tensor("x", (2, 6))
    flat = x.reshape(3, 4)
    (gflat,) = lm.grad((flat * flat.sin()).sum(), [flat])
    xs = rand(2, 6)
    np.testing.assert_allclose(_run(g, gflat=gflat)(x=xs)["gflat"], (np.sin(xs) + xs * np.cos(xs)).reshape(3, 4),
                               rtol=1e-5, atol=1e-6)


def test_sgd_training_step_with_update():
    """grad + Graph.update: one compiled program runs a whole SGD step; the loss goes down."""
    g = lm.Graph()
    x, y, w = g.tensor("x", (8, 3)), g.tensor("y", (8,)), g.tensor("w", (3,))
    loss = ((x @ w - y) ** 2).mean()
    (gw,) = lm.grad(loss, [w])
    g.update(w, w - 0.1 * gw)
    program = _run(g, loss=loss).set_inputs(w=np.zeros(3, np.float32))
    xs = rand(8, 3)
    ys = xs @ np.array([1.0, -2.0, 0.5], np.float32)
    losses = [float(program(x=xs, y=ys)["loss"]) for _ in range(30)]
    tw = torch.zeros(3, requires_grad=True)
    for _ in range(30):
        tloss = ((torch.from_numpy(xs) @ tw - torch.from_numpy(ys)) ** 2).mean()
        tloss.backward()
        with torch.no_grad():
            tw -= 0.1 * tw.grad
        tw.grad = None
    assert losses[-1] < 0.1 * losses[0]
    np.testing.assert_allclose(program.state["w"], tw.detach().numpy(), rtol=1e-4, atol=1e-6)


def _numel(node):
    return math.prod(d.value for d in node.shape)


def test_conv_backward_is_no_bigger_than_forward():
    """Window views transpose to shifted pads, not one-hot matrices: no backward node is larger
    than the forward's largest (the broadcast product of windows and weights)."""
    g = lm.Graph()
    x, w = g.tensor("x", (8, 16, 12, 12)), g.tensor("w", (16, 16, 3, 3))
    loss = lm.conv2d(x, w, stride=2, padding=1).square().sum()
    forward = len(g.nodes)
    lm.grad(loss, [x, w])
    assert max(_numel(n) for n in g.nodes[forward:]) <= max(_numel(n) for n in g.nodes[:forward])


# -- errors -----------------------------------------------------------------------------------------------
def test_loss_must_be_scalar():
    g = lm.Graph()
    x = g.tensor("x", (2, 3))
    with pytest.raises(lm.ShapeError, match=r"loss must be a scalar.*\(2, 3\)"):
        lm.grad(x * 2.0, [x])


def test_symbolic_loss_is_not_scalar():
    g = lm.Graph()
    x = g.tensor("x", ("s",))
    with pytest.raises(lm.ShapeError, match="loss must be a scalar"):
        lm.grad(x.exp(), [x])


def test_param_from_another_graph():
    g, other = lm.Graph(), lm.Graph()
    x, w = g.tensor("x", (3,)), other.tensor("w", (3,))
    with pytest.raises(lm.InputError, match=r"params\[0\] \(w, shape \(3,\)\) belongs to another graph"):
        lm.grad(x.sum(), [w])


def test_integer_param():
    g = lm.Graph()
    i = g.tensor("i", (3,), "int32")
    with pytest.raises(lm.DTypeError, match=r"params\[0\] \(i.*integer dtype int32"):
        lm.grad(i.sum(), [i])


def test_constant_param():
    g = lm.Graph()
    c = g.constant(2.0)
    with pytest.raises(lm.UnsupportedError, match="constants have no gradient"):
        lm.grad(c * 3.0, [c])


def test_view_param():
    g = lm.Graph()
    x = g.tensor("x", (2, 3))
    with pytest.raises(lm.UnsupportedError, match=r"params\[0\].*is a view of node %0 \(2, 3\)"):
        lm.grad(x.sum(), [x.T])


@pytest.mark.parametrize("loss, params", [("not a tensor", []), (None, [])])
def test_loss_must_be_a_graph_tensor(loss, params):
    with pytest.raises(lm.UnsupportedError, match="loss must be a GraphTensor"):
        lm.grad(loss, params)


def test_param_must_be_a_graph_tensor():
    g = lm.Graph()
    x = g.tensor("x", (2,))
    with pytest.raises(lm.UnsupportedError, match=r"params\[1\] must be a GraphTensor, got ndarray"):
        lm.grad(x.sum(), [x, np.zeros(2)])


# -- random graphs ------------------------------------------------------------------------------------
# (name, fn(F, x) -> tensor, applies(shape)); ops keep values bounded and avoid kinks at
# exact zeros (relu's derivative at 0 is a convention that differs, see autograd.py).
UNARY_FUZZ = [
    ("tanh", lambda F, x: x.tanh(), lambda s: True),
    ("exp", lambda F, x: (x * 0.5).tanh().exp(), lambda s: True),
    ("sin", lambda F, x: x.sin(), lambda s: True),
    ("sqrt", lambda F, x: (x * x + 1.0).sqrt(), lambda s: True),
    ("recip", lambda F, x: 1.0 / (x * x + 1.0), lambda s: True),
    ("log", lambda F, x: (x * x + 1.0).log(), lambda s: True),
    ("sigmoid", lambda F, x: x.sigmoid(), lambda s: True),
    ("square", lambda F, x: x * x, lambda s: True),
    ("transpose", lambda F, x: x.transpose(0, -1), lambda s: len(s) >= 2),
    ("flip", lambda F, x: x.flip(0), lambda s: len(s) >= 1),
    ("slice_step", lambda F, x: x[1::2], lambda s: len(s) >= 1 and s[0] >= 2),
    ("pad", lambda F, x: F.pad(x, (1, 2)), lambda s: len(s) >= 1),
    ("unfold", lambda F, x: x.unfold(-1, 2, 1), lambda s: len(s) in (1, 2) and s[-1] >= 2),
    ("flatten", lambda F, x: x.reshape(-1), lambda s: len(s) >= 2),
    ("expand", lambda F, x: x.unsqueeze(0).expand(2, *x.shape), lambda s: len(s) <= 2),
    ("sum", lambda F, x: x.sum(-1), lambda s: len(s) >= 1),
    ("amax", lambda F, x: x.amax(0, keepdim=True), lambda s: len(s) >= 1),
    ("softmax", lambda F, x: x.softmax(-1), lambda s: len(s) >= 1),
    ("logsumexp", lambda F, x: x.logsumexp(0), lambda s: len(s) >= 1),
]
BINARY_FUZZ = [
    ("add", lambda F, x, y: x + y),
    ("mul", lambda F, x, y: x * y),
    ("sub", lambda F, x, y: x - y),
    ("div", lambda F, x, y: x / (y * y + 1.0)),
    ("maximum", lambda F, x, y: F.maximum(x, y)),
]


def _fuzz_step(F, pool, step):
    """The tensor a step computes from the pool; a binary op whose operands do not broadcast
    takes the sum of its second operand instead."""
    kind, op, srcs = step
    if kind == "unary":
        return UNARY_FUZZ[op][1](F, pool[srcs[0]])
    a, b = (pool[k] for k in srcs)
    if not all(x == y or 1 in (x, y) for x, y in zip(reversed(tuple(a.shape)), reversed(tuple(b.shape)))):
        b = b.sum()
    return BINARY_FUZZ[op][1](F, a, b)


def _fuzz_run(F, steps, inputs):
    pool = list(inputs)
    for step in steps:
        pool.append(_fuzz_step(F, pool, step))
    return pool[-1]


@st.composite
def fuzz_programs(draw):
    """2-7 random steps (op, operand positions) over a pool that starts with inputs (3, 4) and (4,)."""
    pool = [torch.zeros(3, 4), torch.zeros(4)]  # shapes only: decides which ops apply
    steps = []
    for _ in range(draw(st.integers(2, 7))):
        src = draw(st.integers(0, len(pool) - 1))
        unary = [k for k, (_, _, fits) in enumerate(UNARY_FUZZ) if fits(tuple(pool[src].shape))]
        if draw(st.booleans()) and pool[src].numel() <= 200:
            step = ("unary", draw(st.sampled_from(unary)), (src,))
        else:
            step = ("binary", draw(st.integers(0, len(BINARY_FUZZ) - 1)), (src, draw(st.integers(0, len(pool) - 1))))
        steps.append(step)
        pool.append(_fuzz_step(TORCH, pool, step))
    return steps


def _describe(steps):
    return "; ".join(f"%{k + 2} = {(UNARY_FUZZ if kind == 'unary' else BINARY_FUZZ)[op][0]}"
                     f"({', '.join(f'%{s}' for s in srcs)})" for k, (kind, op, srcs) in enumerate(steps))


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fuzz_programs())
def test_random_graphs(steps):
    note(_describe(steps))
    grad_check(lambda F, x, y: _fuzz_run(F, steps, [x, y]), rand(3, 4), rand(4, seed=1))


@pytest.mark.skipif("cpu" not in BACKENDS, reason="needs a C compiler")
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fuzz_programs())
def test_random_graphs_cpu(steps):
    note(_describe(steps))
    grad_check(lambda F, x, y: _fuzz_run(F, steps, [x, y]), rand(3, 4), rand(4, seed=1), backend="cpu")


@pytest.mark.skipif("cpu" not in BACKENDS, reason="needs a C compiler")
def test_amax_of_logs_has_torchs_gradient_on_cpu():
    """Found by the fuzzer above: amax's gradient tests x == max, with x recomputed in two kernels;
    a vectorized log2 that rounds unlike the scalar one found no maximum (0/0 = NaN)."""
    steps = [("unary", 5, (1,)), ("binary", 0, (1, 2)), ("unary", 5, (3,)), ("binary", 0, (0, 0)),
             ("unary", 0, (0,)), ("unary", 16, (4,))]
    grad_check(lambda F, x, y: _fuzz_run(F, steps, [x, y]), rand(3, 4), rand(4, seed=1), backend="cpu")


@pytest.mark.skipif("cpu" not in BACKENDS, reason="needs a C compiler")
def test_amax_of_a_quotient_has_torchs_gradient_on_cpu():
    """Found by the fuzzer too: amax(x**2 / y) -- its max kernel must not take 16 partial maxima in a
    vector loop, whose division rounded unlike the scalar one of the kernel comparing x == max."""
    steps = [("unary", 7, (0,)), ("unary", 0, (0,)), ("binary", 3, (2, 1)), ("binary", 0, (0, 0)), ("unary", 16, (4,))]
    grad_check(lambda F, x, y: _fuzz_run(F, steps, [x, y]), rand(3, 4), rand(4, seed=1), backend="cpu")
