"""Tests for luminar.symbolic: random expressions against a plain-Python oracle, plus unit
tests that document each simplification, the errors and the C rendering."""
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from luminar.symbolic import C_HELPERS, Expr, Var, smin, smax, sym

# -- random expressions: a nested tuple, built two ways ------------------------------------

BOUNDS = {"a": (0, 7), "b": (0, 15), "c": (-5, 5), "n": (1, 20)}
VARS = {name: Var(name, lo, hi) for name, (lo, hi) in BOUNDS.items()}
BINARY = ["+", "-", "*", "min", "max", "lt", "le", "gt", "ge", "eq", "ne", "and", "or"]

leaves = st.one_of(
    st.sampled_from(sorted(BOUNDS)).map(lambda name: ("var", name)),
    st.integers(-10, 10).map(lambda k: ("const", k)),
)
# Divisors never reach zero: a nonzero constant (negative ones test floor semantics) or n >= 1.
divisors = st.one_of(
    st.just(("var", "n")),
    st.one_of(st.integers(1, 9), st.integers(-4, -1)).map(lambda k: ("const", k)),
)


def _extend(children):
    return st.one_of(
        st.tuples(st.sampled_from(BINARY), children, children),
        st.tuples(st.sampled_from(["//", "%"]), children, divisors),
        st.tuples(st.sampled_from(["neg", "not"]), children),
    )


trees = st.recursive(leaves, _extend, max_leaves=14)
assignments = st.fixed_dictionaries({name: st.integers(lo, hi) for name, (lo, hi) in BOUNDS.items()})


def build(tree) -> Expr:
    """The tree as a (simplified) symbolic expression."""
    kind = tree[0]
    if kind == "var":
        return VARS[tree[1]]
    if kind == "const":
        return sym(tree[1])
    if kind == "neg":
        return -build(tree[1])
    if kind == "not":
        return ~build(tree[1])
    a, b = build(tree[1]), build(tree[2])
    methods = {"+": Expr.__add__, "-": Expr.__sub__, "*": Expr.__mul__, "//": Expr.__floordiv__,
               "%": Expr.__mod__, "min": smin, "max": smax, "lt": Expr.lt, "le": Expr.le,
               "gt": Expr.gt, "ge": Expr.ge, "eq": Expr.eq, "ne": Expr.ne, "and": Expr.__and__,
               "or": Expr.__or__}
    return methods[kind](a, b)


def oracle(tree, env: dict) -> int:
    """The tree evaluated with plain Python ints, independent of luminar."""
    kind = tree[0]
    if kind == "var":
        return env[tree[1]]
    if kind == "const":
        return tree[1]
    if kind == "neg":
        return -oracle(tree[1], env)
    if kind == "not":
        return int(not oracle(tree[1], env))
    a, b = oracle(tree[1], env), oracle(tree[2], env)
    return {
        "+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "//": lambda: a // b,
        "%": lambda: a % b, "min": lambda: min(a, b), "max": lambda: max(a, b),
        "lt": lambda: int(a < b), "le": lambda: int(a <= b), "gt": lambda: int(a > b),
        "ge": lambda: int(a >= b), "eq": lambda: int(a == b), "ne": lambda: int(a != b),
        "and": lambda: int(bool(a) and bool(b)), "or": lambda: int(bool(a) or bool(b)),
    }[kind]()


@settings(max_examples=400, deadline=None)
@given(tree=trees, envs=st.lists(assignments, min_size=1, max_size=6))
def test_simplified_expression_matches_oracle(tree, envs):
    expr = build(tree)
    expected = [oracle(tree, env) for env in envs]
    lo, hi = expr.bounds()
    for env, want in zip(envs, expected):
        got = expr.evaluate(env)
        assert type(got) is int and got == want, (str(expr), env)
        assert (lo is None or lo <= want) and (hi is None or want <= hi), (str(expr), env)
        assert expr.substitute(env) == sym(want)
    arrays = {name: np.array([env[name] for env in envs], dtype=np.int64) for name in BOUNDS}
    got = np.broadcast_to(expr.evaluate(arrays), (len(envs),))
    assert got.tolist() == expected
    assert str(build(tree)) == str(expr) and build(tree) == expr  # deterministic rebuild
    expr.render_c()  # renders every node type without error


# -- construction and inspection ----------------------------------------------------------

def test_sym_conversions():
    assert sym(3).is_const and sym(3).value == 3 and int(sym(3)) == 3
    assert sym(True) == sym(1) and sym(False) == 0
    assert sym("s") == Var("s") and Var("s").bounds() == (0, None)
    e = Var("x", 1, 4)
    assert sym(e) is e
    for bad in (1.5, None, [1]):
        with pytest.raises(TypeError):
            sym(bad)


def test_bounds_are_part_of_identity_and_exprs_are_dict_keys():
    assert Var("i", 0, 9) != Var("i", 0, 10)
    a = Var("a", 0, 7)
    table = {a + 1: "x", a * 2: "y"}
    assert table[1 + a] == "x" and table[2 * a] == "y"


def test_value_of_non_constant_raises():
    with pytest.raises(ValueError):
        Var("s").value
    with pytest.raises((TypeError, ValueError)):
        int(Var("s") + 1)


def test_vars_and_substitute():
    s, t = Var("s", 1), Var("t", 0)
    e = (s + t) // 8
    assert e.vars() == frozenset({"s", "t"})
    assert e.substitute({"s": 15}) == (t + 15) // 8
    assert e.substitute({"unknown": 3}) == e
    assert e.substitute({"s": 3, "t": 5}) == 1


def test_evaluate_missing_variable_names_it():
    with pytest.raises(KeyError, match="seq"):
        (Var("seq") + 1).evaluate({})


def test_evaluate_vectorized():
    i, j = Var("i", 0, 3), Var("j", 0, 2)
    env = {"i": np.arange(4)[:, None], "j": np.arange(3)[None, :]}
    np.testing.assert_array_equal((i * 3 + j).evaluate(env), np.arange(12).reshape(4, 3))
    valid = (i.ge(1) & j.lt(2)).evaluate(env)
    assert valid.dtype == np.int64 and valid.sum() == 6


# -- simplifications -----------------------------------------------------------------------

a, b, c = Var("a", 0, 7), Var("b", 0, 7), Var("c", -5, 5)
s = Var("s", 1, None)


def test_linear_combinations():
    assert a + 0 == a and a * 1 == a and a * 0 == 0 and a - a == 0
    assert a + a == 2 * a
    assert 2 * (a + 3) == 2 * a + 6
    assert (a + b) - (b + a) == 0
    assert 3 * (2 * (a * b)) == (a * 6) * b
    assert str(1 + a * 64 + b) == "a * 64 + b + 1"


def test_division_by_constants():
    assert a // 8 == 0 and a % 8 == a
    assert (a * 8 + b) // 8 == a
    assert (a * 8 + b) % 8 == b
    assert (a * 8 + c) // 8 == a + c // 8  # c may be negative, so c // 8 stays
    assert (a * 8) // 8 == a and (a * 8) % 8 == 0
    assert (s // 4) // 2 == s // 8
    assert (s % 12) % 4 == s % 4
    assert (a * 4 + b * 2) // 8 == (a * 2 + b) // 4  # common factor cancels
    assert (s + 16) // 8 == s // 8 + 2
    assert (s + 8 * a + 3) % 8 == (s + 3) % 8
    assert a // 1 == a and a % 1 == 0 and 0 // s == 0 and 0 % s == 0


def test_division_by_a_symbolic_factor_is_exact():
    """Flattening a symbolic shape divides numel by a dim: (s*8) // s must come out as 8."""
    t = Var("t", 1, None)
    assert (s * 8) // s == 8 and (s * 8) % s == 0
    assert (s * t * 24) // (s * 8) == t * 3
    assert (s * t * 6 + s * 4) // (s * 2) == t * 3 + 2
    assert str((s * t + 1) // s) == "(s * t + 1) // s"  # not a multiple: left alone
    assert str((s * t) // (t * 4)) == "s * t // (t * 4)"


def test_division_drops_a_remainder_smaller_than_the_common_factor():
    """A merged view's flat index divided back into its digits: (g*X + R) // (g*k) == X // k and
    (g*X + R) % (g*k) == g*(X % k) + R whenever 0 <= R < g, whatever the sign of X."""
    d, e, r = Var("d", 0, 63), Var("e", 0, 40), Var("r", -5, None)
    flat = r * 2624 + d * 41 + e
    assert flat // 335872 == r // 128
    assert flat % 335872 == (r % 128) * 2624 + d * 41 + e
    assert str((flat + 1) // 335872) != str(r // 128)  # R may reach 2624: not simplified
    for env in ({"d": 63, "e": 40, "r": -3}, {"d": 5, "e": 0, "r": 300}):
        value = flat.evaluate(env)
        assert (flat // 335872).evaluate(env) == value // 335872
        assert (flat % 335872).evaluate(env) == value % 335872


def test_division_semantics_are_python_floor():
    assert sym(-7) // 2 == -4 and sym(-7) % 2 == 1 and sym(7) % -2 == -1
    for value in range(-5, 6):
        assert (c // 3).evaluate({"c": value}) == value // 3
        assert (c % -3).evaluate({"c": value}) == value % -3


def test_division_by_zero_raises_at_construction():
    with pytest.raises(ZeroDivisionError):
        a // 0
    with pytest.raises(ZeroDivisionError):
        a % sym(0)


def test_div_mod_recombination():
    assert (s // 8) * 8 + s % 8 == s
    i = Var("i", 0, 23)  # split as (2, 3, 4) by a reshape, then merged back
    assert (i // 12) * 12 + ((i // 4) % 3) * 4 + i % 4 == i


def test_min_max():
    assert smin(a, 8) == a and smax(a, 8) == 8 and smin(3, 5) == 3 and smax(a, a) == a
    assert str(smin(a, 3)) == "min(a, 3)"
    assert smin(a, b) == smin(b, a)
    assert smax(c, 0).bounds() == (0, 5)


def test_comparisons_and_logic():
    i = Var("i", 0, 9)
    assert i.lt(10) == 1 and i.ge(0) == 1 and i.gt(9) == 0 and (i + 1).gt(i) == 1
    assert i.eq(i) == 1 and i.ne(i) == 0
    cond = i.lt(5)
    assert cond & 1 == cond and cond & 0 == 0 and cond | 1 == 1 and cond | 0 == cond
    assert (i & 1) == i.ne(0)  # a non-boolean operand becomes its truth value
    assert ~i.lt(5) == i.ge(5) and ~~cond == cond
    assert cond.bounds() == (0, 1)


def test_bounds():
    assert (a * c).bounds() == (-35, 35)
    assert (c * -2 + 1).bounds() == (-9, 11)
    assert (c // 2).bounds() == (-3, 2) and (c // -2).bounds() == (-3, 2)
    assert (s % 8).bounds() == (0, 7) and (b % Var("n", 1, 20)).bounds() == (0, 7)
    assert (s * 2).bounds() == (2, None) and (-s).bounds() == (None, -1)
    assert Var("u", None, None).bounds() == (None, None)


def test_str_is_readable_and_deterministic():
    d0, d1, d2 = Var("_d0", 0, 3), Var("_d1", 0, 63), Var("_d2", 0, 10)
    assert str(s + 1) == "s + 1"
    assert str((s + 7) // 8) == "(s + 7) // 8"
    assert str(d1 + d0 * 64) == "_d0 * 64 + _d1"
    assert str(d2.ge(1) & d2.lt(9)) == "(_d2 < 9) & (_d2 >= 1)"
    assert repr(a - b) == "a - b"


def test_structure_does_not_depend_on_hash_seed():
    code = ("from luminar.symbolic import Var, smin\n"
            "v = [Var(n, 0, 9) for n in 'zyxwvu']\n"
            "e = sum(v[1:], v[0] * 3) // 4 + smin(v[2], v[4]) * v[1] + (v[0].lt(v[3]) & v[5].ne(2))\n"
            "print(e, e.render_c())")
    outputs = set()
    for seed in ("0", "1", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=os.pathsep.join(sys.path))
        outputs.add(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                   text=True, check=True).stdout)
    assert len(outputs) == 1


# -- C rendering ---------------------------------------------------------------------------

def test_render_c():
    """C spells a graph dim with a prefix, so no dim name can collide with a name of the generated
    code; loop variables (_d0, _r1: never user names) keep theirs."""
    assert ((s + 7) // 8).render_c() == "((lm_dim_s + 7) / 8)" and Var("_d0", 0, 5).render_c() == "_d0"
    n = Var("n", 1, 20)
    assert (s % 8).render_c().replace('lm_dim_', '') == "(s % 8)"
    assert (a // n).render_c().replace('lm_dim_', '') == "(a / n)"
    assert (c // 3).render_c().replace('lm_dim_', '') == "lm_floordiv(c, 3)"
    assert (c % 4).render_c().replace('lm_dim_', '') == "lm_mod(c, 4)"
    assert (a // -2).render_c().replace('lm_dim_', '') == "lm_floordiv(a, (-2))"
    assert (a * 64 + b).render_c().replace('lm_dim_', '') == "(a*64 + b)"
    assert (a - b * 2 - 1).render_c().replace('lm_dim_', '') == "(a - b*2 - 1)"
    assert smin(a, b).render_c().replace('lm_dim_', '') == "((a)<(b)?(a):(b))"
    assert smax(a, b).render_c().replace('lm_dim_', '') == "((a)>(b)?(a):(b))"
    assert (a.lt(b) & c.ge(1)).render_c().replace('lm_dim_', '') == "((a<b) && (c>=1))"
    assert (a.eq(3) | c.ne(b)).render_c().replace('lm_dim_', '') == "((a==3) || (b!=c))"
    assert "static inline long long lm_floordiv" in C_HELPERS
    assert "static inline long long lm_mod" in C_HELPERS
