"""int8 activations: io/quant.int8_linear (x quantized per block of 32 as llama.cpp's Q8_1, integer
dots against Q8_0 / Q4_0 / Q4_1 weights), the lowering's int8 storage of quantized activations
and the CPU renderer's integer block dots (lm_dot16x2).

References: an independent numpy emulation of llama.cpp's Q8_1 quantization and Q4 x Q8 dot
(float64 arithmetic, round half away from zero as ggml's scalar quantize_row_q8_1 does), the
`gguf` package's quantizer for the weights, the reference interpreter, and the float32 model.
"""
import shutil
import subprocess

import numpy as np
import pytest

from luminar.backends import BACKENDS
from luminar.backends.cpu import cc
from luminar.errors import ShapeError, UnsupportedError, ValueDomainError
from luminar.graph import Graph
from luminar.io import quant

pytestmark = pytest.mark.skipif("cpu" not in BACKENDS, reason="needs the cpu backend (a C compiler)")
gguf = pytest.importorskip("gguf")


def quantized(values: np.ndarray, qtype: str) -> dict[str, np.ndarray]:
    """`values` (rows, K) in GGUF format `qtype` by the gguf package, split into luminar's parts."""
    kind = gguf.GGMLQuantizationType[qtype]
    blocks = gguf.quants.quantize(values, kind)
    fmt = quant.FORMATS[qtype]
    return fmt.split(blocks.reshape(values.shape[0], -1, fmt.type_size))


def numpy_int8_linear(x: np.ndarray, qtype: str, parts: dict[str, np.ndarray]) -> np.ndarray:
    """llama.cpp's Q8_1 x Q4/Q8 dot, emulated: x per block of 32 as d = amax / 127 and
    q = round(x / d) half away from zero; per block d * scale * sum(w_q * q) (+ d * min * sum(q))."""
    rows, k = x.shape
    blocks = x.astype(np.float64).reshape(rows, k // 32, 32)
    amax = np.abs(blocks).max(-1)
    d = amax / 127
    scaled = np.divide(blocks, d[..., None], out=np.zeros_like(blocks), where=d[..., None] > 0)
    q = np.sign(scaled) * np.floor(np.abs(scaled) + 0.5)
    scale = parts["scale"].astype(np.float64)
    if qtype == "Q8_0":
        size = parts["quants"].shape[-1]  # 32, or 16 (a repacked Q6_K)
        wq = parts["quants"].astype(np.float64)  # (n, blocks, size)
        qb = q.reshape(rows, 1, -1, size)
        dd = np.repeat(d, 32 // size, axis=-1)[:, None, :]
        return (np.sum(wq * qb, -1) * scale * dd).sum(-1)
    nibbles = np.concatenate([parts["quants"] & 15, parts["quants"] >> 4], -1).astype(np.float64)
    minimum = parts["min"].astype(np.float64) if qtype == "Q4_1" else -8.0 * scale
    dots = np.sum(nibbles * q[:, None], -1)  # (rows, n, blocks)
    return (dots * scale * d[:, None] + minimum * (d * q.sum(-1))[:, None]).sum(-1)


def compiled_linear(x: np.ndarray, qtype: str, parts: dict, shape: tuple, backend: str = "cpu",
                    linear=quant.int8_linear):
    """(program, y) of `linear` (int8_linear, or block_linear) of x and the weight `parts`, compiled."""
    g = Graph()
    xs = g.tensor("x", x.shape)
    inputs = {name: g.tensor(f"w_{name}", a.shape, quant._STORAGE[a.dtype]) for name, a in parts.items()}
    linear(xs, quant.QuantizedWeight(qtype, inputs, shape)).output("y")
    program = g.compile(backend)
    return program, program.run({"x": x, **{f"w_{name}": a for name, a in parts.items()}})["y"]


# 9 blocks a row: with AVX-512 two groups of four blocks in 64-byte dots and one block alone
WEIGHTS = np.random.default_rng(0).standard_normal((40, 288)).astype(np.float32) * 0.1
X = np.random.default_rng(1).standard_normal((3, 288)).astype(np.float32)
X[1, 32:64] = 0.0  # a block of zeros quantizes to zeros (d = 0)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1"])
def test_int8_linear_matches_llama_cpp_q8_1_emulation_and_the_reference(qtype):
    parts = quantized(WEIGHTS, qtype)
    program, ours = compiled_linear(X, qtype, parts, WEIGHTS.shape)
    expected = numpy_int8_linear(X, qtype, parts)
    assert np.abs(ours - expected).max() <= 1e-5 * np.abs(expected).max()
    _, reference = compiled_linear(X, qtype, parts, WEIGHTS.shape, backend="reference")
    assert np.abs(ours - reference).max() <= 1e-5 * np.abs(expected).max()
    # and it is a matmul: within int8 rounding of the float product with the dequantized weight
    exact = X @ quant.dequantize_parts(qtype, parts, WEIGHTS.shape).T
    assert np.abs(ours - exact).max() <= 0.02 * np.abs(exact).max()
    # the quantized activations are stored as bytes and multiplied by integer dots
    assert "int8" in [program.kernels.buffers[k.out].dtype for k in program.kernels.kernels]
    assert "+= lm_dot16x2(" in program.source  # (a call in a kernel, not the helper)
    assert ("lm_dot32((__m512i)" in program.source) == (cc.VECTOR_LANES == 16)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_1"])
def test_4_bit_weights_meet_x_quantized_half_major_q8_0_block_major(qtype):
    """A 4-bit weight's bytes hold a block's low halves in their low nibbles: x is quantized as
    every block's first 16 values, then every block's last 16 (Int8Rows.halves), so four blocks'
    halves are one 64-byte load (stride 16) where the block-major layout gathers 16 bytes per
    block. A Q8_0 block meets x's 32 bytes whole: block-major. Both layouts agree with llama.cpp."""
    g = Graph()
    rows = quant.quantize_activations(g.tensor("x", X.shape), halves=qtype != "Q8_0")
    assert rows.halves == (qtype != "Q8_0")
    assert tuple(rows.values.dims) == ((3, 2, 9, 16) if rows.halves else (3, 9, 32))
    rows.values.output("q")
    q = g.compile("cpu").run({"x": X})["q"]
    d = np.abs(X.astype(np.float64)).reshape(3, 9, 32).max(-1) / 127
    expected = np.sign(X.reshape(3, 9, 32)) * np.floor(np.abs(X.reshape(3, 9, 32)) / np.where(d > 0, d, 1)[..., None] + 0.5)
    np.testing.assert_array_equal(q.reshape(3, 2, 9, 16).transpose(0, 2, 1, 3).reshape(3, 9, 32) if rows.halves
                                  else q, expected)
    program, ours = compiled_linear(X, qtype, quantized(WEIGHTS, qtype), WEIGHTS.shape)
    # no operand is gathered 16 bytes per block (lm_bytes16x4 at a stride of 32; x's halves were, for Q4_1)
    assert [line for line in program.source.splitlines() if "= lm_bytes16x4(" in line and ", 32)" in line] == []
    assert np.abs(ours - numpy_int8_linear(X, qtype, quantized(WEIGHTS, qtype))).max() <= 1e-5 * np.abs(ours).max()


def test_q8_0_quants_of_minus_128_multiply_exactly():
    """A Q8_0 file may hold -128 (gguf's quantizer never writes it): the integer dot takes the
    weight as its sign-carrying first factor, since maddubs' second factor must stay above -128."""
    parts = quantized(WEIGHTS, "Q8_0")
    parts["quants"][:, :, :3] = -128
    program, ours = compiled_linear(X, "Q8_0", parts, WEIGHTS.shape)
    expected = numpy_int8_linear(X, "Q8_0", parts)
    assert np.abs(ours - expected).max() <= 1e-5 * np.abs(expected).max()
    assert "+= lm_dot16x2(" in program.source  # (a call in a kernel, not the helper)
    assert ("lm_dot32((__m512i)" in program.source) == (cc.VECTOR_LANES == 16)


def test_float16_block_scales_convert_exactly_subnormals_included():
    """The block scales are converted 16 at a time before a row's dots: row r's scales all share
    the half exponent field r (0: subnormals), every term is positive (no cancellation), so each
    output matches the float64 emulation to float32 rounding, whatever its magnitude."""
    rng = np.random.default_rng(3)
    exponent = np.arange(31, dtype=np.uint16)[:, None] << 10
    bits = exponent | rng.integers(1, 1024, (31, 9), dtype=np.uint16)
    parts = {"scale": bits.view(np.float16), "quants": rng.integers(1, 128, (31, 9, 32)).astype(np.int8)}
    x = np.abs(X[:1]) + 0.01
    _, ours = compiled_linear(x, "Q8_0", parts, (31, 288))
    np.testing.assert_allclose(ours, numpy_int8_linear(x, "Q8_0", parts), rtol=1e-5, atol=0)


def test_a_repacked_q6_k_weight_dots_blocks_of_16():
    rng = np.random.default_rng(2)
    parts = {"scale": (rng.random((40, 18)) * 0.01).astype(np.float32),
             "quants": rng.integers(-32, 32, (40, 18, 16)).astype(np.int8)}  # as _q6k_as_q8 repacks
    program, ours = compiled_linear(X, "Q8_0", parts, (40, 288))
    assert "+= lm_dot16x2(" in program.source
    expected = numpy_int8_linear(X, "Q8_0", parts)
    assert np.abs(ours - expected).max() <= 1e-5 * np.abs(expected).max()


def extreme_dot_cases(seed: int, n: int) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """(a_signed, a, b) over an integer dot's whole domain, the largest products in lane 0: a
    signed first factor in [-128, 127] against a second in [-127, 127], and an unsigned first one
    in [0, 127] against a second in [-128, 127]."""
    rng, cases = np.random.default_rng(seed), []
    for a_signed, (a_lo, b_lo) in ((1, (-128, -127)), (0, (0, -128))):
        a, b = rng.integers(a_lo, 128, n), rng.integers(b_lo, 128, n)
        a[:4], b[:4] = [a_lo, a_lo, 127, 127], [b_lo, 127, b_lo, 127]
        cases.append((a_signed, a, b))
    return cases


def printed_lanes(tmp_path, calls: str, flag_sets: list[list[str]], skip_unbuildable: bool) -> list[list[float]]:
    """The floats a C main of `calls` after the PRELUDE prints, built once per set of flags."""
    from luminar.backends.cpu.render import PRELUDE
    (tmp_path / "dot.c").write_text(PRELUDE + "\n#include <stdio.h>\nint main(void) {\n" + calls + "    return 0;\n}\n")
    outputs = []
    for flags in flag_sets:
        exe = tmp_path / f"dot{len(outputs)}"
        build = subprocess.run([cc.compiler(), "-O2", "-fopenmp", *flags, str(tmp_path / "dot.c"), "-o", str(exe), "-lm"],
                               capture_output=True, text=True)
        if build.returncode and skip_unbuildable:
            pytest.skip(f"cannot build for {flags}: {build.stderr[:200]}")
        assert build.returncode == 0, build.stderr[:2000]
        outputs.append([float(v) for v in subprocess.run([str(exe)], capture_output=True, text=True).stdout.split()])
    return outputs


def test_int8_dot_fallback_without_avx2_computes_the_same_lanes(tmp_path):
    """The renderer's C helper, built once with AVX2 (maddubs) and once for plain x86-64 (the
    portable loop), over its whole domain's extremes (extreme_dot_cases)."""
    if shutil.which(cc.compiler()) is None:
        pytest.skip("no C compiler")
    cases = extreme_dot_cases(0, 32)
    calls = "".join(
        f"    {{ const signed char a[32] = {{{', '.join(map(str, a))}}}, b[32] = {{{', '.join(map(str, b))}}};\n"
        f"      lm_v8 lanes = lm_dot16x2(lm_bytes16(a), lm_bytes16(b), lm_bytes16(a + 16), lm_bytes16(b + 16), {flag});\n"
        f"      for (int l = 0; l < 8; l++) printf(\"%.1f \", lanes[l]); }}\n" for flag, a, b in cases)
    outputs = printed_lanes(tmp_path, calls, [["-march=native"], ["-march=x86-64", "-mno-avx2"]], skip_unbuildable=True)
    # lane l of a call: the products of bytes 4l .. 4l + 3 of a = a0 a1 and b = b0 b1
    expected = [float(v) for _, a, b in cases for v in (a * b).reshape(8, 4).sum(-1)]
    assert outputs[0] == outputs[1] == expected


def test_64_byte_block_dots_with_and_without_vnni_compute_the_same_lanes(tmp_path):
    """The AVX-512 helpers of grouped block dots (lm_dot32: vpdpbusd, or maddubs without VNNI),
    over the domain's extremes as above, 64 bytes at a time: lane l sums the products of bytes
    4l .. 4l + 3 of both pairs."""
    if cc.VECTOR_LANES != 16 or shutil.which(cc.compiler()) is None:
        pytest.skip("needs AVX-512 (F and BW) and a C compiler")
    cases = extreme_dot_cases(1, 128)
    calls = "".join(
        f"    {{ const signed char a[128] = {{{', '.join(map(str, a))}}}, b[128] = {{{', '.join(map(str, b))}}};\n"
        f"      __m512i sum = lm_dot32(_mm512_loadu_si512(a), _mm512_loadu_si512(b), {flag}, _mm512_setzero_si512());\n"
        f"      lm_v16 lanes = (lm_v16)_mm512_cvtepi32_ps(lm_dot32(_mm512_loadu_si512(a + 64), _mm512_loadu_si512(b + 64), {flag}, sum));\n"
        f"      for (int l = 0; l < 16; l++) printf(\"%.1f \", lanes[l]); }}\n" for flag, a, b in cases)
    outputs = printed_lanes(tmp_path, calls, [["-march=native"], ["-march=native", "-mno-avx512vnni", "-mno-avxvnni"]],
                            skip_unbuildable=False)
    expected = [float(v) for _, a, b in cases for v in (a[:64] * b[:64] + a[64:] * b[64:]).reshape(16, 4).sum(-1)]
    assert outputs[0] == outputs[1] == expected


def test_unsupported_formats_and_shapes_are_clear_errors():
    g = Graph()
    x = g.tensor("x", (1, 64))
    parts = {"scale": g.tensor("s", (8, 2), "float16"), "min": g.tensor("m", (8, 2), "float16"),
             "high": g.tensor("h", (8, 2, 4), "uint8"), "quants": g.tensor("q", (8, 2, 16), "uint8")}
    with pytest.raises(UnsupportedError, match="Q5_1"):
        quant.int8_linear(x, quant.QuantizedWeight("Q5_1", parts, (8, 64)))
    with pytest.raises(ShapeError, match="multiple of 32"):
        quant.int8_linear(g.tensor("x48", (1, 48)), quant.QuantizedWeight("Q8_0", parts, (8, 48)))


# -- a model -----------------------------------------------------------------------------------------
def small_model(activations: str, formats=("Q4_1", "Q8_0"), backend: str = "cpu", stack: bool = True,
                v_format: str | None = None, head_dim: int = 16):
    """A random-config Llama (2 layers, hidden 160, 4 query and 2 key/value heads of head_dim) from
    GGUF tensors: linear weights in formats[0] (attn_v in v_format if given), the (tied) embedding
    in formats[1], norms in F32. stack=False: no weights stacked by rows (Weights.linears)."""
    from luminar.io.gguf import GGUFTensor
    from luminar.models.llama import LlamaConfig, LlamaModel, Weights
    config = LlamaConfig(vocab_size=96, hidden_size=160, intermediate_size=192, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim, tie_word_embeddings=True)
    rng = np.random.default_rng(3)
    shapes = {"token_embd.weight": (96, 160), "output_norm.weight": (160,)}
    for i in range(2):
        shapes.update({f"blk.{i}.attn_norm.weight": (160,), f"blk.{i}.ffn_norm.weight": (160,),
                       f"blk.{i}.attn_q.weight": (4 * head_dim, 160), f"blk.{i}.attn_k.weight": (2 * head_dim, 160),
                       f"blk.{i}.attn_v.weight": (2 * head_dim, 160), f"blk.{i}.attn_output.weight": (160, 4 * head_dim),
                       f"blk.{i}.ffn_gate.weight": (192, 160), f"blk.{i}.ffn_up.weight": (192, 160),
                       f"blk.{i}.ffn_down.weight": (160, 192)})
    tensors = {}
    for name, shape in shapes.items():
        values = (rng.standard_normal(shape) * (1.0 if "norm" in name else 0.2)).astype(np.float32)
        if "norm" in name:
            tensors[name] = GGUFTensor(name, shape, "F32", {"data": 1.0 + 0.1 * values})
        else:
            qtype = formats[1] if name == "token_embd.weight" else formats[0]
            qtype = v_format if v_format and name.endswith("attn_v.weight") else qtype
            parts = {"data": values} if qtype == "F32" else quantized(values, qtype)
            tensors[name] = GGUFTensor(name, shape, qtype, parts)
    weights = Weights.from_gguf(tensors, config)
    if not stack:
        weights._stack = None
    return LlamaModel(config, weights, activations=activations, backend=backend)


@pytest.mark.parametrize("activations", ["float", "int8"])
def test_linear_layers_of_one_input_stack_by_rows_into_one_matmul(activations):
    """q, k and v (and gate and up) read one input: weights stored alike are stacked by rows into
    one weight, so a decode step runs one matvec for them; attn_v stored otherwise stays apart.
    Each output row is the same dot as before: the logits equal the unstacked model's."""
    stacked, separate = (small_model(activations, stack=s, v_format="Q8_0") for s in (True, False))
    inputs = set(stacked.program.graph.inputs)
    assert {"blk_0_attn_q_attn_k_weight_quants", "blk_0_attn_v_weight_quants",
            "blk_0_ffn_gate_ffn_up_weight_quants"} <= inputs
    assert not {"blk_0_attn_q_weight_quants", "blk_0_ffn_up_weight_quants"} & inputs
    assert "blk_0_attn_q_weight_quants" in separate.program.graph.inputs
    prompt, steps = [3, 17, 42, 5], [88, 61, 9]
    caches = [stacked.new_cache(), separate.new_cache()]
    for ids in [prompt, *([t] for t in steps)]:
        got, want = (m.forward(ids, c) for m, c in zip((stacked, separate), caches))
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


def test_a_model_with_int8_activations_stays_close_to_the_float_model():
    """Decode steps run the int8 program, the same as the reference interpreter computes on its
    graph; a prompt (more than one token) runs the float32 one."""
    prompt, steps = [3, 17, 42, 5], [88, 61, 9, 30, 12, 70]
    models = {a: small_model(a) for a in ("float", "int8")}
    models["reference"] = small_model("int8", backend="reference")
    caches = {a: m.new_cache() for a, m in models.items()}
    first = {a: m.forward(prompt, caches[a]) for a, m in models.items()}
    assert np.array_equal(first["int8"], first["float"])
    logits = {a: np.concatenate([m.forward([t], caches[a]) for t in steps]) for a, m in models.items()}
    exact, int8 = logits["float"], logits["int8"]
    assert np.abs(int8 - logits["reference"]).max() <= 1e-4 * np.abs(exact).max()
    assert np.abs(int8 - exact).max() <= 0.1 * np.abs(exact).max()  # (the rounding of x to 8 bits: 6% here)
    assert (int8.argmax(-1) == exact.argmax(-1)).mean() >= 0.75
    assert not np.array_equal(int8, exact)  # (it is another computation)
    assert "+= lm_dot16x2(" in models["int8"].program.source  # (5 and 6 blocks: loops, not unrolled)


def test_int8_activations_need_block_quantized_weights():
    with pytest.raises(UnsupportedError, match=r"'blk.0.attn_q\+attn_k\+attn_v.weight' is stored as float"):
        small_model("int8", formats=("F32", "Q8_0"))
    with pytest.raises(ValueDomainError, match="activations"):
        small_model("int4")
