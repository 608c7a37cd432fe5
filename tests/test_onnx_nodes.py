"""The ONNX backend node suite (onnx 1.22.0's test data) on luminar.

Every case runs on the reference backend (numpy, one primitive at a time: fast to build, the
oracle); a fixed sample of the passing ones also runs on the cpu backend (generated C). The
number of passing cases must not fall below tests/onnx_node_floor.txt, so a regression fails
here; `python bench/onnx_nodes.py` regenerates the per-case table bench/ONNX_NODES.md (with
onnxruntime's results on the same cases) and prints the count to record as the new floor.
"""
from pathlib import Path

import pytest

from luminar.onnx import node_suite

FLOOR_FILE = Path(__file__).with_name("onnx_node_floor.txt")
CPU_SAMPLE = 30  # passing cases re-run on cpu (each compiles C; ~0.3-1 s apiece)


@pytest.fixture(scope="module")
def reference_results():
    cases = node_suite.cases()
    return cases, [node_suite.run_luminar(case, "reference") for case in cases]


def test_node_suite_pass_count_does_not_regress(reference_results):
    cases, results = reference_results
    passed = [r for r in results if r.status == "pass"]
    floor = int(FLOOR_FILE.read_text().split()[0])
    print(f"\nONNX node suite on luminar (reference): {len(passed)} / {len(cases)} cases pass "
          f"({100 * len(passed) / len(cases):.1f}%), floor {floor}")
    crashes = [f"{r.name}: {r.reason}" for r in results if r.reason.startswith("crash")]
    assert not crashes, "cases that crashed (luminar raised a non-luminar exception):\n" + "\n".join(crashes)
    assert len(passed) >= floor, f"{len(passed)} cases pass, fewer than the recorded floor {floor}"


def test_sampled_passing_cases_also_pass_on_cpu(reference_results):
    cases, results = reference_results
    by_name = {c.name: c for c in cases}
    passing = sorted(r.name for r in results if r.status == "pass" and not r.folded)
    step = max(len(passing) // CPU_SAMPLE, 1)
    sample = passing[::step][:CPU_SAMPLE]
    failures = []
    for name in sample:
        result = node_suite.run_luminar(by_name[name], "cpu")
        if result.status != "pass":
            failures.append(f"{name}: {result.status} {result.reason}")
    assert not failures, "passing on reference but not on cpu:\n" + "\n".join(failures)
