"""Graph building, running through a compiled Program, dtypes, and the errors users see."""
import shutil
import subprocess

import numpy as np
import pytest

import luminar as lm
from conftest import rand


def test_design_example_runs_and_binds_s_at_run_time(backend):
    g = lm.Graph()
    x = g.tensor("x", (2, "s", 64))
    w = g.tensor("w", (64, 64))
    (x @ w).softmax(-1).output("y")
    model = g.compile(backend)
    for s in (7, 3):  # one compiled program, two sequence lengths
        xa = rand(2, s, 64, seed=s)
        out = model(x=xa, w=np.eye(64, dtype=np.float32))
        e = np.exp(xa - xa.max(-1, keepdims=True))
        np.testing.assert_allclose(out["y"], e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_inputs_can_be_passed_as_a_dict_and_outputs_are_float32(backend):
    g = lm.Graph()
    a = g.tensor("a", (3,))
    (a * 2).output("double")
    out = g.compile(backend)({"a": np.array([1, 2, 3], np.float32)})
    assert out["double"].dtype == np.float32
    np.testing.assert_array_equal(out["double"], [2, 4, 6])


def test_output_may_be_a_view(backend):
    g = lm.Graph()
    a = g.tensor("a", (2, 3))
    a.T.output("t")
    a[:, 1].output("col")
    data = rand(2, 3)
    out = g.compile(backend)(a=data)
    np.testing.assert_array_equal(out["t"], data.T)
    np.testing.assert_array_equal(out["col"], data[:, 1])


def test_dim_expressions_are_checked_against_the_dims_inputs_bind(backend):
    g = lm.Graph()
    x = g.tensor("x", ("s",))
    y = g.tensor("y", (lm.Var("s", 1, None) + 1,))  # length s + 1, with s bound by x
    (x.sum() + y.sum()).output("total")
    model = g.compile(backend)
    assert model(x=np.ones(4, np.float32), y=np.ones(5, np.float32))["total"] == 9
    with pytest.raises(lm.DimensionError, match=r"input 'y' axis 0: expected s \+ 1 = 5, got 6"):
        model(x=np.ones(4, np.float32), y=np.ones(6, np.float32))


def test_dims_only_used_in_constants_are_passed_explicitly(backend):
    g = lm.Graph()
    g.arange("n").output("r")
    model = g.compile(backend)
    with pytest.raises(lm.DimensionError, match="'n' is not bound"):
        model()
    np.testing.assert_array_equal(model.run({}, dims={"n": 4})["r"], [0, 1, 2, 3])


@pytest.mark.parametrize("dtype,array,expected", [
    ("float16", np.array([1.5, -2.25], np.float16), [1.5, -2.25]),
    ("int8", np.array([-128, 127], np.int8), [-128, 127]),
    ("uint8", np.array([0, 255], np.uint8), [0, 255]),
    ("int32", np.array([-5, 1 << 20], np.int32), [-5, 1 << 20]),
    ("bfloat16", np.array([0x3FC0, 0xC000], np.uint16), [1.5, -2.0]),  # raw bf16 bit patterns
    ("bfloat16", np.array([1.5, -2.0], np.float32), [1.5, -2.0]),  # float32 rounded to bf16 on the way in
])
def test_storage_dtypes_load_as_float32(backend, dtype, array, expected):
    g = lm.Graph()
    x = g.tensor("x", (2,), dtype=dtype)
    assert x.dtype == dtype
    (x + 0.5).output("y")
    np.testing.assert_array_equal(g.compile(backend)(x=array)["y"], np.array(expected, np.float32) + 0.5)


def test_every_float16_bit_pattern_loads_as_numpy_converts_it(backend):
    # all 65536 halves: normals, subnormals, both zeros, infinities, NaNs (kernels read the bits)
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    g = lm.Graph()
    (g.tensor("x", (1 << 16,), dtype="float16") * 1.0).output("y")
    y, expected = g.compile(backend)(x=bits.view(np.float16))["y"], bits.view(np.float16).astype(np.float32)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(expected))
    finite = ~np.isnan(expected)
    np.testing.assert_array_equal(y[finite].view(np.uint32), expected[finite].view(np.uint32))  # -0.0 included


def test_bfloat16_matches_torch_rounding(backend):
    torch = pytest.importorskip("torch")
    values = rand(64, seed=3) * 100
    g = lm.Graph()
    g.tensor("x", (64,), dtype="bfloat16").output("y")
    expected = torch.from_numpy(values).to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(g.compile(backend)(x=values)["y"], expected)


# -- errors: each names the tensor and both the expected and the actual value ---------------------

def _model(backend, **shapes):
    g = lm.Graph()
    ts = [g.tensor(name, shape) for name, shape in shapes.items()]
    sum(t.sum() for t in ts).output("out")
    return g.compile(backend)


def test_wrong_rank_names_input_and_shapes(backend):
    with pytest.raises(lm.ShapeError, match=r"input 'x': expected rank 2 .*\(2, 3\).*got rank 1 .*\(6,\)"):
        _model(backend, x=(2, 3))(x=np.zeros(6, np.float32))


def test_wrong_size_names_axis_and_values(backend):
    with pytest.raises(lm.ShapeError, match=r"input 'x': expected shape \(2, 3\), got \(2, 4\) \(axis 1: expected 3, got 4\)"):
        _model(backend, x=(2, 3))(x=np.zeros((2, 4), np.float32))


def test_inconsistent_symbolic_dim_names_both_inputs(backend):
    model = _model(backend, x=("s",), y=("s", 2))
    with pytest.raises(lm.DimensionError, match=r"input 'y' axis 0: expected s = 3, got 4.*bound by input 'x' axis 0"):
        model(x=np.zeros(3, np.float32), y=np.zeros((4, 2), np.float32))


def test_symbolic_dim_bound_to_zero_is_rejected(backend):
    with pytest.raises(lm.DimensionError, match="'s' is bound to 0"):
        _model(backend, x=("s",))(x=np.zeros(0, np.float32))


def test_missing_and_unknown_inputs(backend):
    model = _model(backend, x=(2,), y=(2,))
    with pytest.raises(lm.InputError, match=r"missing input 'y'; the graph's inputs are \['x', 'y'\]"):
        model(x=np.zeros(2, np.float32))
    with pytest.raises(lm.InputError, match="unknown input 'z'"):
        model(x=np.zeros(2, np.float32), y=np.zeros(2, np.float32), z=1)


def test_dtype_mismatch_is_reported_not_silently_cast(backend):
    model = _model(backend, x=(2,))
    with pytest.raises(lm.DTypeError, match="input 'x': expected dtype float32, got float64"):
        model(x=np.zeros(2, np.float64))
    model(x=np.zeros(2, np.int8))  # lossless conversions are fine
    model(x=[1.0, 2.0])  # Python lists are read as the declared dtype


@pytest.mark.parametrize("dtype", ["complex64", "float64", "int64", "bool", "nonsense"])
def test_unsupported_dtype(dtype):
    with pytest.raises(lm.DTypeError, match=f"unsupported dtype '{dtype}'"):
        lm.Graph().tensor("x", (2,), dtype=dtype)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_constants_are_rejected(value):
    g = lm.Graph()
    x = g.tensor("x", (2,))
    with pytest.raises(lm.ValueDomainError, match="not finite"):
        x + value


@pytest.mark.parametrize("shape,match", [((2, -1), "sizes must be >= 0"), ((2.5,), "invalid dimension 2.5"),
                                         (("_s",), "invalid dimension name '_s'"), (("a b",), "invalid dimension name")])
def test_invalid_declared_shapes(shape, match):
    with pytest.raises(lm.ShapeError, match=match):
        lm.Graph().tensor("x", shape)


def test_duplicate_and_invalid_input_names():
    g = lm.Graph()
    g.tensor("x", (1,))
    with pytest.raises(lm.InputError, match="already declared"):
        g.tensor("x", (1,))
    with pytest.raises(lm.InputError, match="identifier"):
        g.tensor("not valid", (1,))


def test_compile_needs_outputs_and_a_known_backend():
    g = lm.Graph()
    x = g.tensor("x", (1,))
    with pytest.raises(lm.ShapeError, match="no outputs"):
        g.compile("reference")
    x.output("y")
    with pytest.raises(lm.UnsupportedError, match="unknown backend 'tpu'"):
        g.compile("tpu")


def test_mixing_graphs_and_using_tensors_as_bools_fail_clearly():
    a, b = lm.Graph().tensor("a", (1,)), lm.Graph().tensor("b", (1,))
    with pytest.raises(lm.LuminarError, match="different graphs"):
        a + b
    with pytest.raises(lm.LuminarError, match="no value until the graph runs"):
        bool(a > 0)
    with pytest.raises(lm.UnsupportedError, match="cannot combine a GraphTensor with str"):
        a + "1"


# -- pictures ------------------------------------------------------------------------------------

def _small_graph():
    g = lm.Graph()
    x = g.tensor("x", (2, "s"))
    (x.T * 2).sum(0).output("y")
    return g


def test_to_dot_lists_every_node_and_output():
    g = _small_graph()
    dot = g.to_dot()
    assert dot.startswith("digraph luminar {") and dot.rstrip().endswith("}")
    for node in g.nodes:
        assert f"n{node.id} [" in dot
    assert "x: input float32" in dot and "sum_reduce axis=0" in dot and 'out_y [label="y"' in dot


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz's dot is not installed (.ci/run installs it)")
def test_dot_renders_with_graphviz():
    svg = subprocess.run(["dot", "-Tsvg"], input=_small_graph().to_dot(), capture_output=True, text=True, check=True)
    assert "<svg" in svg.stdout
    pytest.importorskip("graphviz")
    assert "digraph" in _small_graph().display().source


def test_set_inputs_keeps_weights_across_calls(backend):
    g = lm.Graph()
    x, w = g.tensor("x", ("s", 3)), g.tensor("w", (3, 2))
    (x @ w).output("y")
    wa = rand(3, 2)
    model = g.compile(backend).set_inputs(w=wa)
    for s in (1, 4):
        xa = rand(s, 3, seed=s)
        np.testing.assert_allclose(model(x=xa)["y"], xa @ wa, rtol=1e-5, atol=1e-6)
    with pytest.raises(lm.ShapeError, match=r"input 'w': expected shape \(3, 2\), got \(2, 3\)"):
        model.set_inputs(w=wa.T)
    with pytest.raises(lm.InputError, match="unknown input 'v'"):
        model.set_inputs(v=wa)


@pytest.mark.parametrize("start,length", [(-2, 2), (1, 3), (0, 5)])
def test_narrow_matches_torch(backend, start, length):
    from conftest import check
    check(lambda x: x.narrow(1, start, length) * 1.0, rand(2, 5), backend=backend)


@pytest.mark.parametrize("start,length", [(4, 3), (-6, 1), (0, -1)])
def test_narrow_out_of_range_is_an_error(start, length):
    with pytest.raises(lm.ShapeError, match="narrow"):
        lm.Graph().tensor("x", (2, 5)).narrow(1, start, length)
