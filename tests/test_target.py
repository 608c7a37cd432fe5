"""The target seam (compiler/target.py): the compiler knows a backend only through a Target.

These tests use the interface the way a new backend would: a variant of the CPU target with a
smaller schedule space runs a whole search without any change to backends/cpu; the tuning
cache's key follows the target's source; shape buckets give a kernel a schedule per bucket,
chosen at run time by the call's dims.
"""
import ast
import shutil
from pathlib import Path

import numpy as np
import pytest

import luminar as lm
from luminar.backends.cpu import CPU, CPUTarget
from luminar.backends.cpu.schedules import Loops, default_schedule
from luminar.compiler import search
from conftest import rand

pytest.importorskip("egglog")
pytestmark = pytest.mark.skipif(not (shutil.which("gcc") or shutil.which("cc")), reason="needs a C compiler")
COMPILER = Path(lm.__file__).parent / "compiler"


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LUMINAR_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("LUMINAR_SEARCH", raising=False)
    monkeypatch.setattr(search, "TIMED", 3)


def matmul_graph(rows="s"):
    g = lm.Graph()
    (g.tensor("a", (rows, 96)) @ g.tensor("b", (96, 80))).output("c")
    return g


def sources(program) -> set[str]:
    return {c.source for per in program.choices.values() for c in per}


def test_nothing_under_compiler_imports_a_backend():
    for path in COMPILER.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert "backends" not in (node.module or ""), f"{path.name} imports {node.module}"
            elif isinstance(node, ast.Import):
                assert not any("backends" in alias.name for alias in node.names), path.name


class PlainLoopsOnly(CPUTarget):
    """The CPU target without tiles: its rules never split a loop, so every candidate is a plain
    loop nest (threads, vectorization, split reductions)."""
    name = "cpu-plain"

    def rules(self, language):
        relations, (tile, order, annotate) = super().rules(language)
        return relations, [annotate]

    def default_schedule(self, kernel):
        return Loops(parallel=1)


def test_a_target_with_a_smaller_schedule_space_searches_without_editing_the_cpu_backend():
    target = PlainLoopsOnly()
    program = matmul_graph().compile("cpu", search=True, target=target)
    chosen = [c for per in program.choices.values() for c in per]
    assert {c.source for c in chosen} == {"searched"} and all(isinstance(c.schedule, Loops) for c in chosen)
    assert all("tiled" not in desc for c in chosen for desc, *_ in c.candidates)
    a, b = rand(37, 96), rand(96, 80, seed=1)
    np.testing.assert_allclose(program(a=a, b=b)["c"], a @ b, rtol=1e-4, atol=1e-4)
    # its decisions are its own: the cpu target's key differs, so they are not reused there
    assert sources(matmul_graph().compile("cpu", search=True)) == {"searched"}


def test_the_cache_key_covers_the_compiler_and_the_whole_target_package():
    files = {p.name for p in CPU.sources()}
    assert {"render.py", "online.py", "space.py", "schedules.py", "cc.py"} <= files  # online.py was once left out
    first = search.tuning_key(CPU, "kernel", {"s": 1}, 0)
    assert first == search.tuning_key(CPU, "kernel", {"s": 1}, 0) != search.tuning_key(CPU, "kernel", {"s": 2}, 0)


def test_a_change_to_the_targets_source_is_not_served_decisions_made_before_it(tmp_path, monkeypatch):
    copy = tmp_path / "cpu_copy"
    shutil.copytree(Path(CPUTarget.sources(CPU)[0]).parent, copy)

    class Copied(CPUTarget):
        def sources(self):
            return sorted(copy.rglob("*.py"))

    assert sources(matmul_graph().compile("cpu", search=True, target=Copied())) == {"searched"}
    assert sources(matmul_graph().compile("cpu", search=True, target=Copied())) == {"cached"}
    with open(copy / "online.py", "a") as f:  # the flash kernel's renderer changes...
        f.write("\n# a later revision of the online-softmax renderer\n")
    calls = []
    real = search.search_kernel
    monkeypatch.setattr(search, "search_kernel", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert sources(matmul_graph().compile("cpu", search=True, target=Copied())) == {"searched"} and calls


def test_each_shape_bucket_gets_its_own_schedule_and_calls_dispatch_on_their_dims(monkeypatch):
    """The search's timings decide which schedule wins; here the search is replaced by a fixed
    choice per bucket (plain loops for s = 1, the rule-chosen tiles for s = 64) so the test
    checks the mechanism: both compiled, each call running the one for the nearest bucket."""
    def choose(target, program, kernel, env, seed, budget_s):
        schedule = Loops(parallel=0) if env["s"] == 1 else default_schedule(kernel)
        return search.Choice(schedule, "searched")
    monkeypatch.setattr(search, "search_kernel", choose)
    g = lm.Graph()  # big enough at s = 1 to be searched (search.MIN_WORK)
    (g.tensor("a", ("s", 512)) @ g.tensor("b", (512, 160))).output("c")
    program = g.compile("cpu", search=True, search_dims={"s": [64, 1]})
    assert program.search.buckets == ({"s": 1}, {"s": 64})
    (per,) = program.choices.values()
    assert [type(c.schedule).__name__ for c in per] == ["Loops", "Tiled"]
    assert "lm_bucket == 0 ?" in program.source  # the call names its bucket after the dims
    text = program.explain()
    assert "a schedule per shape bucket" in text and "at {'s': 1}: loops parallel=0" in text
    reference = g.compile("reference")
    for s in (1, 2, 7, 8, 64, 200):
        a, b = rand(s, 512, seed=s), rand(512, 160, seed=1)
        np.testing.assert_allclose(program(a=a, b=b)["c"], reference(a=a, b=b)["c"], rtol=1e-4, atol=1e-4)


def test_buckets_a_kernel_does_not_read_share_one_search(monkeypatch):
    g = lm.Graph()
    (g.tensor("x", (64, 64)) @ g.tensor("w", (64, 64))).output("y")  # reads no symbolic dim
    (g.tensor("z", ("s", 8)) * 2).output("u")
    calls = []
    real = search.search_kernel
    monkeypatch.setattr(search, "search_kernel", lambda *a, **k: calls.append(a[3]) or real(*a, **k))
    program = g.compile("cpu", search=True, search_dims={"s": [1, 128]})
    matmul = next(name for name in program.choices if "sum_reduce" in name)
    assert len(calls) == 1 and program.choices[matmul][0] is program.choices[matmul][1]


def test_a_dim_named_like_the_oracles_own_variables_is_searched():
    """The oracle's loop counters are lm_-prefixed: a graph dim called n (a batch) once shadowed one."""
    g = lm.Graph()
    lm.linear(g.tensor("x", ("n", 384)), g.tensor("w", (512, 384)), g.tensor("b", (512,))).output("y")
    program = g.compile("cpu", search=True)
    x, w, b = rand(3, 384), rand(512, 384, seed=1), rand(512, seed=2)
    np.testing.assert_allclose(program(x=x, w=w, b=b)["y"], x @ w.T + b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dim", ["n", "l", "v", "q", "acc", "ii", "tile", "dims"])
def test_dims_named_like_the_generated_codes_locals_compute_right(dim):
    """A graph dim is renamed in C (lm_dim_...), so it cannot shadow a loop counter or buffer of
    the generated code, with the tiled, split-reduction and softmax schedules alike."""
    g = lm.Graph()
    x, w = g.tensor("x", (dim, 200)), g.tensor("w", (200, 48))
    ((x @ w).softmax(-1) + x.sum(-1, keepdim=True)).output("y")
    for rows in (1, 5):
        a, b = rand(rows, 200, seed=rows), rand(200, 48, seed=7)
        got = g.compile("cpu")(x=a, w=b)["y"]
        e = np.exp(a @ b - (a @ b).max(-1, keepdims=True))
        np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True) + a.sum(-1, keepdims=True), rtol=1e-4, atol=1e-4)


def test_interleaved_timing_keeps_every_candidate_for_three_rounds(monkeypatch):
    # A fake clock: candidate 0 is the fastest but a burst of outside load hits its first sample.
    # Dropping after one round would keep that 1 s sample as its median and crown candidate 1.
    from luminar.compiler import target
    clock = {"now": 0.0, "calls": {0: 0, 1: 0, 2: 0}}
    cost = {0: lambda n: 1.0 if n == 0 else 0.1, 1: lambda n: 0.2, 2: lambda n: 5.0}

    def run(k, reps):
        for _ in range(reps):
            clock["now"] += cost[k](clock["calls"][k])
            clock["calls"][k] += 1

    monkeypatch.setattr(target.time, "perf_counter", lambda: clock["now"])
    medians = target.time_interleaved(run, [0, 1, 2], budget_s=0.0, sample_s=1e-9)
    assert min(medians, key=medians.get) == 0 and medians[0] == pytest.approx(0.1)
    assert all(clock["calls"][k] >= 3 for k in (0, 1, 2))  # the slow one too had three samples
    assert clock["calls"][2] == 3  # and then dropped out
