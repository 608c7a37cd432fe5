"""Block dots in float32: io/quant.block_linear (x @ w.T a block at a time, each block's dot with
its integers scaled once) and the CPU renderer's float block dots, which a one-token decode step
of a model with Q4_0 / Q4_1 weights runs while its prompts keep the dequantizing matmul.

References: numpy in float64 on the `gguf` package's quantization dequantized by luminar's numpy
dequantizer (bit-exact with gguf's, test_quant.py), and the reference interpreter.
"""
import re

import numpy as np
import pytest

from luminar.backends import BACKENDS
from luminar.errors import ShapeError, UnsupportedError
from luminar.graph import Graph
from luminar.io import quant

from test_int8 import compiled_linear, quantized, small_model

pytestmark = pytest.mark.skipif("cpu" not in BACKENDS, reason="needs the cpu backend (a C compiler)")

WEIGHTS = np.random.default_rng(4).standard_normal((40, 288)).astype(np.float32) * 0.1  # 9 blocks a row
X = np.random.default_rng(5).standard_normal((2, 288)).astype(np.float32)
# the scaled lanes of one block added into the row's vector: `vec[lane] += scale[block] * (...)`
SCALED_LANES = re.compile(r"vec\d+\[\w+\] \+= scale\d+\[\w+\] \* \(")


def compiled_block_linear(x: np.ndarray, qtype: str, parts: dict, shape: tuple, backend: str = "cpu"):
    return compiled_linear(x, qtype, parts, shape, backend, linear=quant.block_linear)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1"])
def test_block_linear_is_the_float_product_with_the_dequantized_weight(qtype):
    parts = quantized(WEIGHTS, qtype)
    exact = X.astype(np.float64) @ quant.dequantize_parts(qtype, parts, WEIGHTS.shape).astype(np.float64).T
    program, ours = compiled_block_linear(X, qtype, parts, WEIGHTS.shape)
    _, reference = compiled_block_linear(X, qtype, parts, WEIGHTS.shape, backend="reference")
    # float32 rounding only (a product in another order), not int8 activations' 1e-2
    assert np.abs(ours - exact).max() <= 1e-5 * np.abs(exact).max()
    assert np.abs(reference - exact).max() <= 1e-5 * np.abs(exact).max()
    # each block's lanes scaled once, not each weight dequantized: no float16 scale read per lane
    assert SCALED_LANES.search(program.source)


def test_blocks_of_16_of_a_repacked_q6_k_weight():
    """Q6_K repacks into Q8_0 blocks of 16 (one per sub-block scale): the block dot runs over 16."""
    rng = np.random.default_rng(2)
    parts = {"scale": rng.random((40, 18)).astype(np.float16) * np.float16(0.01),
             "quants": rng.integers(-32, 32, (40, 18, 16)).astype(np.int8)}  # as _q6k_as_q8 repacks
    weight = parts["quants"].astype(np.float64) * parts["scale"].astype(np.float64)[..., None]
    exact = X.astype(np.float64) @ weight.reshape(40, 288).T
    program, ours = compiled_block_linear(X, "Q8_0", parts, (40, 288))
    assert np.abs(ours - exact).max() <= 1e-5 * np.abs(exact).max()
    assert SCALED_LANES.search(program.source)


def test_block_linear_refuses_other_formats_and_inner_sizes():
    g = Graph()
    parts = {"scale": g.tensor("s", (8, 2), "float16"), "min": g.tensor("m", (8, 2), "float16"),
             "high": g.tensor("h", (8, 2, 4), "uint8"), "quants": g.tensor("q", (8, 2, 16), "uint8")}
    with pytest.raises(UnsupportedError, match="block_linear: weight format Q5_1"):
        quant.block_linear(g.tensor("x", (1, 64)), quant.QuantizedWeight("Q5_1", parts, (8, 64)))
    with pytest.raises(ShapeError, match=r"block_linear: input \(1, 48\).*multiple of 32"):
        quant.block_linear(g.tensor("x48", (1, 48)), quant.QuantizedWeight("Q4_1", parts, (8, 48)))


def test_decode_steps_run_block_dots_and_prompts_the_dequantizing_program():
    """A float model with Q4_1 weights compiles two programs: one-token steps multiply by block dots,
    prompts (more than one token) dequantize into tiled matmuls. Both compute x @ w.T in float32:
    the steps' logits stay within float rounding of the reference interpreter's on the same graph
    and of a model that runs every step through the prompt program."""
    model, reference = small_model("float"), small_model("float", backend="reference")
    assert model.prefill_program is not None
    assert SCALED_LANES.search(model.program.source) and not SCALED_LANES.search(model.prefill_program.source)
    prompt, steps = [3, 17, 42, 5], [88, 61, 9, 30, 12, 70]
    caches = [model.new_cache(), reference.new_cache(), model.new_cache()]
    first = [model.forward(prompt, caches[0]), reference.forward(prompt, caches[1])]
    model.forward(prompt, caches[2])
    assert np.abs(first[0] - first[1]).max() <= 1e-5 * np.abs(first[1]).max()
    for token in steps:
        got, want = model.forward([token], caches[0]), reference.forward([token], caches[1])
        program, model.program = model.program, model.prefill_program  # the same step, dequantizing
        dense = model.forward([token], caches[2])
        model.program = program
        scale = np.abs(dense).max()
        assert np.abs(got - want).max() <= 1e-5 * scale and np.abs(got - dense).max() <= 1e-5 * scale
        assert got.argmax() == dense.argmax()


def test_float_weights_compile_one_program():
    """Without block-quantized 4-bit weights the decode graph is the plain one: no second program."""
    assert small_model("float", formats=("F32", "Q8_0")).prefill_program is None


def test_every_4_bit_layer_of_a_step_is_a_block_dot_the_output_projection_too():
    """The step graph computes attention rows first ((s, heads * d) a view, _attention's
    rows_first), so the output projection's x has affine blocks and it is a block dot like the
    others; the prompt graph keeps the layout its fused attention prefers. (Heads of 64: the
    output projection's 256 inputs are 8 blocks, a loop; 2 or 4 would be unrolled.)"""
    from luminar.backends.cpu.render import render_kernel
    from luminar.compiler.kernels import loads
    model = small_model("float", head_dim=64)

    def rendered(program, weight: str) -> str:
        kp = program.kernels
        (kernel,) = [k for k in kp.kernels if any(kp.buffers[ld.buffer].name == f"blk_0_{weight}_weight_quants"
                                                   for ld in loads(k.value))]
        return render_kernel(kp, kernel)
    for weight in ("attn_q_attn_k_attn_v", "attn_output", "ffn_gate_ffn_up", "ffn_down"):
        assert SCALED_LANES.search(rendered(model.program, weight)), weight
        assert not SCALED_LANES.search(rendered(model.prefill_program, weight)), weight
