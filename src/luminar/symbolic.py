"""Symbolic integer expressions for tensor dimensions and buffer indices.

A dimension such as a sequence length ``s`` (or ``s + 1``, ``(s + 7) // 8``) and an index
such as ``_d0 * 64 + _d1`` are small expression trees over integer variables with known
inclusive bounds. Every tree is built through the smart constructors at the bottom of this
file, so it is simplified the moment it exists: constants fold, sums become canonical
linear combinations, and floor division / modulo use the variables' ranges to disappear
where they can. Simpler index math is faster generated C.

Semantics are Python's: ``//`` floors toward -inf and ``%`` takes the divisor's sign.
Comparisons and ``&`` / ``|`` / ``~`` are logical and give 0 or 1. ``==`` on expressions is
structural (so expressions can be dict keys); value comparisons are the methods
``lt le gt ge eq ne``.

Internally ranges use ``math.inf`` for "unbounded" so interval arithmetic needs no special
cases; the public ``bounds()`` turns infinities into ``None``.

Speed: compiling a model builds hundreds of thousands of expressions, mostly the same few
thousand again and again (every layer indexes its tensors alike). The smart constructors are
therefore memoized (`_memoized`): an operation on equal operands returns the result built the
first time, which also makes equal expressions mostly the *same* objects, so equality checks
end at the identity test and cached properties (range, text, hash) are computed once.
"""
from __future__ import annotations

import math
import numbers
import operator
from functools import cached_property

import numpy as np

INF = math.inf

# Helper functions for generated C: C's `/` and `%` truncate toward zero, Python's floor.
C_HELPERS = """\
static inline long long lm_mod(long long a, long long b) { long long r = a % b; return (r != 0 && (r < 0) != (b < 0)) ? r + b : r; }
static inline long long lm_floordiv(long long a, long long b) { return (a - lm_mod(a, b)) / b; }
"""

# Printing precedence, lowest binds loosest. Comparisons sit below `&`/`|` so they are always
# parenthesized inside logic, which reads better than Python's own (surprising) precedence.
CMP, OR, AND, SUM, DIV, MUL, ATOM = range(7)


def _wrap(e: Expr, min_prec: int) -> str:
    return f"({e})" if e.prec < min_prec else str(e)


def _to_int(v):
    """A numpy result (a scalar or an array: comparisons give bools, min/max numpy integers) as
    Python int or int64 array."""
    return v.astype(np.int64) if isinstance(v, np.ndarray) else int(v)


class Expr:
    """An immutable, hashable integer expression. Build with sym(), Var() and operators."""

    prec = ATOM
    children: tuple = ()

    def __init__(self, *fields):
        self._fields = fields  # everything that defines the node; equality and hashing use it

    # -- identity: structural equality, so expressions work as dict keys --------------------
    def __eq__(self, other):
        if self is other:
            return True
        if isinstance(other, Expr):  # equal hashes first: unequal trees rarely share one
            return type(self) is type(other) and self._hash == other._hash and self._fields == other._fields
        if isinstance(other, numbers.Integral):
            return self == _const(int(other))
        return False

    def __hash__(self):
        return self._hash

    @cached_property
    def _hash(self):
        return hash((type(self).__name__, self._fields))

    @cached_property
    def _order(self):
        """Total, deterministic sort key: readable text first, then the full structure
        (two Vars may share a name but differ in bounds)."""
        return (str(self), self._structure)

    @cached_property
    def _structure(self) -> str:
        def text(f):
            if isinstance(f, Expr):
                return f._structure
            return "(" + ",".join(map(text, f)) + ")" if isinstance(f, tuple) else repr(f)
        return type(self).__name__ + text(self._fields)

    # -- arithmetic ------------------------------------------------------------------------
    # (straight to the memoized constructors: `self` needs no sym(), and these run a lot)
    def __add__(self, other): return _add(self, sym(other))
    def __radd__(self, other): return _add(sym(other), self)
    def __sub__(self, other): return _add(self, _mul(sym(other), _MINUS_ONE))
    def __rsub__(self, other): return _add(sym(other), _mul(self, _MINUS_ONE))
    def __neg__(self): return _mul(self, _MINUS_ONE)
    def __mul__(self, other): return _mul(self, sym(other))
    def __rmul__(self, other): return _mul(sym(other), self)
    def __floordiv__(self, other): return _floordiv(self, sym(other))
    def __rfloordiv__(self, other): return _floordiv(sym(other), self)
    def __mod__(self, other): return _mod(self, sym(other))
    def __rmod__(self, other): return _mod(sym(other), self)

    # -- logic (0/1 valued) ----------------------------------------------------------------
    def lt(self, other): return _compare("<", self, sym(other))
    def le(self, other): return _compare("<=", self, sym(other))
    def gt(self, other): return _compare("<", sym(other), self)
    def ge(self, other): return _compare("<=", sym(other), self)
    def eq(self, other): return _compare("==", self, sym(other))
    def ne(self, other): return _compare("!=", self, sym(other))
    def __and__(self, other): return _logic(And, self, sym(other))
    def __rand__(self, other): return _logic(And, sym(other), self)
    def __or__(self, other): return _logic(Or, self, sym(other))
    def __ror__(self, other): return _logic(Or, sym(other), self)

    def __invert__(self):
        return self.eq(0)  # Compare overrides this to flip its operator instead

    # -- inspection ------------------------------------------------------------------------
    is_const = False  # True on Const only (a class attribute: read on every simplification step)

    @property
    def value(self) -> int:
        raise ValueError(f"symbolic expression {self} is not a constant")

    def __int__(self):
        return self.value

    def vars(self) -> frozenset[str]:
        return self._vars

    @cached_property
    def _vars(self) -> frozenset[str]:
        return frozenset().union(*(c.vars() for c in self.children))

    @cached_property
    def _range(self) -> tuple:
        """Sound inclusive interval of the values, with ±inf for unbounded ends."""
        raise NotImplementedError

    def bounds(self) -> tuple[int | None, int | None]:
        lo, hi = self._range
        return (None if lo == -INF else int(lo), None if hi == INF else int(hi))

    # -- transformation and evaluation -----------------------------------------------------
    def substitute(self, mapping: dict) -> Expr:
        """Replace variables by name (values are Exprs or ints); the result is re-simplified."""
        names = [name for name in self._vars if name in mapping]  # (cheaper than `& mapping.keys()`)
        if not names:
            return self
        # remembered per expression and the values of the variables it has (see _memoized)
        return _substituted(self, *sorted((name, sym(mapping[name])) for name in names))

    def _rebuild(self, children: list) -> Expr:
        """The same node over new children, through the smart constructor."""
        raise NotImplementedError

    def evaluate(self, env: dict):
        """Value for variables bound in env (ints or numpy int arrays, which broadcast)."""
        raise NotImplementedError

    def render_c(self) -> str:
        """A C expression over `long long` values; see C_HELPERS for the floor helpers."""
        raise NotImplementedError

    def __repr__(self):
        return str(self)


class Const(Expr):
    is_const = True

    def __init__(self, value: int):
        super().__init__(int(value))

    @property
    def value(self):
        return self._fields[0]

    def __hash__(self):
        return hash(self._fields[0])  # Const(3) == 3, so the hashes must agree too

    @cached_property
    def _range(self):
        return (self.value, self.value)

    def evaluate(self, env):
        return self._fields[0]  # (not the property: a decode step evaluates ~130 shape constants)

    def __str__(self):
        return str(self.value)

    def render_c(self):
        return str(self.value) if self.value >= 0 else f"({self.value})"


class Var(Expr):
    """An integer variable with inclusive bounds lo..hi (None: unbounded on that side).
    The bounds are part of its identity."""

    def __init__(self, name: str, lo: int | None = 0, hi: int | None = None):
        if not isinstance(name, str) or not name:
            raise TypeError(f"variable name must be a non-empty string, got {name!r}")
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"variable {name!r} has empty bounds [{lo}, {hi}]")
        super().__init__(name, lo, hi)
        self.name, self.lo, self.hi = name, lo, hi

    @cached_property
    def _vars(self):
        return frozenset([self.name])

    @cached_property
    def _range(self):
        return (-INF if self.lo is None else self.lo, INF if self.hi is None else self.hi)

    def substitute(self, mapping):
        return sym(mapping[self.name]) if self.name in mapping else self

    def evaluate(self, env):
        return env[self.name]  # KeyError(name) when unbound

    def __str__(self):
        return self.name

    def render_c(self):
        # a graph dim (a user's name: never '_'-prefixed, unlike loop variables) is prefixed in C,
        # so no name a user picks (n, l, acc, dims ...) can collide with the generated code's own
        return self.name if self.name.startswith("_") else f"lm_dim_{self.name}"


def _sum_text(items, const: int, times: str) -> str:
    """'x * 2 + y - z + 5' from (text, coefficient) pairs (at least one); shared by str() and render_c()."""
    signed = [(coeff, text if abs(coeff) == 1 else f"{text}{times}{abs(coeff)}") for text, coeff in items]
    if const:
        signed.append((const, str(abs(const))))
    out = "".join((" + " if coeff > 0 else " - ") + magnitude for coeff, magnitude in signed)
    return "-" + out[3:] if out.startswith(" - ") else out[3:]  # the first term without a binary sign


class Sum(Expr):
    """A linear combination: sum of coefficient * term, plus a constant. Terms are never
    Sums or Consts, coefficients never 0, and terms are sorted so the form is canonical."""

    prec = SUM

    def __init__(self, terms: tuple, const: int):
        super().__init__(terms, const)
        self.terms, self.const = terms, const
        self.children = tuple(t for t, _ in terms)

    @cached_property
    def _range(self):
        lo = hi = self.const
        for term, coeff in self.terms:
            t_lo, t_hi = term._range
            lo += coeff * (t_lo if coeff > 0 else t_hi)
            hi += coeff * (t_hi if coeff > 0 else t_lo)
        return (lo, hi)

    def _rebuild(self, children):
        return sum((child * coeff for child, (_, coeff) in zip(children, self.terms)), _const(self.const))

    def evaluate(self, env):
        return sum((coeff * term.evaluate(env) for term, coeff in self.terms), self.const)

    def __str__(self):
        return _sum_text([(_wrap(t, SUM if c in (1, -1) else MUL), c) for t, c in self.terms], self.const, " * ")

    def render_c(self):
        return "(" + _sum_text([(t.render_c(), c) for t, c in self.terms], self.const, "*") + ")"


class Mul(Expr):
    """A product of two or more non-constant factors (constants live in Sum coefficients)."""

    prec = MUL

    def __init__(self, factors: tuple):
        super().__init__(factors)
        self.children = factors

    @cached_property
    def _range(self):
        def times(x, y):  # 0 * inf is 0 here: the 0 is an exact value, the inf only a limit
            return 0 if x == 0 or y == 0 else x * y
        lo = hi = 1
        for f_lo, f_hi in (f._range for f in self.children):
            corners = [times(a, b) for a in (lo, hi) for b in (f_lo, f_hi)]
            lo, hi = min(corners), max(corners)
        return (lo, hi)

    def _rebuild(self, children):
        return math.prod(children, start=_const(1))

    def evaluate(self, env):
        return math.prod(f.evaluate(env) for f in self.children)

    def __str__(self):
        return " * ".join(_wrap(f, ATOM) for f in self.children)

    def render_c(self):
        return "(" + "*".join(f.render_c() for f in self.children) + ")"


class BinOp(Expr):
    """A node with two operands; subclasses say how it bounds and prints, and evaluate by their
    `np_fn` (a function of the two operands' values, ints or numpy arrays) unless they override it."""

    def __init__(self, a: Expr, b: Expr, *extra):
        super().__init__(a, b, *extra)
        self.a, self.b = a, b
        self.children = (a, b)

    def evaluate(self, env):
        return _to_int(self.np_fn(self.a.evaluate(env), self.b.evaluate(env)))


def _fdiv(a, b):
    """floor(a / b) for b >= 1 where one of a, b may be infinite."""
    if b == INF:
        return 0 if a >= 0 else -1
    return a if a in (INF, -INF) else a // b


def _floordiv_range(x: tuple, d: tuple) -> tuple:
    (x_lo, x_hi), (d_lo, d_hi) = x, d
    if d_lo <= 0 <= d_hi:  # |x // d| <= |x| for any nonzero integer d
        m = max(abs(x_lo), abs(x_hi))
        return (-m, m)
    if d_hi < 0:  # x // d == (-x) // (-d)
        x_lo, x_hi, d_lo, d_hi = -x_hi, -x_lo, -d_hi, -d_lo
    # The quotient grows with x; it is largest in magnitude for the smallest divisor.
    return (_fdiv(x_lo, d_lo if x_lo < 0 else d_hi), _fdiv(x_hi, d_hi if x_hi < 0 else d_lo))


class _Division(BinOp):
    """Floor division and modulo: C's truncating / and % where both sides are provably positive."""
    prec = DIV

    def __str__(self):
        return f"{_wrap(self.a, MUL)} {self.symbol} {_wrap(self.b, ATOM)}"

    def render_c(self):
        # C truncates toward zero; that equals flooring when both sides are provably positive.
        if self.a._range[0] >= 0 and self.b._range[0] >= 1:
            return f"({self.a.render_c()} {self.c_op} {self.b.render_c()})"
        return f"{self.helper}({self.a.render_c()}, {self.b.render_c()})"


class FloorDiv(_Division):
    symbol, c_op, helper, np_fn = "//", "/", "lm_floordiv", operator.floordiv

    @cached_property
    def _range(self):
        return _floordiv_range(self.a._range, self.b._range)

    def _rebuild(self, children):
        return _floordiv(*children)


class Mod(_Division):
    symbol, c_op, helper, np_fn = "%", "%", "lm_mod", operator.mod

    @cached_property
    def _range(self):
        (x_lo, x_hi), (d_lo, d_hi) = self.a._range, self.b._range
        if d_lo >= 1:  # result in [0, d-1], and never above x itself when x >= 0
            return (0, min(d_hi - 1, x_hi) if x_lo >= 0 else d_hi - 1)
        return (min(d_lo + 1, 0), max(d_hi - 1, 0))  # the result takes the divisor's sign

    def _rebuild(self, children):
        return _mod(*children)


class Min(BinOp):
    name, c_op, np_fn, pick = "min", "<", np.minimum, min

    @cached_property
    def _range(self):  # min/max are monotonic in both operands: the ends pick from the ends
        return (self.pick(self.a._range[0], self.b._range[0]), self.pick(self.a._range[1], self.b._range[1]))

    def _rebuild(self, children):
        return _minmax(type(self), *children)

    def __str__(self):
        return f"{self.name}({self.a}, {self.b})"

    def render_c(self):
        a, b = self.a.render_c(), self.b.render_c()
        return f"(({a}){self.c_op}({b})?({a}):({b}))"


class Max(Min):
    name, c_op, np_fn, pick = "max", ">", np.maximum, max


_COMPARE_FNS = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne}


class Compare(BinOp):
    """a op b for op in < <= == != (gt/ge are stored as swapped lt/le); value 0 or 1."""

    prec = CMP

    def __init__(self, op: str, a: Expr, b: Expr):
        super().__init__(a, b, op)
        self.op, self.np_fn = op, _COMPARE_FNS[op]

    _range = (0, 1)  # a plain value: a decided comparison would have been folded to a constant

    def _rebuild(self, children):
        return _compare(self.op, *children)

    def __invert__(self):
        negated = {"<": ("<=", True), "<=": ("<", True), "==": ("!=", False), "!=": ("==", False)}
        op, swap = negated[self.op]
        return _compare(op, self.b, self.a) if swap else _compare(op, self.a, self.b)

    def _parts(self, text):
        # Print `1 <= x` as `x >= 1`: the variable first reads like the intent.
        if self.op in ("<", "<=") and self.a.is_const and not self.b.is_const:
            return text(self.b), self.op.replace("<", ">"), text(self.a)
        return text(self.a), self.op, text(self.b)

    def __str__(self):
        return " ".join(self._parts(lambda e: _wrap(e, SUM)))

    def render_c(self):
        return "(" + "".join(self._parts(lambda e: e.render_c())) + ")"


class And(BinOp):
    """Logical and: 1 when both operands are nonzero, else 0."""

    prec, symbol, c_op, np_fn = AND, "&", "&&", operator.and_
    _range = (0, 1)

    def _rebuild(self, children):
        return _logic(type(self), *children)

    def evaluate(self, env):
        return _to_int(self.np_fn(self.a.evaluate(env) != 0, self.b.evaluate(env) != 0))

    def __str__(self):
        return f"{_wrap(self.a, self.prec)} {self.symbol} {_wrap(self.b, self.prec)}"

    def render_c(self):
        return f"({self.a.render_c()} {self.c_op} {self.b.render_c()})"


class Or(And):
    """Logical or: 1 when either operand is nonzero, else 0."""

    prec, symbol, c_op, np_fn = OR, "|", "||", operator.or_


# ---------------------------------------------------------------------------------------------
# Smart constructors: the only way composite nodes are made, so every Expr is simplified.
# ---------------------------------------------------------------------------------------------

def sym(x) -> Expr:
    """int (or bool, or numpy integer) -> constant, str -> Var(name), Expr -> itself."""
    if isinstance(x, Expr):
        return x
    if type(x) is int:  # the common case, without the slow abstract-class check below
        c = _CONSTS.get(x)
        return c if c is not None else _const(x)
    if isinstance(x, numbers.Integral):
        return _const(int(x))
    if isinstance(x, str):
        return Var(x)
    raise TypeError(f"cannot make a symbolic integer expression from {type(x).__name__} {x!r}")


_MEMO: dict = {}  # (constructor, operands) -> result, see _memoized
MEMO_LIMIT = 1 << 17  # entries kept before the table starts over (bounds memory, not results)
_CONSTS: dict[int, Const] = {}  # one shared Const per small value


def _const(value: int) -> Const:
    """Const(value), shared: the same few constants are made constantly."""
    c = _CONSTS.get(value)
    if c is None:
        if len(_CONSTS) >= 4096:
            _CONSTS.clear()
        c = _CONSTS[value] = Const(value)
    return c


_MINUS_ONE = _const(-1)


def _memoized(build):
    """`build`, remembering its result for each tuple of operands (Exprs, op names, node
    classes). Expressions are immutable and `build` depends only on their structure, so equal
    operands may share one result; the table is emptied when it reaches MEMO_LIMIT entries."""
    def cached(*args):
        key = (build, *args)
        result = _MEMO.get(key)
        if result is None:
            result = build(*args)
            if len(_MEMO) >= MEMO_LIMIT:
                _MEMO.clear()
            _MEMO[key] = result
        return result
    cached.__name__, cached.__doc__, cached.__wrapped__ = build.__name__, build.__doc__, build
    return cached


@_memoized
def _substituted(e: Expr, *values: tuple) -> Expr:
    """Expr.substitute of `e` for the (name, value) pairs of the variables it has, sorted by name."""
    mapping = dict(values)
    return e._rebuild([c.substitute(mapping) for c in e.children])


def _linear(e: Expr) -> tuple[dict, int]:
    """e as ({term: coefficient}, constant)."""
    kind = type(e)
    if kind is Const:
        return {}, e.value
    if kind is Sum:
        return dict(e.terms), e.const
    return {e: 1}, 0


def _merge(terms: dict, other: dict, scale: int = 1) -> None:
    for term, coeff in other.items():
        terms[term] = terms.get(term, 0) + coeff * scale


def _recombine(terms: dict) -> int:
    """Rewrite (x // n) * (c*n) + (x % n) * c into x * c, in place; returns the constant
    this adds. Reshapes produce exactly this pattern when they split and re-merge an index."""
    for term, coeff in list(terms.items()):
        if type(term) is Mod and term.b.is_const:
            quotient = _floordiv(term.a, term.b)
            if terms.get(quotient) == coeff * term.b.value:
                del terms[term], terms[quotient]
                x_terms, x_const = _linear(term.a)
                _merge(terms, x_terms, coeff)
                return x_const * coeff + _recombine(terms)  # the merged terms may recombine further
    return 0


def _make_sum(terms: dict, const: int) -> Expr:
    terms = {t: c for t, c in terms.items() if c != 0}
    if any(type(t) is Mod for t in terms):  # only a Mod term can recombine
        const += _recombine(terms)
        terms = {t: c for t, c in terms.items() if c != 0}
    if not terms:
        return _const(const)
    if len(terms) == 1 and const == 0:
        ((term, coeff),) = terms.items()
        if coeff == 1:
            return term
    return Sum(tuple(sorted(terms.items(), key=lambda term_and_coeff: term_and_coeff[0]._order)), const)


@_memoized
def _add(a: Expr, b: Expr) -> Expr:
    if a.is_const and b.is_const:
        return _const(a.value + b.value)
    (a_terms, a_const), (b_terms, b_const) = _linear(a), _linear(b)
    _merge(a_terms, b_terms)
    return _make_sum(a_terms, a_const + b_const)


def _coefficient(e: Expr) -> tuple[int, Expr]:
    """Split c * x into (c, x)."""
    if type(e) is Sum and len(e.terms) == 1 and e.const == 0:
        return e.terms[0][1], e.terms[0][0]
    return 1, e


def _factors(e: Expr) -> list:
    return list(e.children) if type(e) is Mul else [e]


@_memoized
def _mul(a: Expr, b: Expr) -> Expr:
    if b.is_const:
        a, b = b, a
    if a.is_const:  # a constant distributes over a linear combination
        if a.value == 1:
            return b  # every expression is already in the form _make_sum would give
        terms, const = _linear(b)
        return _make_sum({t: c * a.value for t, c in terms.items()}, const * a.value)
    (a_coeff, a_rest), (b_coeff, b_rest) = _coefficient(a), _coefficient(b)
    product = Mul(tuple(sorted(_factors(a_rest) + _factors(b_rest), key=lambda f: f._order)))
    return _make_sum({product: a_coeff * b_coeff}, 0)


def _common_factor(e: Sum, n: int) -> int:
    return math.gcd(n, e.const, *(c for _, c in e.terms))


def _scaled_down(e: Sum, g: int) -> Expr:
    return _make_sum({t: c // g for t, c in e.terms}, e.const // g)


def _exact_quotient(a: Expr, b: Expr) -> Expr | None:
    """a / b when every term of `a` is a multiple of the monomial `b` (e.g. (8*s*t) / (4*s) = 2*t),
    so flattening a symbolic shape divides exactly; None when that is not evident."""
    b_coeff, b_rest = _coefficient(b)
    if type(b_rest) is Sum:
        return None
    terms, const = _linear(a)
    if const or not terms:
        return None
    quotient = _const(0)
    for term, coeff in terms.items():
        rest = _factors(term)
        for f in _factors(b_rest):
            if f not in rest:
                return None
            rest.remove(f)
        if coeff % b_coeff:
            return None
        quotient = quotient + math.prod(rest, start=_const(coeff // b_coeff))
    return quotient


@_memoized
def _floordiv(a: Expr, b: Expr) -> Expr:
    if b == 0:
        raise ZeroDivisionError(f"symbolic floor division by zero: {a} // 0")
    low, high = _floordiv_range(a._range, b._range)
    if low == high:  # the range pins the quotient (covers constants and x < n)
        return _const(low)
    if b in (1, -1):
        return a * b
    if not (b.is_const and b.value > 0):
        exact = _exact_quotient(a, b)
        return FloorDiv(a, b) if exact is None else exact
    n = b.value
    if isinstance(a, FloorDiv) and a.b.is_const and a.b.value > 0:  # (x // m) // n
        return a.a // (a.b.value * n)
    if isinstance(a, Sum):
        g = _common_factor(a, n)
        if g > 1:  # (g*y) // (g*m) == y // m
            return _scaled_down(a, g) // (n // g)
        # Terms that are multiples of n leave the division exactly: (x*n + y) // n = x + y // n.
        whole = {t: c // n for t, c in a.terms if c % n == 0}
        rest = {t: c for t, c in a.terms if c % n != 0}
        quotient, remainder = divmod(a.const, n)
        if whole or quotient:
            return _make_sum(whole, quotient) + _make_sum(rest, remainder) // n
        split = _small_remainder(a, n)
        if split is not None:  # (g*X + R) // (g*k) == X // k
            g, x, _ = split
            return x // (n // g)
    return FloorDiv(a, b)


@_memoized
def _mod(a: Expr, b: Expr) -> Expr:
    if b == 0:
        raise ZeroDivisionError(f"symbolic modulo by zero: {a} % 0")
    low, high = _floordiv_range(a._range, b._range)
    if low == high:  # x % d == x - (x // d) * d, and the quotient is known
        return a + b * -low
    if b in (1, -1):
        return _const(0)
    if not (b.is_const and b.value > 0):
        return Mod(a, b) if _exact_quotient(a, b) is None else _const(0)
    n = b.value
    if isinstance(a, Mod) and a.b.is_const and a.b.value > 0 and a.b.value % n == 0:  # (x % kn) % n
        return a.a % n
    if isinstance(a, Sum):
        g = _common_factor(a, n)
        if g > 1:  # (g*y) % (g*m) == g * (y % m)
            return (_scaled_down(a, g) % (n // g)) * g
        kept = {t: c for t, c in a.terms if c % n != 0}  # multiples of n vanish modulo n
        if len(kept) < len(a.terms) or not 0 <= a.const < n:
            return _make_sum(kept, a.const % n) % n
        split = _small_remainder(a, n)
        if split is not None:  # (g*X + R) % (g*k) == g * (X % k) + R
            g, x, r = split
            return (x % (n // g)) * g + r
    return Mod(a, b)


def _small_remainder(a: Sum, n: int):
    """(g, X, R) with a == g*X + R, g a divisor of n (g > 1) and 0 <= R < g by R's range: the
    flat index of a merged view divided back into its digits, e.g. (r*2624 + d*41 + e) // 335872
    is r // 128 when d*41 + e < 2624. Tries the largest-coefficient terms as X first."""
    terms = sorted(a.terms, key=lambda tc: -abs(tc[1]))
    for cut in range(1, len(terms)):
        g = math.gcd(n, *(c for _, c in terms[:cut]))
        if g <= 1:
            break
        rest = _make_sum(dict(terms[cut:]), a.const)
        low, high = rest._range
        if 0 <= low and high < g:
            return g, _make_sum({t: c // g for t, c in terms[:cut]}, 0), rest
    return None


def _canonical_pair(a: Expr, b: Expr) -> list[Expr]:
    """One fixed order for the operands of a commutative node (constants last: `min(a, 3)`)."""
    return sorted((a, b), key=lambda e: (e.is_const, e._order))


@_memoized
def _minmax(cls: type, a: Expr, b: Expr) -> Expr:
    if a == b:
        return a
    if a._range[1] <= b._range[0]:  # a <= b for every assignment
        return a if cls is Min else b
    if b._range[1] <= a._range[0]:
        return b if cls is Min else a
    return cls(*_canonical_pair(a, b))


def smin(a, b) -> Expr:
    return _minmax(Min, sym(a), sym(b))


def smax(a, b) -> Expr:
    return _minmax(Max, sym(a), sym(b))


@_memoized
def _compare(op: str, a: Expr, b: Expr) -> Expr:
    # Bound the difference rather than each side: common terms cancel, e.g. i < i + 1.
    lo, hi = (a - b)._range
    always, never = {
        "<": (hi < 0, lo >= 0),
        "<=": (hi <= 0, lo > 0),
        "==": (lo == hi == 0, lo > 0 or hi < 0),
        "!=": (lo > 0 or hi < 0, lo == hi == 0),
    }[op]
    if always or never:
        return _const(int(always))
    if op in ("==", "!="):
        a, b = _canonical_pair(a, b)
    return Compare(op, a, b)


def _as_bool(e: Expr) -> Expr:
    lo, hi = e._range
    return e if lo >= 0 and hi <= 1 else e.ne(0)


@_memoized
def _logic(cls: type, a: Expr, b: Expr) -> Expr:
    absorbing = 0 if cls is And else 1  # x & 0 = 0, x | 1 = 1
    for x, y in ((a, b), (b, a)):
        truth = x.ne(0)  # the constant 1 or 0 where x's range decides it
        if truth == absorbing:
            return _const(absorbing)
        if truth.is_const:  # the neutral element: x & 1 = x, x | 0 = x (as 0/1)
            return _as_bool(y)
    if a == b:
        return _as_bool(a)
    return cls(*_canonical_pair(a, b))
