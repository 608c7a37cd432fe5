"""bench/llama_cpp.py's llama-bench runner, against a stand-in binary: when llama.cpp's default
(weights repacked for the CPU's extra buffer types) crashes, each part is measured alone, in the
default where that runs, else with --repack 0, and the result says which."""
import importlib.util
import json
import stat
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("llama_cpp_peer", Path(__file__).parent.parent / "bench" / "llama_cpp.py")
llama_cpp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(llama_cpp)

# A llama-bench stand-in: JSON rows for -p P (prefill) and -n N (decode), as llama-bench -o json
# prints them; `crash_when` is a shell test on the arguments that makes it die of SIGSEGV.
SCRIPT = """#!/usr/bin/env bash
p=0; n=0; repack=1
while [ $# -gt 0 ]; do case "$1" in -p) p=$2; shift;; -n) n=$2; shift;; --repack) repack=$2; shift;; esac; shift; done
if {crash_when}; then kill -SEGV $$; fi
{fail}
rows=()
[ "$p" -gt 0 ] && rows+=("{{\\"n_prompt\\": $p, \\"n_gen\\": 0, \\"avg_ts\\": 100.0, \\"avg_ns\\": $((p * 10000000)), \\"build_commit\\": \\"x\\", \\"n_threads\\": 2}}")
[ "$n" -gt 0 ] && rows+=("{{\\"n_prompt\\": 0, \\"n_gen\\": $n, \\"avg_ts\\": $((50 + 200 * repack)).0, \\"avg_ns\\": 1, \\"build_commit\\": \\"x\\", \\"n_threads\\": 2}}")
(IFS=,; echo "[${{rows[*]}}]")
"""


def fake_llama_bench(tmp_path, crash_when="false", fail=""):
    binary = tmp_path / "llama-bench"
    binary.write_text(SCRIPT.format(crash_when=crash_when, fail=fail))
    binary.chmod(binary.stat().st_mode | stat.S_IEXEC)
    return binary


def test_a_run_that_works_uses_llama_cpps_default(tmp_path):
    out = llama_cpp.run_llama_bench(fake_llama_bench(tmp_path), "m.gguf", 512, 128, 2)
    assert out["repack"] == {"prefill": True, "decode": True} and out["crash"] == ""
    assert out["prefill_s"] == pytest.approx(5.12) and out["decode_tok_s"] == 250.0


def test_a_prefill_that_crashes_in_the_default_is_measured_with_repack_off_and_decode_keeps_it(tmp_path):
    # what llama.cpp 0.3.36 did on an AMX Xeon: any prompt of more than one token crashed with repacking
    binary = fake_llama_bench(tmp_path, crash_when='[ "$p" -gt 1 ] && [ "$repack" = 1 ]')
    out = llama_cpp.run_llama_bench(binary, "m.gguf", 512, 128, 2)
    assert out["repack"] == {"prefill": False, "decode": True}
    assert "died" in out["crash"] and out["prefill_s"] == pytest.approx(5.12) and out["decode_tok_s"] == 250.0


def test_a_decode_that_crashes_too_falls_back_and_one_crashing_both_ways_is_an_error(tmp_path):
    out = llama_cpp.run_llama_bench(fake_llama_bench(tmp_path, crash_when='[ "$repack" = 1 ]'), "m.gguf", 512, 128, 2)
    assert out["repack"] == {"prefill": False, "decode": False} and out["decode_tok_s"] == 50.0
    with pytest.raises(RuntimeError, match="crashed on m.gguf .prefill. with and without --repack 0"):
        llama_cpp.run_llama_bench(fake_llama_bench(tmp_path, crash_when="true"), "m.gguf", 512, 128, 2)


def test_a_failure_that_is_no_crash_raises_with_its_message(tmp_path):
    binary = fake_llama_bench(tmp_path, fail='echo "error: failed to load model" >&2; exit 1')
    with pytest.raises(RuntimeError, match="failed .1. on m.gguf: error: failed to load model"):
        llama_cpp.run_llama_bench(binary, "m.gguf", 512, 128, 2)
