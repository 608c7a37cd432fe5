"""The search-based compiler (compiler/search.py): loop nests rewritten in an e-graph, candidates
validated against the plain schedule's semantics, timed, cached.

The search's answer depends on timings, so tests check what must hold whatever the timings:
every candidate the rules produce computes the same values, a broken candidate is caught and
can never win, the candidate set is a function of the seed, the tuning cache is used, and a
searched program computes what the reference interpreter computes.
"""
import functools
import shutil

import numpy as np
import pytest

import luminar as lm
from luminar.backends.cpu import CPU, CPUTarget
from luminar.backends.cpu import bench as cpu_bench
from luminar.backends.cpu.schedules import Loops, Tiled, default_schedule
from luminar.compiler.analysis import value_at, work
from luminar.compiler import search
from luminar.compiler.kernels import lower
from luminar.compiler.passes import optimize
from luminar.io import quant
from conftest import Q4Tensor, rand

pytest.importorskip("egglog")
pytestmark = pytest.mark.skipif(not (shutil.which("gcc") or shutil.which("cc")), reason="needs a C compiler")


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    """Every test starts with an empty shared-object and tuning cache, and few candidates."""
    monkeypatch.setenv("LUMINAR_CACHE", str(tmp_path))
    monkeypatch.delenv("LUMINAR_SEARCH", raising=False)
    monkeypatch.setattr(search, "TIMED", 4)
    return tmp_path


def q4_linear_graph(rows=40, cols=64):
    """A Q4_1 linear layer as the Llama model builds it: x (s, cols) @ dequantized W (rows, cols).T."""
    g = lm.Graph()
    w, feeds = quant.weight(g, "w", Q4Tensor(rows, cols))
    lm.linear(g.tensor("x", ("s", cols)), w).output("y")
    return g, feeds


def _graph(build):
    g = lm.Graph()
    build(g)
    return g


# Kernels of every shape the rules care about: tiled products (odd sizes, batch dims, an
# epilogue, a transposed or dequantized weight), reductions, elementwise, several reductions.
GRAPHS = {
    "matmul": lambda: _graph(lambda g: (g.tensor("a", (37, 45)) @ g.tensor("b", (45, 50))).output("c")),
    "batched matmul + epilogue": lambda: _graph(
        lambda g: ((g.tensor("a", (3, 19, 20)) @ g.tensor("b", (20, 33))).relu() * 2).output("c")),
    "x @ W.T": lambda: _graph(lambda g: lm.linear(g.tensor("x", ("s", 64)), g.tensor("w", (40, 64))).output("y")),
    "q4_1 linear": lambda: q4_linear_graph()[0],
    "scaled x @ W.T": lambda: _graph(lambda g: lm.linear(g.tensor("x", ("s", 64)) * g.tensor("g", (64,)),
                                                         g.tensor("w", (70, 64))).output("y")),
    "row max": lambda: _graph(lambda g: g.tensor("x", (70, 300)).amax(-1).output("m")),
    "elementwise": lambda: _graph(lambda g: (g.tensor("a", (50, 70)) * g.tensor("b", (70,))).exp().output("y")),
    "softmax": lambda: _graph(lambda g: g.tensor("x", (30, 100)).softmax(-1).output("y")),
}
ENV = {"s": 21}


@functools.cache
def candidates(name):
    """(program, kernel, schedules, nests): the default plus the candidates sampled for the graph's
    largest kernel (seed 0), what the search would time, and the nest each came from."""
    program = lower(optimize(GRAPHS[name]()))
    kernel = max(program.kernels, key=lambda k: value_at(work(k), ENV))
    sp, default = CPU.space(kernel, ENV), default_schedule(kernel)
    nests = search.sample(search.saturate(CPU, sp), 60, 0, CPU.viable(kernel, sp),
                          lambda nest: CPU.to_schedule(nest, kernel, sp) is not None)
    found = {}  # schedule -> the first nest that gave it
    for nest in nests:
        found.setdefault(CPU.to_schedule(nest, kernel, sp), nest)
    schedules = [default] + [s for s in found if s != default][:14]
    return program, kernel, schedules, found


@pytest.mark.parametrize("name", GRAPHS)
def test_every_candidate_computes_what_the_plain_schedule_computes(name):
    """Rules preserve semantics: every sampled nest, rendered, matches the oracle everywhere."""
    program, kernel, schedules, _ = candidates(name)
    assert len(schedules) > 1, "the rules found no alternative"
    bench = CPU.bench(program, kernel, schedules, ENV, seed=1)
    verdicts = bench.validate()
    assert all(verdicts), [s.describe() for s, ok in zip(schedules, verdicts) if not ok]


def test_every_rule_is_exercised_by_the_validated_candidates():
    applied = set()
    for name in GRAPHS:
        program, kernel, schedules, nests = candidates(name)
        naive = CPU.space(kernel, ENV).naive
        for schedule in schedules[1:]:
            applied |= {" ".join(step.split()[:2]) for step in search.rewrites(naive, nests[schedule])}
    verbs = {step.split()[0] for step in applied}
    lanes = any(isinstance(s, Loops) and s.lanes > 1 for name in GRAPHS for s in candidates(name)[2])  # a split reduction
    assert {"split", "interchange", "sink", "vectorize", "unroll", "parallelize"} <= verbs and lanes
    assert {"pack panels", "pack rows:"} <= applied


def test_a_failing_candidate_is_counted_and_never_wins(monkeypatch):
    """A deliberately broken candidate (it adds 1 to the first output) is rejected by validation."""
    real = cpu_bench.render_kernel
    broken = []

    def render(program, kernel, schedule):
        source = real(program, kernel, schedule)
        if schedule != default_schedule(kernel) and not broken:
            broken.append(schedule)
        if broken and schedule == broken[0]:
            return source[:source.rindex("}")] + f"    b{kernel.out}[0] += 1.0f;\n}}"
        return source
    monkeypatch.setattr(cpu_bench, "render_kernel", render)
    program, kernel, *_ = candidates("matmul")
    choice = search.search_kernel(CPU, program, kernel, {}, seed=0, budget_s=0.05)
    assert choice.failures == 1
    assert choice.schedule != broken[0]
    failed = [c for c in choice.candidates if c[1] is None]
    assert [c[0] for c in failed] == [broken[0].describe()]


def test_same_seed_gives_the_same_candidates():
    program, kernel, *_ = candidates("batched matmul + epilogue")
    sp = CPU.space(kernel, ENV)
    draw = lambda seed: search.sample(search.saturate(CPU, sp), 40, seed, CPU.viable(kernel, sp),  # noqa: E731
                                      lambda nest: True)
    assert draw(3) == draw(3)
    assert draw(3) != draw(4)


def test_searched_program_matches_the_reference_for_any_dim():
    """The bucket (s=64) is only where timing happens; other sizes, below the tiled rows, agree too."""
    g, feeds = q4_linear_graph()
    searched = g.compile("cpu", search=5, search_dims={"s": 64})
    reference = g.compile("reference")
    for s in (1, 3, 4, 77):
        x = rand(s, 64, seed=s)
        np.testing.assert_allclose(searched(x=x, **feeds)["y"], reference(x=x, **feeds)["y"], rtol=1e-4, atol=1e-4)


def sources(program) -> set[str]:
    """Where the program's schedules came from, over every kernel and shape bucket."""
    return {c.source for per in program.choices.values() for c in per}


def _matmul_graph(n=96):
    g = lm.Graph()
    (g.tensor("a", (n, n)) @ g.tensor("b", (n, n))).output("c")
    return g


def test_second_compile_uses_the_tuning_cache(monkeypatch):
    first = _matmul_graph().compile("cpu", search=True)
    assert sources(first) == {"searched"}
    monkeypatch.setattr(search, "search_kernel", lambda *a, **k: pytest.fail("searched again"))
    second = _matmul_graph().compile("cpu", search=True)
    assert sources(second) == {"cached"}
    assert second.source == first.source
    a, b = rand(96, 96), rand(96, 96, seed=1)
    np.testing.assert_allclose(second(a=a, b=b)["c"], a @ b, rtol=1e-4, atol=1e-4)


def test_tuning_entries_are_written_whole_and_a_corrupt_one_is_searched_again(fresh_cache):
    _matmul_graph().compile("cpu", search=True)
    (entry,) = (fresh_cache / "tuning").iterdir()  # no temporary files left behind
    assert entry.suffix == ".json"
    entry.write_text("{not json")
    again = _matmul_graph().compile("cpu", search=True)
    assert sources(again) == {"searched"}


def test_repeated_layers_are_searched_once(monkeypatch):
    g = lm.Graph()
    h = g.tensor("x", (64, 64))
    for layer in range(3):
        h = (h @ g.tensor(f"w{layer}", (64, 64))).relu()
    h.output("y")
    calls = []
    real = search.search_kernel
    monkeypatch.setattr(search, "search_kernel", lambda *a, **k: calls.append(a[2].name) or real(*a, **k))
    program = g.compile("cpu", search=True)
    searched = {name for name, (c,) in program.choices.items() if c.source == "searched"}
    assert len(calls) == 1 and len(searched) == 3  # one search, used by the three matmuls


def test_search_off_is_the_rule_chosen_default(monkeypatch):
    monkeypatch.setattr(search, "search_program", lambda *a: pytest.fail("searched"))
    plain = _matmul_graph().compile("cpu")
    assert _matmul_graph().compile("cpu", search=False).source == plain.source
    monkeypatch.setenv("LUMINAR_SEARCH", "0")
    assert _matmul_graph().compile("cpu").source == plain.source
    assert "search off" in plain.explain()


def test_environment_variable_turns_search_on(monkeypatch):
    monkeypatch.setenv("LUMINAR_SEARCH", "4")
    program = _matmul_graph().compile("cpu")
    assert program.search.budget_s == 4 and program.choices


@pytest.mark.parametrize("options, error, message", [
    ({"search": "yes"}, lm.ValueDomainError, "search='yes'"),
    ({"search": -1}, lm.ValueDomainError, "positive number of seconds"),
    ({"search": True, "search_dims": {"q": 4}}, lm.DimensionError, "'q' is not a symbolic dim"),
    ({"search": True, "search_dims": {"s": 0}}, lm.DimensionError, r"search_dims\['s'\] = \[0\]"),
    ({"search": True, "search_dims": {"s": []}}, lm.DimensionError, r"search_dims\['s'\] = \[\]"),
    ({"search": True, "seed": 1.5}, lm.ValueDomainError, "seed=1.5"),
])
def test_bad_search_options_raise_clear_errors(options, error, message):
    g = lm.Graph()
    (g.tensor("x", ("s", 4)) * 2).output("y")
    with pytest.raises(error, match=message):
        g.compile("cpu", **options)


def test_search_options_on_the_reference_backend_are_rejected():
    with pytest.raises(lm.UnsupportedError, match=r"reference backend: unknown options \['search'\]"):
        _matmul_graph().compile("reference", search=True)


def test_candidates_that_fail_to_compile_leave_the_default(monkeypatch):
    monkeypatch.setattr(cpu_bench, "render_kernel", lambda *a: "this is not C")
    program = _matmul_graph().compile("cpu", search=True)
    (choice,) = {id(c): c for per in program.choices.values() for c in per}.values()
    assert choice.source.startswith("error") and choice.schedule == default_schedule(program.kernels.kernels[0])
    a, b = rand(96, 96), rand(96, 96, seed=1)
    np.testing.assert_allclose(program(a=a, b=b)["c"], a @ b, rtol=1e-4, atol=1e-4)


def test_cost_model_ranks_a_register_tile_above_plain_loops():
    program, kernel, *_ = candidates("matmul")
    tiled = Tiled(ti=8, tj=32, order="Jpi", vector=True)
    assert CPU.estimate(program, kernel, tiled, {}) < CPU.estimate(program, kernel, Loops(), {})


def test_bad_environment_value_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("LUMINAR_SEARCH", "fast")
    with pytest.raises(lm.ValueDomainError, match="LUMINAR_SEARCH='fast'"):
        _matmul_graph().compile("cpu")


def test_spent_budget_keeps_the_defaults():
    program = _matmul_graph().compile("cpu", search=1e-9)
    assert sources(program) == {"budget"}
    a, b = rand(96, 96), rand(96, 96, seed=1)
    np.testing.assert_allclose(program(a=a, b=b)["c"], a @ b, rtol=1e-4, atol=1e-4)


def test_explain_shows_candidates_times_and_rewrites(monkeypatch):
    text = _matmul_graph().compile("cpu", search=True).explain()
    assert "candidates timed" in text and "<- chosen" in text and " ms " in text and "naive:" in text
    # which candidate wins is the timings' call: make the first sampled one win to see its rewrites
    monkeypatch.setattr(search, "NOISE", -1e9)
    text = lm.Graph.compile(_matmul_graph(), "cpu", search=True, seed=1).explain()
    assert "split" in text and "parallelize" in text


def test_long_searches_report_progress(monkeypatch, capsys):
    monkeypatch.setattr(search, "PROGRESS_AFTER_S", 0.0)
    _matmul_graph().compile("cpu", search=True)
    err = capsys.readouterr().err
    assert "[luminar] search: k0_sum_reduce at fixed dims: " in err


def test_fingerprint_ignores_buffer_numbers_and_offsets_but_not_shapes():
    g = lm.Graph()
    cache = g.tensor("cache", (4, 16, 8))
    for layer in range(2):  # the same kernel reading a different slice of a stacked input
        (cache[layer] @ g.tensor(f"w{layer}", (8, 8))).output(f"y{layer}")
    (cache[0, :, :4] @ g.tensor("w2", (4, 8))).output("y2")
    program = lower(optimize(g))
    prints = [search.fingerprint(program, k) for k in program.kernels]
    assert prints[0] == prints[1] != prints[2]


def test_invalid_tile_orders_are_rejected():
    with pytest.raises(ValueError, match="invalid tile order 'iJp'"):
        Tiled(order="iJp")  # a threaded loop inside a serial one
    with pytest.raises(ValueError, match="invalid tile order 'Jpij'"):
        Tiled(order="Jpij")
    assert not Tiled(order="Ipj").packs_in_order(True)  # panels packed before their column block
    assert Tiled(order="Ipj").packs_in_order(False) and Tiled(order="Jpi").packs_in_order(True)


def test_schedules_describe_themselves():
    assert Loops(parallel=2, lanes=16).describe() == "loops parallel=2 lanes=16"
    assert Tiled(ti=4, tj=64, order="Jpi", vector=True).describe() == "tiled 4x64 mc=64 order=Jpi vector"
