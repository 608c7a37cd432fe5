"""Reading PyTorch checkpoints (files written by torch.save) without torch, and without running them.

A torch checkpoint is a pickle, and unpickling an untrusted pickle can call any Python function
it names (``os.system`` included). This reader unpickles with an allow-list: the only globals a
checkpoint may name are the ones torch.save writes for tensors and state dicts
(``collections.OrderedDict``, ``torch._utils._rebuild_tensor_v2`` and its relatives, the typed
storage classes ``torch.FloatStorage`` ...). Each is mapped to a function of this module that
builds plain data; any other global raises WeightFileError before anything is called.

Two layouts are read:

- **legacy** (torch < 1.6, and ``_use_new_zipfile_serialization=False``): five things one after
  another in one file: a pickled magic number, a protocol version, a system-info dict, the
  object pickle (tensors refer to storages through persistent ids
  ``('storage', storage_type, key, location, numel, view_metadata)``), a pickled list of storage
  keys, then each storage's raw bytes in that order, preceded by its element count (int64).
- **zip** (the default since torch 1.6): a zip archive with ``<name>/data.pkl`` (the object
  pickle, persistent ids ``('storage', storage_type, key, location, numel)``) and one file
  ``<name>/data/<key>`` of raw bytes per storage.

Tensors come back as numpy arrays (C-contiguous copies, so they own their data); bfloat16 is
widened to float32 exactly. ``load_torch_state_dict(path)`` returns the flat {name: array}
mapping that ``luminar.nn.Module.load_state_dict`` takes; ``read_torch_checkpoint`` returns the
whole unpickled object (dicts, lists, numbers and arrays).
"""
from __future__ import annotations

import collections
import io
import os
import pickle
import struct
import zipfile
from collections.abc import Mapping

import numpy as np

from ..errors import WeightFileError

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001

# torch's typed storage classes -> the numpy dtype of their elements (as stored on disk)
_STORAGE_DTYPES = {"DoubleStorage": np.float64, "FloatStorage": np.float32, "HalfStorage": np.float16,
                   "BFloat16Storage": np.uint16, "LongStorage": np.int64, "IntStorage": np.int32,
                   "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8,
                   "BoolStorage": np.bool_}


class _StorageType:
    """What a checkpoint's ``torch.FloatStorage`` (etc.) global becomes: a name and an element dtype."""

    def __init__(self, name: str):
        self.name, self.dtype = name, np.dtype(_STORAGE_DTYPES[name])


class _Storage:
    """One storage: a flat array of `numel` elements, filled when its bytes are read."""

    def __init__(self, kind: _StorageType, key: str, numel: int):
        self.kind, self.key, self.numel = kind, key, numel
        self.data: np.ndarray | None = None


class _StorageView:
    """A legacy view into another storage (view_metadata): elements offset .. offset + numel."""

    def __init__(self, base: _Storage, offset: int, numel: int):
        self.base, self.offset, self.numel = base, offset, numel


class _Tensor:
    """A tensor whose storage bytes may not have been read yet; resolved to an ndarray afterwards."""

    def __init__(self, storage, offset: int, size, stride):
        self.storage, self.offset = storage, offset
        self.size, self.stride = tuple(size), tuple(stride)


def _rebuild_tensor(storage, storage_offset, size, stride, *_ignored):
    """torch._utils._rebuild_tensor(_v2): (storage, offset, size, stride, requires_grad, hooks[, metadata])."""
    if not isinstance(storage, (_Storage, _StorageView)):
        raise WeightFileError(f"a tensor's storage is a {type(storage).__name__}, not a storage")
    if not (_is_ints(size) and _is_ints(stride) and len(size) == len(stride) and isinstance(storage_offset, int)):
        raise WeightFileError(f"a tensor has an invalid size {size!r} / stride {stride!r} / offset {storage_offset!r}")
    return _Tensor(storage, storage_offset, size, stride)


def _rebuild_parameter(data, requires_grad=False, backward_hooks=None, *_ignored):
    """torch._utils._rebuild_parameter: a Parameter is its tensor here."""
    return data


def _is_ints(values) -> bool:
    return isinstance(values, tuple) and all(isinstance(v, int) and not isinstance(v, bool) for v in values)


# (module, name) -> what the global means here; nothing outside this table is ever looked up
_ALLOWED = {("collections", "OrderedDict"): collections.OrderedDict,
            ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
            ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
            ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
            **{("torch", name): _StorageType(name) for name in _STORAGE_DTYPES}}


class _RestrictedUnpickler(pickle.Unpickler):
    """An Unpickler that resolves only the allow-listed globals and torch's storage persistent ids."""

    def __init__(self, file, where: str, storage):
        super().__init__(file)
        self.where, self._storage = where, storage

    def find_class(self, module, name):
        allowed = _ALLOWED.get((module, name))
        if allowed is None:
            raise WeightFileError(f"{self.where}: the pickle names the global {module}.{name}, which is not a tensor "
                                  f"or state-dict type; refusing to load it (it could run code)")
        return allowed

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage" and isinstance(pid[1], _StorageType)
                and isinstance(pid[4], int)):
            raise WeightFileError(f"{self.where}: unexpected persistent id {pid!r:.200} (expected a tensor storage)")
        return self._storage(pid)


def _unpickle(data: bytes, where: str, storage=None):
    """One pickle from `data` through the restricted unpickler; returns (object, bytes consumed)."""
    def no_storage(pid):
        raise WeightFileError(f"{where}: a storage reference outside the object pickle")

    stream = io.BytesIO(data)
    try:
        value = _RestrictedUnpickler(stream, where, storage or no_storage).load()
    except WeightFileError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError,
            struct.error, UnicodeDecodeError, MemoryError, RecursionError) as e:
        raise WeightFileError(f"{where}: not a readable torch checkpoint (truncated or corrupt pickle: "
                              f"{type(e).__name__}: {e})") from None
    return value, stream.tell()


# -- the two layouts ------------------------------------------------------------------------------
def _read_legacy(data: bytes, where: str):
    position = 0
    header = []
    for what in ("magic number", "protocol version", "system info"):
        value, used = _unpickle(data[position:], f"{where} ({what})")
        header.append(value)
        position += used
    magic, protocol, info = header
    if magic != LEGACY_MAGIC:
        raise WeightFileError(f"{where}: not a torch checkpoint (wrong magic number)")
    if protocol != LEGACY_PROTOCOL:
        raise WeightFileError(f"{where}: unsupported legacy protocol version {protocol!r} (expected {LEGACY_PROTOCOL})")
    if not isinstance(info, dict) or not info.get("little_endian", False):
        raise WeightFileError(f"{where}: only little-endian checkpoints are supported")

    storages: dict[str, _Storage] = {}

    def storage(pid):
        _, kind, key, _location, numel, *view = pid
        base = storages.setdefault(str(key), _Storage(kind, str(key), numel))
        if view and view[0] is not None:  # (view key, offset, view size): an old-style view of `base`
            _view_key, offset, view_numel = view[0]
            return _StorageView(base, offset, view_numel)
        return base

    root, used = _unpickle(data[position:], f"{where} (object)", storage)
    position += used
    keys, used = _unpickle(data[position:], f"{where} (storage keys)")
    position += used
    if not isinstance(keys, list) or set(map(str, keys)) != set(storages):
        raise WeightFileError(f"{where}: the storage key list does not match the storages the object uses")
    for key in map(str, keys):
        s = storages[key]
        if position + 8 > len(data):
            raise WeightFileError(f"{where}: truncated: storage {key} is missing (file ends at byte {len(data)})")
        (numel,) = struct.unpack_from("<q", data, position)
        nbytes = numel * s.kind.dtype.itemsize
        position += 8
        if numel != s.numel or numel < 0:
            raise WeightFileError(f"{where}: storage {key} holds {numel} elements, the object expects {s.numel}")
        if position + nbytes > len(data):
            raise WeightFileError(f"{where}: truncated: storage {key} needs {nbytes} bytes at byte {position}, "
                                  f"the file has {len(data) - position}")
        s.data = np.frombuffer(data, s.kind.dtype, numel, position)
        position += nbytes
    return root


def _read_zip(path: str, where: str):
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        raise WeightFileError(f"{where}: not a readable zip checkpoint ({e})") from None
    with archive:
        pickles = [n for n in archive.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pickles) != 1:
            raise WeightFileError(f"{where}: a torch zip checkpoint has one <name>/data.pkl; found {pickles}")
        prefix = pickles[0][: -len("data.pkl")]
        order = prefix + "byteorder"
        if order in archive.namelist() and archive.read(order).strip() != b"little":
            raise WeightFileError(f"{where}: only little-endian checkpoints are supported")
        storages: dict[str, _Storage] = {}

        def storage(pid):
            _, kind, key, _location, numel = pid[:5]
            key = str(key)
            if key not in storages:
                s = storages[key] = _Storage(kind, key, numel)
                try:
                    raw = archive.read(f"{prefix}data/{key}")
                except (KeyError, zipfile.BadZipFile, OSError, EOFError) as e:
                    raise WeightFileError(f"{where}: storage {key} cannot be read ({e})") from None
                if len(raw) != numel * kind.dtype.itemsize:
                    raise WeightFileError(f"{where}: storage {key} has {len(raw)} bytes, expected "
                                          f"{numel * kind.dtype.itemsize}")
                s.data = np.frombuffer(raw, kind.dtype, numel)
            return storages[key]

        try:
            data = archive.read(pickles[0])
        except (zipfile.BadZipFile, OSError, EOFError) as e:
            raise WeightFileError(f"{where}: {pickles[0]} cannot be read ({e})") from None
        return _unpickle(data, f"{where} ({pickles[0]})", storage)[0]


# -- tensors to arrays ---------------------------------------------------------------------------------
def _to_array(tensor: _Tensor, where: str) -> np.ndarray:
    storage, offset = tensor.storage, tensor.offset
    if isinstance(storage, _StorageView):
        storage, offset, limit = storage.base, offset + storage.offset, storage.offset + storage.numel
    else:
        limit = storage.numel
    flat = storage.data
    if flat is None:
        raise WeightFileError(f"{where}: storage {storage.key} has no data")
    if any(n < 0 for n in tensor.size) or offset < 0:
        raise WeightFileError(f"{where}: a tensor has a negative size or offset")
    if 0 in tensor.size:
        array = np.zeros(tensor.size, flat.dtype)
    else:
        lowest = offset + sum((n - 1) * s for n, s in zip(tensor.size, tensor.stride) if s < 0)
        highest = offset + sum((n - 1) * s for n, s in zip(tensor.size, tensor.stride) if s > 0)
        if lowest < 0 or highest >= min(limit, flat.size):
            raise WeightFileError(f"{where}: a tensor of size {tensor.size} reads outside its storage "
                                  f"({storage.numel} elements)")
        strides = tuple(s * flat.itemsize for s in tensor.stride)
        array = np.lib.stride_tricks.as_strided(flat[offset:], tensor.size, strides).copy()
    if storage.kind.name == "BFloat16Storage":  # bfloat16 is the high half of a float32
        array = (array.astype(np.uint32) << 16).view(np.float32)
    return array


def _resolve(value, where: str):
    """The unpickled object with every tensor replaced by its ndarray (containers rebuilt)."""
    if isinstance(value, _Tensor):
        try:
            return _to_array(value, where)
        except (TypeError, ValueError, AttributeError) as e:  # fields overwritten by a crafted BUILD opcode
            raise WeightFileError(f"{where}: a tensor cannot be rebuilt ({type(e).__name__}: {e})") from None
    if isinstance(value, collections.OrderedDict):
        return collections.OrderedDict((k, _resolve(v, where)) for k, v in value.items())
    if isinstance(value, dict):
        return {k: _resolve(v, where) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, where) for v in value]
    if isinstance(value, tuple):
        return tuple(_resolve(v, where) for v in value)
    if isinstance(value, (_Storage, _StorageView, _StorageType)):
        raise WeightFileError(f"{where}: a bare storage outside a tensor is not supported")
    return value


def read_torch_checkpoint(path) -> object:
    """The object a torch.save file holds, with tensors as numpy arrays; never runs code from the file."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise WeightFileError(f"{path}: no such file")
    if zipfile.is_zipfile(path):
        root = _read_zip(path, path)
    else:
        with open(path, "rb") as f:
            data = f.read()
        if data[:1] != b"\x80":  # every pickle protocol >= 2 starts with PROTO
            raise WeightFileError(f"{path}: not a torch checkpoint (neither a zip archive nor a pickle)")
        root = _read_legacy(data, path)
    return _resolve(root, path)


def load_torch_state_dict(path) -> dict[str, np.ndarray]:
    """The {dotted name: ndarray} state dict in a torch checkpoint (e.g. torchvision's .pth files).

    A checkpoint that wraps its state dict as {"state_dict": ...} or {"model": ...} is unwrapped.
    Entries that are not tensors raise WeightFileError.
    """
    root = read_torch_checkpoint(path)
    for wrapper in ("state_dict", "model"):
        if isinstance(root, Mapping) and isinstance(root.get(wrapper), Mapping):
            root = root[wrapper]
    if not isinstance(root, Mapping):
        raise WeightFileError(f"{os.fspath(path)}: expected a state dict (a mapping of names to tensors), "
                              f"got {type(root).__name__}")
    bad = [k for k, v in root.items() if not isinstance(k, str) or not isinstance(v, np.ndarray)]
    if bad:
        raise WeightFileError(f"{os.fspath(path)}: state dict entries that are not named tensors: {bad[:5]}")
    return dict(root)
