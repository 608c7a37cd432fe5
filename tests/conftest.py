"""Shared test harness: run the same function through luminar and through PyTorch.

luminar mirrors PyTorch's names, so most tests are one lambda applied to both:

    check(lambda x, w: (x @ w).softmax(-1), rand(2, 3, 4), rand(4, 5), backend=backend)

`check` declares each array as a graph input (optionally with symbolic dims), runs the graph on
the backend under test, runs the same lambda on torch tensors, and compares.
"""
import numpy as np
import pytest

import luminar as lm

import shutil

# The cpu backend needs a C compiler; .ci/run installs gcc, so CI always runs both.
BACKENDS = ["reference"] + (["cpu"] if shutil.which("gcc") or shutil.which("cc") else [])


@pytest.fixture(params=BACKENDS)
def backend(request):
    """Every core test runs on every backend that can run on this machine."""
    return request.param


def rand(*shape, seed=0, low=-1.0, high=1.0, dtype=np.float32):
    rng = np.random.default_rng(abs(hash((shape, seed))) % (2**32))
    return rng.uniform(low, high, size=shape).astype(dtype)


def run_luminar(fn, *arrays, backend="reference", symbolic=None, outputs=1):
    """Build a graph whose inputs are `arrays`, apply `fn`, run it, return the output array(s).

    `symbolic` maps an input position to a tuple of dim names/None per axis (None keeps the size).
    """
    g = lm.Graph()
    tensors = []
    for k, a in enumerate(arrays):
        a = np.asarray(a)
        shape = list(a.shape)
        if symbolic and k in symbolic:
            shape = [n if n is not None else s for n, s in zip(symbolic[k], shape)]
        dtype = a.dtype if a.dtype != np.float64 else np.float32
        tensors.append(g.tensor(f"in{k}", tuple(shape), dtype=dtype.name))
    result = fn(*tensors)
    results = result if isinstance(result, (tuple, list)) else (result,)
    for k, r in enumerate(results):
        r.output(f"out{k}")
    program = g.compile(backend)
    out = program(**{f"in{k}": np.asarray(a) if np.asarray(a).dtype != np.float64 else np.asarray(a, np.float32)
                     for k, a in enumerate(arrays)})
    values = [out[f"out{k}"] for k in range(len(results))]
    return tuple(values) if isinstance(result, (tuple, list)) else values[0]


def run_torch(fn, *arrays):
    import torch
    tensors = [torch.from_numpy(np.array(a)) for a in arrays]
    result = fn(*tensors)
    results = result if isinstance(result, (tuple, list)) else (result,)
    values = [r.detach().numpy() if hasattr(r, "detach") else np.asarray(r) for r in results]
    return tuple(values) if isinstance(result, (tuple, list)) else values[0]


def check(fn, *arrays, backend="reference", torch_fn=None, rtol=1e-5, atol=1e-6, symbolic=None):
    """Assert luminar(fn) == torch(torch_fn or fn) on `arrays`; returns luminar's result."""
    ours = run_luminar(fn, *arrays, backend=backend, symbolic=symbolic)
    theirs = run_torch(torch_fn or fn, *arrays)
    ours_t = ours if isinstance(ours, tuple) else (ours,)
    theirs_t = theirs if isinstance(theirs, tuple) else (theirs,)
    assert len(ours_t) == len(theirs_t)
    for a, b in zip(ours_t, theirs_t):
        b = np.asarray(b)
        assert a.shape == b.shape, f"shape {a.shape} != torch {b.shape}"
        np.testing.assert_allclose(a, b.astype(np.float32), rtol=rtol, atol=atol)
    return ours


class Q4Tensor:
    """A random Q4_1 weight as the GGUF reader hands it to luminar.io.quant.weight (rows x cols)."""
    qtype = "Q4_1"

    def __init__(self, rows, cols, seed=0):
        rng = np.random.default_rng(seed)
        blocks = cols // 32
        self.shape = (rows, cols)
        self.parts = {"scale": (rng.standard_normal((rows, blocks)) * 0.05).astype(np.float16),
                      "min": (rng.standard_normal((rows, blocks)) * 0.05).astype(np.float16),
                      "quants": rng.integers(0, 256, (rows, blocks, 16), dtype=np.uint8)}
