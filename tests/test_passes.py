"""The generic graph passes: each one keeps results unchanged and removes the nodes it promises to.

Every test builds a small graph, compiles it with no passes and with the pass under test, checks
both give the same outputs, and counts what is left in the optimized graph.
"""
from collections import Counter

import numpy as np
import pytest

import luminar as lm
from conftest import rand
from luminar.compiler.passes import DEFAULT_PIPELINE, PASSES, optimize


def build(fn, **shapes):
    """A graph with inputs `shapes` (name -> shape) and the output(s) of fn(*inputs) as out0, out1..."""
    g = lm.Graph()
    result = fn(*(g.tensor(name, shape) for name, shape in shapes.items()))
    for k, r in enumerate(result if isinstance(result, tuple) else (result,)):
        r.output(f"out{k}")
    return g


def compile_and_compare(g, passes, backend, inputs=None):
    """Compile `g` with `passes` and without; assert equal outputs; return the optimized program."""
    inputs = inputs or {name: rand(*(d.value for d in node.shape), seed=k)
                        for k, (name, node) in enumerate(g.inputs.items())}
    plain, optimized = g.compile(backend, passes=[]), g.compile(backend, passes=passes)
    expected, actual = plain(**inputs), optimized(**inputs)
    assert expected.keys() == actual.keys()
    for name in expected:
        np.testing.assert_allclose(actual[name], expected[name], rtol=1e-6, atol=1e-7, equal_nan=True)
    return optimized


def ops(program) -> Counter:
    """How many nodes of each op the compiled graph holds."""
    return Counter(node.op for node in program.graph.nodes)


# -- the pipeline's contract ---------------------------------------------------------------------
def test_compile_never_changes_the_users_graph(backend):
    g = build(lambda x: (x * 1.0 + 0.0).exp2() + (x * 1.0 + 0.0).exp2(), x=(2, 3))
    before = [(n, n.op, n.srcs, n.id) for n in g.nodes]
    outputs = dict(g.outputs)
    compile_and_compare(g, None, backend)
    assert [(n, n.op, n.srcs, n.id) for n in g.nodes] == before
    assert g.outputs == outputs


def test_the_graph_can_grow_and_compile_again_after_compile(backend):
    g = lm.Graph()
    x = g.tensor("x", (3,))
    (x * 2.0).output("a")
    first = g.compile(backend)
    (x * 2.0 + 1.0).output("b")
    second = g.compile(backend)
    data = rand(3)
    assert set(first(x=data)) == {"a"}
    np.testing.assert_allclose(second(x=data)["b"], data * 2 + 1, rtol=1e-6)


def test_unused_inputs_are_kept_and_still_required(backend):
    g = build(lambda x, unused: x.sin(), x=(2,), unused=(4,))
    program = compile_and_compare(g, None, backend)
    assert list(program.graph.inputs) == ["x", "unused"]
    with pytest.raises(lm.InputError, match="missing input 'unused'"):
        program(x=rand(2))


def test_no_passes_is_a_plain_copy(backend):
    g = build(lambda x: x * 1.0, x=(2,))
    program = compile_and_compare(g, [], backend)
    assert [n.op for n in program.graph.nodes] == [n.op for n in g.nodes]
    assert not set(map(id, program.graph.nodes)) & set(map(id, g.nodes))


def test_default_pipeline_is_made_of_registered_passes():
    assert set(DEFAULT_PIPELINE) <= set(PASSES)


@pytest.mark.parametrize("passes,message", [
    (["cse", "inline"], "unknown compiler pass 'inline'"),
    ("cse", "passes must be a list"),
])
def test_bad_pass_lists_are_rejected(passes, message):
    g = build(lambda x: x * 2.0, x=(2,))
    with pytest.raises(lm.UnsupportedError, match=message):
        g.compile("reference", passes=passes)


def test_optimize_returns_same_outputs_and_inputs():
    g = build(lambda x, y: (x + y, x.T), x=(2, 2), y=(2, 2))
    new = optimize(g)
    assert new is not g and list(new.outputs) == ["out0", "out1"] and list(new.inputs) == ["x", "y"]
    assert [n.id for n in new.nodes] == list(range(len(new.nodes)))


def test_optimizing_is_deterministic():
    g = build(lambda x, y: (x * y + y * x).exp2() * 2.0 * 3.0 + (y * x).exp2(), x=(2, 3), y=(3,))
    assert list(map(repr, optimize(g).nodes)) == list(map(repr, optimize(g).nodes))


# -- dead-node removal ---------------------------------------------------------------------------
def test_dce_removes_nodes_no_output_needs(backend):
    def fn(x):
        x.exp2().sin()  # built, never used
        return x.sqrt()
    program = compile_and_compare(build(fn, x=(3,)), ["dce"], backend)
    assert ops(program) == {"input": 1, "sqrt": 1}


# -- common-subexpression elimination ------------------------------------------------------------
def test_cse_computes_a_repeated_subexpression_once(backend):
    g = build(lambda x: (x.sin() * 2.0).exp2() + (x.sin() * 2.0).exp2(), x=(2, 3))
    program = compile_and_compare(g, ["cse"], backend)
    assert ops(program) == {"input": 1, "sin": 1, "constant": 1, "mul": 1, "exp2": 1, "add": 1}


def test_cse_merges_commutative_operands(backend):
    g = build(lambda x, y: (x * y).sin() + (y * x).sin(), x=(3,), y=(3,))
    assert ops(compile_and_compare(g, ["cse"], backend))["mul"] == 1


def test_cse_merges_across_outputs(backend):
    g = build(lambda x: (x.exp2(), x.exp2().T), x=(2, 3))
    assert ops(compile_and_compare(g, ["cse"], backend))["exp2"] == 1


def test_cse_keeps_different_views_apart(backend):
    g = build(lambda x: x.exp2() + x.T.exp2(), x=(3, 3))
    assert ops(compile_and_compare(g, ["cse"], backend))["exp2"] == 2


def test_cse_keeps_zero_and_negative_zero_apart(backend):
    g = build(lambda x: (x * 0.0).reciprocal() + (x * -0.0).reciprocal(), x=(2,))
    program = compile_and_compare(g, ["cse"], backend, {"x": np.array([1.0, -1.0], np.float32)})
    assert ops(program)["recip"] == 2


def test_cse_never_merges_inputs(backend):
    g = build(lambda a, b: a + b, a=(2,), b=(2,))
    assert ops(compile_and_compare(g, ["cse"], backend))["input"] == 2


# -- constant folding ----------------------------------------------------------------------------
def constant_chain(x):
    c = (x.graph.constant(2.0, (3,)) * 3.0 + 1.0).sqrt().reciprocal()
    return x + c


def test_fold_turns_constant_arithmetic_into_one_constant(backend):
    program = compile_and_compare(build(constant_chain, x=(2, 3)), ["fold"], backend)
    assert ops(program) == {"input": 1, "constant": 1, "add": 1}


@pytest.mark.parametrize("reduce,expected", [("sum", 1.5 * 4), ("amax", 1.5)])
def test_fold_reduces_a_broadcast_constant(backend, reduce, expected):
    g = lm.Graph()
    x = g.tensor("x", (3,))
    (x + getattr(g.constant(1.5, (3, 4)), reduce)(-1)).output("y")
    program = compile_and_compare(g, ["fold"], backend)
    assert ops(program) == {"input": 1, "constant": 1, "add": 1}
    np.testing.assert_allclose(program(x=np.zeros(3, np.float32))["y"], [expected] * 3)


def test_fold_may_produce_inf_internally(backend):
    g = build(lambda x: x * (x.graph.constant(0.0) * 1.0).reciprocal(), x=(2,))
    program = compile_and_compare(g, ["fold"], backend, {"x": np.array([1.0, -1.0], np.float32)})
    assert ops(program) == {"input": 1, "constant": 1, "mul": 1}
    np.testing.assert_array_equal(program(x=np.array([1.0, -1.0], np.float32))["out0"], [np.inf, -np.inf])


def test_fold_does_not_treat_a_padded_constant_as_uniform(backend):
    g = build(lambda x: x + x.graph.constant(1.0, (3,)).pad((1, 1)) * 2.0, x=(5,))
    program = compile_and_compare(g, ["fold"], backend, {"x": np.zeros(5, np.float32)})
    assert ops(program)["mul"] == 1
    np.testing.assert_array_equal(program(x=np.zeros(5, np.float32))["out0"], [0, 2, 2, 2, 0])


def test_fold_leaves_a_sum_over_a_symbolic_length_alone(backend):
    g = lm.Graph()
    x = g.tensor("x", ("s",))
    (x * 0.0 + g.constant(1.0, ("s",)).sum()).output("y")
    program = g.compile(backend, passes=["fold"])
    assert ops(program)["sum_reduce"] == 1
    np.testing.assert_array_equal(program(x=np.zeros(4, np.float32))["y"], [4, 4, 4, 4])


# -- algebraic cleanup ---------------------------------------------------------------------------
@pytest.mark.parametrize("fn", [
    lambda x: x * 1.0 + 0.0,
    lambda x: 0.0 + 1.0 * x,
    lambda x: x.reciprocal().reciprocal(),
    lambda x: -(-x),
    lambda x: (x + 1.0) + -1.0,
    lambda x: x.sum(0),  # a reduction over a length-1 axis
    lambda x: x.contiguous(),
], ids=["mul1-add0", "reversed-operands", "recip-recip", "neg-neg", "add-then-undo", "reduce-length-1", "contiguous"])
def test_simplify_reduces_identities_to_the_input(backend, fn):
    program = compile_and_compare(build(fn, x=(1, 3)), ["simplify"], backend)
    assert ops(program) == {"input": 1}


def test_simplify_merges_constant_factors(backend):
    program = compile_and_compare(build(lambda x: (x * 2.0) * 3.0 + 1.0 + 2.0, x=(2, 3)), ["simplify"], backend)
    assert ops(program) == {"input": 1, "constant": 2, "mul": 1, "add": 1}
    np.testing.assert_allclose(program(x=np.ones((2, 3), np.float32))["out0"], np.full((2, 3), 9.0))


def test_simplify_looks_through_views(backend):
    program = compile_and_compare(build(lambda x: (x * 1.0).T[1:] * 1.0, x=(2, 3)), ["simplify"], backend)
    assert ops(program) == {"input": 1}


def test_simplify_keeps_a_node_when_views_do_not_compose(backend):
    # x[:, ::2] * 1 is read transposed: slice-then-transpose is not one tracker the pass can build
    program = compile_and_compare(build(lambda x: (x[:, ::2] * 1.0).T[1:] + 2.0, x=(2, 6)), ["simplify"], backend)
    assert ops(program)["mul"] == 1


def test_simplify_does_not_fold_multiplication_by_zero(backend):
    program = compile_and_compare(build(lambda x: x * 0.0, x=(3,)), ["simplify"], backend,
                                  {"x": np.array([np.inf, np.nan, 2.0], np.float32)})
    assert ops(program)["mul"] == 1
    np.testing.assert_array_equal(program(x=np.array([np.inf, np.nan, 2.0], np.float32))["out0"], [np.nan, np.nan, 0])


def test_simplify_works_with_symbolic_dims(backend):
    g = lm.Graph()
    x = g.tensor("x", (2, "s"))
    ((x * 1.0).sum(-1, keepdim=True) * 2.0 * 0.5).output("y")
    program = compile_and_compare(g, ["simplify"], backend, {"x": rand(2, 5)})
    assert ops(program) == {"input": 1, "sum_reduce": 1}


def test_default_pipeline_combines_the_passes(backend):
    def fn(x, unused):
        a = (x * 1.0).exp2() * constant_chain(x)
        dead = x.sin()  # noqa: F841 (dead on purpose)
        return a + (x + 0.0).exp2() * constant_chain(x)
    program = compile_and_compare(build(fn, x=(2, 3), unused=(1,)), None, backend)
    # both halves become exp2(x) * (x + c): computed once, then added to itself
    assert ops(program) == {"input": 2, "exp2": 1, "constant": 1, "add": 2, "mul": 1}


def test_a_folded_constant_read_through_padding_keeps_the_zeros(backend):
    def fn(x):
        c = x.graph.constant(0.5, x.dims) * 3.0 + 0.5  # folds to a constant 2.0 of x's shape
        return x + c.pad((1, 1))[:, 2:]
    program = compile_and_compare(build(fn, x=(2, 4)), None, backend)
    assert ops(program) == {"input": 1, "constant": 1, "add": 1}
    np.testing.assert_array_equal(program(x=np.zeros((2, 4), np.float32))["out0"], [[2, 2, 2, 0]] * 2)
