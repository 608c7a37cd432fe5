"""The benchmarks: each is the same computation written three times (a luminar graph, numpy,
PyTorch eager) plus what it costs (FLOPs or bytes) and the goal it is measured against.

The numpy function is dtype-generic, so calling it on float64 copies of the inputs gives the
reference every contender's output is checked against before anything is timed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

import luminar as lm


@dataclass
class Goal:
    text: str
    vs: str  # "numpy" | "torch" | "bandwidth"
    ratio: float  # luminar must be at least this many times as fast (speed ratio, > 1 = luminar faster)


@dataclass
class Case:
    """One benchmark. Rates: GFLOP/s from `flops`, or GB/s (memory-bound cases) from `bytes`."""
    name: str
    size: str
    graph: Callable[[], lm.Graph]  # builds a fresh luminar graph
    numpy_fn: Callable  # (**arrays) -> {output: array}; dtype-generic
    torch_fn: Callable  # (**tensors) -> {output: tensor}
    inputs: Callable[[], dict[str, np.ndarray]]
    flops: float | None = None  # per call
    bytes: float | None = None  # minimal memory traffic per call
    unit: str = "GFLOP/s"  # the rate reported: "GFLOP/s" (from flops) or "GB/s" (from bytes)
    dims: dict[str, int] = field(default_factory=dict)  # symbolic dims bound by the inputs
    goals: list[Goal] = field(default_factory=list)
    rtol: float = 2e-3
    note: str = ""  # shown under the results table


def _rand(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale))


# -- matmul ------------------------------------------------------------------------------------------
def matmul(n: int, goals=()) -> Case:
    def graph():
        g = lm.Graph()
        (g.tensor("a", (n, n)) @ g.tensor("b", (n, n))).output("c")
        return g

    def inputs():
        rng = np.random.default_rng(n)
        return {"a": _rand(rng, n, n), "b": _rand(rng, n, n)}

    return Case(f"matmul {n}", f"{n}x{n} @ {n}x{n} fp32", graph,
                numpy_fn=lambda a, b: {"c": a @ b}, torch_fn=lambda a, b: {"c": a @ b},
                inputs=inputs, flops=2.0 * n**3, goals=list(goals))


# -- fused elementwise chain ------------------------------------------------------------------------
def fused_chain(numel: int) -> Case:
    def graph():
        g = lm.Graph()
        a, b, c = (g.tensor(name, (numel,)) for name in "abc")
        (a * b + c).relu().sum().output("s")
        return g

    def inputs():
        rng = np.random.default_rng(1)
        return {name: _rand(rng, numel) for name in "abc"}

    goals = [Goal("GB/s >= 0.8x measured bandwidth", "bandwidth", 0.8), Goal("faster than numpy", "numpy", 1.0)]
    return Case("fused (a*b+c).relu().sum()", f"{_count(numel)} elements", graph,
                numpy_fn=lambda a, b, c: {"s": np.maximum(a * b + c, 0).sum()},
                torch_fn=lambda a, b, c: {"s": (a * b + c).relu().sum()},
                inputs=inputs, bytes=3 * 4 * numel, unit="GB/s", goals=goals, rtol=1e-3)


# -- softmax and norms over rows: one kernel each (the row's max / mean / sum computed in it) -------
ROW_GOALS = [Goal("GB/s >= 0.8x measured bandwidth", "bandwidth", 0.8)]


def softmax(rows: int, cols: int) -> Case:
    import torch

    def graph():
        g = lm.Graph()
        g.tensor("x", (rows, cols)).softmax(-1).output("y")
        return g

    def numpy_fn(x):
        e = np.exp(x - x.max(-1, keepdims=True))
        return {"y": e / e.sum(-1, keepdims=True)}

    return Case("softmax(dim=-1)", f"{rows}x{cols}", graph, numpy_fn,
                torch_fn=lambda x: {"y": torch.softmax(x, -1)},
                inputs=lambda: {"x": _rand(np.random.default_rng(2), rows, cols, scale=3.0)},
                bytes=2 * 4 * rows * cols, unit="GB/s", goals=ROW_GOALS)


def layer_norm(rows: int, cols: int) -> Case:
    import torch

    def graph():
        g = lm.Graph()
        x, w, b = g.tensor("x", (rows, cols)), g.tensor("w", (cols,)), g.tensor("b", (cols,))
        lm.layer_norm(x, (cols,), w, b).output("y")
        return g

    def numpy_fn(x, w, b):
        centered = x - x.mean(-1, keepdims=True)
        return {"y": centered / np.sqrt((centered * centered).mean(-1, keepdims=True) + 1e-5) * w + b}

    def inputs():
        rng = np.random.default_rng(3)
        return {"x": _rand(rng, rows, cols), "w": _rand(rng, cols), "b": _rand(rng, cols)}

    return Case("layer_norm", f"{rows}x{cols} (+ weight, bias)", graph, numpy_fn,
                torch_fn=lambda x, w, b: {"y": torch.nn.functional.layer_norm(x, (cols,), w, b)},
                inputs=inputs, bytes=2 * 4 * rows * cols, unit="GB/s", goals=ROW_GOALS)


def rms_norm(rows: int, cols: int) -> Case:
    import torch

    def graph():
        g = lm.Graph()
        x, w = g.tensor("x", (rows, cols)), g.tensor("w", (cols,))
        lm.rms_norm(x, (cols,), w, eps=1e-6).output("y")
        return g

    def numpy_fn(x, w):
        return {"y": x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w}

    def inputs():
        rng = np.random.default_rng(4)
        return {"x": _rand(rng, rows, cols), "w": _rand(rng, cols)}

    return Case("rms_norm", f"{rows}x{cols} (+ weight)", graph, numpy_fn,
                torch_fn=lambda x, w: {"y": torch.nn.functional.rms_norm(x, (cols,), w, 1e-6)},
                inputs=inputs, bytes=2 * 4 * rows * cols, unit="GB/s", goals=ROW_GOALS)


# -- a ResNet 3x3 convolution -------------------------------------------------------------------------
def conv2d(channels: int, size: int) -> Case:
    import torch
    shape_x, shape_w = (1, channels, size, size), (channels, channels, 3, 3)

    def graph():
        g = lm.Graph()
        x, w, b = g.tensor("x", shape_x), g.tensor("w", shape_w), g.tensor("b", (channels,))
        lm.conv2d(x, w, b, padding=1).output("y")
        return g

    def numpy_fn(x, w, b):  # im2col by a strided window view, then one BLAS product
        windows = sliding_window_view(np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), axis=(2, 3))
        out = np.tensordot(windows, w, axes=([1, 4, 5], [1, 2, 3]))  # (N, H, W, O)
        return {"y": out.transpose(0, 3, 1, 2) + b[:, None, None]}

    def inputs():
        rng = np.random.default_rng(4)
        return {"x": _rand(rng, *shape_x), "w": _rand(rng, *shape_w, scale=1 / math.sqrt(9 * channels)),
                "b": _rand(rng, channels)}

    return Case("conv2d 3x3 pad 1 (ResNet)", f"1x{channels}x{size}x{size}, {channels}->{channels}", graph,
                numpy_fn, torch_fn=lambda x, w, b: {"y": torch.nn.functional.conv2d(x, w, b, padding=1)},
                inputs=inputs, flops=2.0 * channels * channels * 9 * size * size)



def conv2d_backward(channels: int, size: int) -> Case:
    """A training step's convolution: forward, then the input and weight gradients for a given
    output gradient (luminar: one graph differentiated by luminar.autograd; torch: autograd)."""
    import torch
    from luminar.autograd import grad
    shape_x, shape_w = (1, channels, size, size), (channels, channels, 3, 3)

    def graph():
        g = lm.Graph()
        x, w = g.tensor("x", shape_x), g.tensor("w", shape_w)
        loss = (lm.conv2d(x, w, padding=1) * g.tensor("dy", shape_x)).sum()
        for name, t in zip(("gx", "gw"), grad(loss, [x, w])):
            t.output(name)
        return g

    def numpy_fn(x, w, dy):  # both gradients as correlations of padded windows (3x3, padding 1)
        def windows(a):
            return sliding_window_view(np.pad(a, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), axis=(2, 3))
        gw = np.tensordot(dy, windows(x), axes=([0, 2, 3], [0, 2, 3]))  # (O, C, 3, 3)
        gx = np.tensordot(windows(dy), w[:, :, ::-1, ::-1], axes=([1, 4, 5], [0, 2, 3]))  # (N, H, W, C)
        return {"gx": gx.transpose(0, 3, 1, 2), "gw": gw}

    def torch_fn(x, w, dy):
        with torch.enable_grad():  # (the bench runs torch contenders without autograd)
            x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
            torch.nn.functional.conv2d(x, w, padding=1).backward(dy)
        return {"gx": x.grad, "gw": w.grad}

    def inputs():
        rng = np.random.default_rng(5)
        return {"x": _rand(rng, *shape_x), "w": _rand(rng, *shape_w, scale=1 / math.sqrt(9 * channels)),
                "dy": _rand(rng, *shape_x)}

    return Case("conv2d 3x3 forward + backward", f"1x{channels}x{size}x{size}, {channels}->{channels}", graph,
                numpy_fn, torch_fn=torch_fn, inputs=inputs, flops=3 * 2.0 * channels * channels * 9 * size * size)

# -- a Llama decoder block, one decode step ---------------------------------------------------------
@dataclass(frozen=True)
class LlamaShape:
    """SmolLM2-135M's block: 9 query heads sharing 3 KV heads (GQA), SwiGLU MLP, RMSNorm, RoPE."""
    hidden: int = 576
    heads: int = 9
    kv_heads: int = 3
    head_dim: int = 64
    mlp: int = 1536
    eps: float = 1e-5
    rope_base: float = 1e5

    @property
    def weights(self) -> dict[str, tuple[int, ...]]:  # torch Linear layout: (out_features, in_features)
        d, kv = self.hidden, self.kv_heads * self.head_dim
        return {"wq": (d, d), "wk": (kv, d), "wv": (kv, d), "wo": (d, d), "w_gate": (self.mlp, d),
                "w_up": (self.mlp, d), "w_down": (d, self.mlp), "attn_norm": (d,), "mlp_norm": (d,)}


def llama_decode(cached: int, L: LlamaShape = LlamaShape()) -> Case:
    """One new token (batch 1) attending to `cached` K/V rows plus itself.

    The cache length is the symbolic dim "t" in the luminar graph. The new token is the last
    position, so its causal mask allows every key: no mask is needed. Outputs: the block's
    output and the new token's rotated key and value (what a caller appends to the cache).
    """
    import torch
    F = torch.nn.functional
    group, half = L.heads // L.kv_heads, L.head_dim // 2

    def graph():
        g = lm.Graph()
        x = g.tensor("x", (1, L.hidden))
        k_cache, v_cache = (g.tensor(n, (L.kv_heads, "t", L.head_dim)) for n in ("k_cache", "v_cache"))
        cos, sin = g.tensor("cos", (L.head_dim,)), g.tensor("sin", (L.head_dim,))
        w = {name: g.tensor(name, shape) for name, shape in L.weights.items()}

        def rope(t):
            return t * cos + lm.cat([-t[..., half:], t[..., :half]], -1) * sin

        h = lm.rms_norm(x, (L.hidden,), w["attn_norm"], eps=L.eps)
        q = rope(lm.linear(h, w["wq"]).reshape(L.heads, 1, L.head_dim))
        k = rope(lm.linear(h, w["wk"]).reshape(L.kv_heads, 1, L.head_dim))
        v = lm.linear(h, w["wv"]).reshape(L.kv_heads, 1, L.head_dim)
        keys, values = lm.cat([k_cache, k], 1), lm.cat([v_cache, v], 1)  # (kv_heads, t + 1, head_dim)
        scores = q.reshape(L.kv_heads, group, L.head_dim).matmul(keys.transpose(1, 2)) * (1 / math.sqrt(L.head_dim))
        attn = scores.softmax(-1).matmul(values).reshape(1, L.hidden)
        x = x + lm.linear(attn, w["wo"])
        h = lm.rms_norm(x, (L.hidden,), w["mlp_norm"], eps=L.eps)
        x = x + lm.linear(lm.silu(lm.linear(h, w["w_gate"])) * lm.linear(h, w["w_up"]), w["w_down"])
        x.output("y")
        k.reshape(L.kv_heads, L.head_dim).output("k_new")
        v.reshape(L.kv_heads, L.head_dim).output("v_new")
        return g

    def numpy_fn(x, k_cache, v_cache, cos, sin, wq, wk, wv, wo, w_gate, w_up, w_down, attn_norm, mlp_norm):
        def rms(t, weight):
            return t / np.sqrt((t * t).mean(-1, keepdims=True) + L.eps) * weight

        def rope(t):
            return t * cos + np.concatenate([-t[..., half:], t[..., :half]], -1) * sin

        h = rms(x, attn_norm)
        q = rope((h @ wq.T).reshape(L.heads, 1, L.head_dim))
        k = rope((h @ wk.T).reshape(L.kv_heads, 1, L.head_dim))
        v = (h @ wv.T).reshape(L.kv_heads, 1, L.head_dim)
        keys, values = np.concatenate([k_cache, k], 1), np.concatenate([v_cache, v], 1)
        scores = q.reshape(L.kv_heads, group, L.head_dim) @ keys.transpose(0, 2, 1) / math.sqrt(L.head_dim)
        e = np.exp(scores - scores.max(-1, keepdims=True))
        attn = ((e / e.sum(-1, keepdims=True)) @ values).reshape(1, L.hidden)
        x = x + attn @ wo.T
        h = rms(x, mlp_norm)
        gate = h @ w_gate.T
        x = x + (gate / (1 + np.exp(-gate)) * (h @ w_up.T)) @ w_down.T
        return {"y": x, "k_new": k.reshape(L.kv_heads, L.head_dim), "v_new": v.reshape(L.kv_heads, L.head_dim)}

    def torch_fn(x, k_cache, v_cache, cos, sin, wq, wk, wv, wo, w_gate, w_up, w_down, attn_norm, mlp_norm):
        def rope(t):
            return t * cos + torch.cat([-t[..., half:], t[..., :half]], -1) * sin

        h = F.rms_norm(x, (L.hidden,), attn_norm, L.eps)
        q = rope(F.linear(h, wq).view(L.heads, 1, L.head_dim))
        k = rope(F.linear(h, wk).view(L.kv_heads, 1, L.head_dim))
        v = F.linear(h, wv).view(L.kv_heads, 1, L.head_dim)
        keys, values = torch.cat([k_cache, k], 1), torch.cat([v_cache, v], 1)
        scores = q.view(L.kv_heads, group, L.head_dim) @ keys.transpose(1, 2) / math.sqrt(L.head_dim)
        attn = (torch.softmax(scores, -1) @ values).reshape(1, L.hidden)
        x = x + F.linear(attn, wo)
        h = F.rms_norm(x, (L.hidden,), mlp_norm, L.eps)
        x = x + F.linear(F.silu(F.linear(h, w_gate)) * F.linear(h, w_up), w_down)
        return {"y": x, "k_new": k.view(L.kv_heads, L.head_dim), "v_new": v.view(L.kv_heads, L.head_dim)}

    def inputs():
        rng = np.random.default_rng(5)
        arrays = {"x": _rand(rng, 1, L.hidden),
                  "k_cache": _rand(rng, L.kv_heads, cached, L.head_dim),
                  "v_cache": _rand(rng, L.kv_heads, cached, L.head_dim)}
        angle = cached * L.rope_base ** (-np.arange(0, L.head_dim, 2) / L.head_dim)  # HF: cat(freqs, freqs)
        arrays["cos"] = np.cos(np.concatenate([angle, angle])).astype(np.float32)
        arrays["sin"] = np.sin(np.concatenate([angle, angle])).astype(np.float32)
        for name, shape in L.weights.items():
            arrays[name] = (1 + 0.1 * _rand(rng, *shape)) if len(shape) == 1 else _rand(rng, *shape,
                                                                                          scale=1 / math.sqrt(shape[1]))
        return arrays

    weight_bytes = 4 * sum(math.prod(s) for s in L.weights.values())
    cache_bytes = 2 * 4 * L.kv_heads * cached * L.head_dim
    matrices = sum(math.prod(s) for s in L.weights.values() if len(s) == 2)
    attention = 2 * 2 * L.heads * (cached + 1) * L.head_dim
    return Case("Llama block decode step", f"hidden {L.hidden}, {L.heads}/{L.kv_heads} heads x {L.head_dim}, "
                f"MLP {L.mlp}, batch 1, {cached} cached tokens", graph, numpy_fn, torch_fn, inputs,
                flops=2.0 * matrices + attention, bytes=weight_bytes + cache_bytes, unit="GB/s",
                dims={"t": cached},
                goals=[Goal("faster than PyTorch eager", "torch", 1.0)], rtol=2e-3,
                note=f"GB/s counts the {(weight_bytes + cache_bytes) / 1e6:.1f} MB of weights and K/V cache read per "
                     f"step; they can stay in the last-level cache between calls, so it can exceed DRAM bandwidth.")


def _count(n: int) -> str:
    for unit, size in (("M", 2**20), ("K", 2**10)):
        if n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def all_cases(quick: bool) -> list[Case]:
    if quick:
        return [matmul(128), matmul(256), matmul(512, [Goal("speed >= 0.3x numpy", "numpy", 0.3)]),
                fused_chain(1 << 20), softmax(256, 1024), layer_norm(512, 512), rms_norm(512, 512), conv2d(16, 28),
                conv2d_backward(16, 28), llama_decode(128)]
    return [matmul(256), matmul(1024, [Goal("speed >= 0.3x numpy", "numpy", 0.3)]), matmul(2048),
            fused_chain(16 << 20), softmax(4096, 4096), layer_norm(8192, 1024), rms_norm(8192, 1024), conv2d(64, 56),
            conv2d_backward(64, 56), llama_decode(128)]
