"""Block formats beyond Q4/Q8: Q5_0, Q5_1 and the K-quants Q4_K, Q5_K, Q6_K (io/quant.py).

Each format's graph dequantization (primitives only: multiplies, fmod, index constants) and its
numpy one are checked bit for bit against the `gguf` package's dequantizer on random blocks --
every bit pattern, scales included -- on the reference and cpu backends; then through a GGUF
file written by gguf.GGUFWriter, consumed by a matmul as a model consumes it.
"""
import shutil

import numpy as np
import pytest

import luminar as lm
from luminar.io import quant
from luminar.io.gguf import read_gguf

gguf = pytest.importorskip("gguf")

BACKENDS = ["reference"] + (["cpu"] if shutil.which("gcc") or shutil.which("cc") else [])
NEW_FORMATS = ["Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]


def random_blocks(qtype: str, rows: int, blocks: int, seed: int = 0, small: bool = False) -> np.ndarray:
    """uint8 (rows, blocks, bytes per block) of random bits, float16 fields kept finite (or, with
    `small`, drawn around 0.01 so that products of the values stay well conditioned)."""
    fmt = quant.FORMATS[qtype]
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (rows, blocks, fmt.type_size), dtype=np.uint8)
    for part in fmt.split(data).values():
        if part.dtype == np.float16 and small:
            part[...] = (0.01 * rng.standard_normal(part.shape)).astype(np.float16)
        elif part.dtype == np.float16:
            bits = part.view(np.uint16)
            bits &= np.uint16(0xBBFF)  # an exponent of all ones (inf / nan) becomes a finite one
    return data


class Stored:
    """What quant.weight reads from a GGUF tensor: its format, shape and parts."""

    def __init__(self, qtype, blocks):
        fmt = quant.FORMATS[qtype]
        self.qtype, self.parts = qtype, fmt.split(blocks)
        self.shape = (blocks.shape[0], blocks.shape[1] * fmt.block_size)


def gguf_values(qtype, blocks):
    rows = blocks.shape[0]
    return gguf.quants.dequantize(blocks.reshape(rows, -1), gguf.GGMLQuantizationType[qtype]).reshape(rows, -1)


@pytest.mark.parametrize("qtype", NEW_FORMATS)
def test_block_layout_matches_ggml(qtype):
    fmt = quant.FORMATS[qtype]
    assert (fmt.block_size, fmt.type_size) == gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]


@pytest.mark.parametrize("qtype", NEW_FORMATS)
def test_numpy_dequantization_is_bit_exact(qtype):
    blocks = random_blocks(qtype, 5, 3)
    stored = Stored(qtype, blocks)
    ours = quant.dequantize_parts(qtype, stored.parts, stored.shape)
    np.testing.assert_array_equal(ours, gguf_values(qtype, blocks))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("qtype", NEW_FORMATS)
def test_graph_dequantization_is_bit_exact(qtype, backend):
    blocks = random_blocks(qtype, 3, 2, seed=1)
    g = lm.Graph()
    w, feeds = quant.weight(g, "w", Stored(qtype, blocks))
    w.output("w")
    np.testing.assert_array_equal(g.compile(backend)(**feeds)["w"], gguf_values(qtype, blocks))


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A GGUF of one (8, 512) matrix per new format, of random blocks (the gguf package has no
    K-quant quantizer)."""
    path = str(tmp_path_factory.mktemp("quant") / "formats.gguf")
    writer = gguf.GGUFWriter(path, arch="llama")
    for qtype in NEW_FORMATS:
        blocks = random_blocks(qtype, 8, 512 // quant.FORMATS[qtype].block_size, seed=2, small=True)
        writer.add_tensor(qtype.lower(), blocks.reshape(8, -1), raw_dtype=gguf.GGMLQuantizationType[qtype])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("qtype", NEW_FORMATS)
def test_a_gguf_tensor_reads_into_parts_and_feeds_a_matmul(written, qtype):
    tensor = read_gguf(written).tensors[qtype.lower()]
    reference = gguf.GGUFReader(written).tensors
    raw = next(t for t in reference if t.name == qtype.lower())
    expected = gguf.quants.dequantize(raw.data, raw.tensor_type)
    assert tensor.qtype == qtype and tensor.shape == (8, 512) and "raw" not in tensor.parts
    np.testing.assert_array_equal(tensor.dequantize(), expected)
    x = np.random.default_rng(3).standard_normal((2, 512)).astype(np.float32)
    g = lm.Graph()
    w, feeds = quant.weight(g, "w", tensor)
    (g.tensor("x", x.shape) @ w.T).output("y")
    out = g.compile(BACKENDS[-1])(x=x, **feeds)["y"]
    np.testing.assert_allclose(out, x @ expected.T, rtol=1e-4, atol=1e-4)
