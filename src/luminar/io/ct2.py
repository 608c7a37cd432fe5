"""Reading CTranslate2 models (a directory with model.bin, config.json, tokenizer/vocabulary files).

`model.bin` is CTranslate2's own container: every integer is little-endian, and a string is a
uint16 byte count (the terminating NUL included) followed by its UTF-8 bytes and the NUL.

    uint32   binary version (1 .. 6 understood here)
    string   spec name, e.g. "WhisperSpec"        } binary version >= 2
    uint32   spec revision                         }
    uint32   number of variables, then for each:
      string   name, scopes separated by "/" (e.g. "encoder/layer_0/self_attention/linear_0/weight")
      uint8    rank, then rank x uint32 dims
      uint8    dtype id: 0 float32, 1 int8, 2 int16, 3 int32, 4 float16, 5 bfloat16   } version >= 4
      uint32   byte count                                                           }
      (before version 4: uint8 item size and uint32 item count; the dtype follows from the size)
      bytes    the data, row-major
    uint32   number of aliases, then (alias, variable name) string pairs   (version >= 3;
             e.g. a tied output projection aliases the embedding)

Scalars (rank 0) hold model options such as `decoder/num_heads` or `decoder/pre_norm`. Arrays are
returned as read-only numpy views of a memory map in their stored dtype (float16 stays float16,
half the memory); bfloat16, which numpy lacks, is widened to float32 exactly.

    model = read_ct2("path/to/model_dir")      # or the model.bin file itself
    model.spec, model.variables["decoder/embeddings/weight"].shape, model.config["suppress_ids"]
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field

import numpy as np

from ..errors import WeightFileError
from .safetensors import read_config

MAX_BINARY_VERSION = 6
_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16, 5: np.uint16}  # 5: bf16 bits
_BFLOAT16 = 5
_DTYPE_BY_ITEM_SIZE = {4: 0, 1: 1, 2: 4}  # before version 4: only the item size was stored


@dataclass
class CT2Model:
    """A parsed CTranslate2 model directory."""
    path: str                       # the model.bin file
    binary_version: int
    spec: str                       # the model specification's name, e.g. "WhisperSpec"
    revision: int
    variables: dict[str, np.ndarray]
    aliases: dict[str, str] = field(default_factory=dict)  # alias -> the variable it stands for
    config: dict = field(default_factory=dict)             # config.json beside model.bin, if any

    def scalar(self, name: str):
        """A rank-0 option variable as a Python number."""
        value = self.variables.get(name)
        if value is None or value.size != 1:
            raise WeightFileError(f"{self.path}: expected a scalar variable {name!r}")
        return value.reshape(()).item()


def read_ct2(path) -> CT2Model:
    """Parse a CTranslate2 model: a directory holding model.bin, or the model.bin file."""
    path = os.fspath(path)
    directory = path if os.path.isdir(path) else os.path.dirname(path)
    file = os.path.join(path, "model.bin") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise WeightFileError(f"{file}: no such file")
    data = np.memmap(file, np.uint8, "r") if os.path.getsize(file) else np.zeros(0, np.uint8)
    reader = _Reader(file, data)
    version = reader.uint("I", "binary version")
    if not 1 <= version <= MAX_BINARY_VERSION:
        raise WeightFileError(f"{file}: not a CTranslate2 model.bin (binary version {version}; "
                              f"versions 1..{MAX_BINARY_VERSION} are understood)")
    spec, revision = (reader.string("spec name"), reader.uint("I", "spec revision")) if version >= 2 else ("", 1)
    count = reader.uint("I", "variable count")
    variables: dict[str, np.ndarray] = {}
    for _ in range(count):
        name, array = _variable(reader, version)
        if name in variables:
            raise WeightFileError(f"{file}: variable {name!r} appears twice")
        variables[name] = array
    aliases: dict[str, str] = {}
    if version >= 3:
        for _ in range(reader.uint("I", "alias count")):
            alias, target = reader.string("alias name"), reader.string("alias target")
            if target not in variables:
                raise WeightFileError(f"{file}: alias {alias!r} names a missing variable {target!r}")
            aliases[alias] = target
            variables[alias] = variables[target]
    if reader.offset != len(data):
        raise WeightFileError(f"{file}: {len(data) - reader.offset} unexpected bytes after the variable table")
    return CT2Model(file, version, spec, revision, variables, aliases, _config(directory))


def _variable(reader: "_Reader", version: int) -> tuple[str, np.ndarray]:
    name = reader.string("variable name")
    rank = reader.uint("B", f"rank of {name!r}")
    shape = tuple(reader.uint("I", f"dimension of {name!r}") for _ in range(rank))
    if version >= 4:
        dtype_id = reader.uint("B", f"dtype of {name!r}")
        num_bytes = reader.uint("I", f"byte count of {name!r}")
    else:
        item_size = reader.uint("B", f"item size of {name!r}")
        if item_size not in _DTYPE_BY_ITEM_SIZE:
            raise WeightFileError(f"{reader.file}: variable {name!r} has an item size of {item_size} bytes")
        dtype_id, num_bytes = _DTYPE_BY_ITEM_SIZE[item_size], reader.uint("I", f"item count of {name!r}") * item_size
    if dtype_id not in _DTYPES:
        raise WeightFileError(f"{reader.file}: variable {name!r} has unknown dtype id {dtype_id}")
    dtype = np.dtype(_DTYPES[dtype_id])
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if num_bytes != expected:
        raise WeightFileError(f"{reader.file}: variable {name!r} of shape {shape} and dtype {dtype} needs "
                              f"{expected} bytes, the file says {num_bytes}")
    array = reader.take(num_bytes, name).view(dtype).reshape(shape)
    if dtype_id == _BFLOAT16:
        array = (array.astype(np.uint32) << 16).view(np.float32)
    return name, array


class _Reader:
    """Sequential little-endian reads from the mapped file, with truncation reported by name."""

    def __init__(self, file: str, data: np.ndarray):
        self.file, self.data, self.offset = file, data, 0

    def take(self, size: int, what: str) -> np.ndarray:
        if self.offset + size > len(self.data):
            raise WeightFileError(f"{self.file}: truncated while reading {what} at byte {self.offset} "
                                  f"(needs {size} bytes, {len(self.data) - self.offset} left)")
        chunk = self.data[self.offset:self.offset + size]
        self.offset += size
        return chunk

    def uint(self, fmt: str, what: str) -> int:
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt), what).tobytes())[0]

    def string(self, what: str) -> str:
        size = self.uint("H", what)
        raw = self.take(size, what).tobytes()
        if size == 0 or raw[-1] != 0:
            raise WeightFileError(f"{self.file}: {what} at byte {self.offset - size} is not a NUL-terminated string")
        try:
            return raw[:-1].decode("utf-8")
        except UnicodeDecodeError:
            raise WeightFileError(f"{self.file}: {what} at byte {self.offset - size} is not UTF-8") from None


def _config(directory: str) -> dict:
    file = os.path.join(directory, "config.json")
    return read_config(file) if os.path.isfile(file) else {}
