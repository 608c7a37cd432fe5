"""Reading safetensors checkpoints (Hugging Face layout) without dependencies.

A .safetensors file is an 8-byte little-endian header length, a JSON header mapping each tensor
name to {dtype, shape, data_offsets: [begin, end]} (offsets into the data after the header), and
the raw little-endian data. We memory-map the file and return numpy views, so loading is cheap.

    weights = load_safetensors("path/to/model_dir")   # a file, or a directory (sharded or not)
    config = read_config("path/to/model_dir")         # config.json as a dict

dtypes: arrays keep their stored dtype (float32, float16, int64, ...), except bfloat16, which
numpy lacks: it is converted to float32 (exactly; this copies). Returned views are read-only.
"""
from __future__ import annotations

import json
import os

import numpy as np

from ..errors import WeightFileError

_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
           "I16": np.int16, "I8": np.int8, "U8": np.uint8, "U16": np.uint16, "U32": np.uint32,
           "U64": np.uint64, "BOOL": np.bool_, "BF16": np.uint16}
_INDEX = "model.safetensors.index.json"


def load_safetensors(path) -> dict[str, np.ndarray]:
    """All tensors of a .safetensors file, or of a directory's checkpoint, by name.

    A directory is read through its `model.safetensors.index.json` when it has one (sharded
    checkpoints), otherwise every `*.safetensors` file in it, in name order."""
    path = os.fspath(path)
    if os.path.isdir(path):
        files = _checkpoint_files(path)
        tensors: dict[str, np.ndarray] = {}
        for file in files:
            for name, array in _read_file(file).items():
                if name in tensors:
                    raise WeightFileError(f"{file}: tensor {name!r} also appears in another file of {path}")
                tensors[name] = array
        return tensors
    return _read_file(path)


def read_config(path) -> dict:
    """config.json of a model directory (or the path of a JSON file itself) as a dict."""
    path = os.fspath(path)
    file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise WeightFileError(f"{file}: no such file")
    try:
        with open(file, encoding="utf-8") as f:
            config = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise WeightFileError(f"{file}: not valid JSON ({e})") from None
    if not isinstance(config, dict):
        raise WeightFileError(f"{file}: expected a JSON object, got {type(config).__name__}")
    return config


def _checkpoint_files(directory: str) -> list[str]:
    index = os.path.join(directory, _INDEX)
    if os.path.isfile(index):
        try:
            with open(index, encoding="utf-8") as f:
                weight_map = json.load(f)["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise WeightFileError(f"{index}: not a valid safetensors index ({type(e).__name__}: {e})") from None
        return [os.path.join(directory, name) for name in sorted(set(weight_map.values()))]
    files = sorted(os.path.join(directory, n) for n in os.listdir(directory) if n.endswith(".safetensors"))
    if not files:
        raise WeightFileError(f"{directory}: no *.safetensors files in this directory")
    return files


def _read_file(path: str) -> dict[str, np.ndarray]:
    if not os.path.isfile(path):
        raise WeightFileError(f"{path}: no such file")
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        prefix = f.read(8)
        header_len = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
        if header_len < 2 or 8 + header_len > size:
            raise WeightFileError(f"{path}: not a safetensors file (header length {header_len}, file size {size})")
        try:
            header = json.loads(f.read(header_len))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise WeightFileError(f"{path}: not a safetensors file (header is not JSON: {e})") from None
    if not isinstance(header, dict):
        raise WeightFileError(f"{path}: not a safetensors file (header is not a JSON object)")
    header.pop("__metadata__", None)
    data = np.memmap(path, np.uint8, "r", offset=8 + header_len) if size > 8 + header_len else np.zeros(0, np.uint8)
    return {name: _tensor(path, name, info, data) for name, info in header.items()}


def _tensor(path: str, name: str, info, data: np.ndarray) -> np.ndarray:
    try:
        dtype_name, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
    except (KeyError, TypeError, ValueError):
        raise WeightFileError(f"{path}: tensor {name!r} has a malformed header entry {info!r}") from None
    if dtype_name not in _DTYPES:
        raise WeightFileError(f"{path}: tensor {name!r} has unsupported dtype {dtype_name} "
                              f"(supported: {', '.join(_DTYPES)})")
    dtype = np.dtype(_DTYPES[dtype_name])
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if end - begin != expected or begin < 0:
        raise WeightFileError(f"{path}: tensor {name!r} {dtype_name}{list(shape)} needs {expected} bytes, "
                              f"its offsets span {end - begin}")
    if end > data.size:
        raise WeightFileError(f"{path}: truncated: tensor {name!r} ends at data byte {end}, "
                              f"the file has {data.size} data bytes")
    array = data[begin:end].view(dtype).reshape(shape)
    if dtype_name == "BF16":  # numpy has no bfloat16: widen the bit patterns to float32 exactly
        array = (array.astype(np.uint32) << 16).view(np.float32)
    return array
