"""One file holding a compiled-ready model: `luminar export MODEL -o FILE`, `luminar.load_artifact(FILE)`.

An artifact is everything needed to rebuild and compile a language model without the code that
built its graph (models/llama.py's builder): the primitive graphs, the weights exactly as stored
(quantized GGUF blocks stay quantized), the tokenizer with its chat template, and the tuning
cache entries the search compiler chose on the machine that exported it.

File layout, format version 1 (all integers little-endian):

    offset 0   8 bytes   magic b"LUMINAR\\x01"
           8   u32       format version (1)
          12   u32       reserved, 0
          16   u64       header length H
          24   32 bytes  sha256 of the header
          56   H bytes   header: UTF-8 JSON (below)
               ...       zero padding to a multiple of 64
          D    ...       tensor data; tensor i is at D + offset_i, each offset a multiple of 64

    header = {"format_version": 1, "luminar": "0.1.0",
              "model": {"kind": "llama", "config": {LlamaConfig fields}},
              "graphs": {"step": graph, "batched": graph},      # serve/graph_format.py; "batched" is
                                                                 # absent for sliding-window models
              "tensors": {input name: {"dtype": storage dtype, "shape": [...], "offset": int,
                                       "nbytes": int, "sha256": hex}},   # the graphs' fixed inputs
              "tokenizer": {"json": tokenizer.json text, "bos_id", "eos_id", "add_bos", "chat_template"}
                           or null,
              "tuning": {tuning-cache key: entry}}

"step" is the prefill/decode graph of LlamaModel, "batched" the decode graph for continuous
batching (models/batched.py). Reading checks the magic, the version (a newer one is refused by
name), the header's and every tensor's sha256, every offset against the file's size, and the
graphs' structure: a corrupt, truncated or hostile file is a WeightFileError, never a crash or
a half-loaded model. Writing goes to a temporary file in the same directory, renamed over the
target when complete, so a failed or interrupted export leaves no half file.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import struct
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import dtypes
from ..errors import LuminarError, WeightFileError
from ..graph import Graph
from .graph_format import graph_from_json, graph_to_json

MAGIC = b"LUMINAR\x01"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<8sIIQ32s")  # magic, version, reserved, header length, header sha256
_ALIGN = 64
_MAX_HEADER = 1 << 30
_TUNING_KEY = re.compile(r"[0-9a-f]{32}")  # search.tuning_key's shape: also keeps paths inside the cache


@dataclass
class ModelBundle:
    """A language model as data: its graphs, their fixed inputs, tokenizer and tuning entries."""
    config: object  # LlamaConfig
    graphs: dict[str, Graph]  # "step" (prefill/decode) and, when the model can batch, "batched"
    arrays: dict[str, np.ndarray]  # fixed inputs by name: weights as stored, RoPE frequencies
    tokenizer: object | None = None  # io.tokenizer.Tokenizer
    tuning: dict[str, dict] = field(default_factory=dict)  # tuning-cache key -> entry

    def fixed_inputs(self, graph: str) -> dict[str, np.ndarray]:
        return {name: array for name, array in self.arrays.items() if name in self.graphs[graph].inputs}

    def model(self, backend: str = "cpu", progress: Callable[[str], None] | None = None, **compile_options):
        """The compiled LlamaModel (logits, generate, chat) of the "step" graph."""
        from ..models.llama import LlamaModel
        return LlamaModel.from_graph(self.config, self.graphs["step"], self.fixed_inputs("step"), self.tokenizer,
                                     backend=backend, progress=progress, **compile_options)


def bundle_from_model(path=None, progress: Callable[[str], None] | None = None) -> ModelBundle:
    """Read a model (a GGUF file, a Hugging Face directory or a name, as models.load takes) and
    build its graphs with the model code."""
    from ..models import relaxed_collector, _read_gguf, _read_hf_directory, resolve
    from ..models.batched import build_batched_graph
    from ..models.llama import build_graph, rope_inputs
    say = progress or (lambda message: None)
    path = resolve(path)
    if not os.path.exists(path):
        raise WeightFileError(f"{path}: no such file or directory")
    say(f"reading {path}")
    with relaxed_collector():
        config, weights, tokenizer = (_read_hf_directory if os.path.isdir(path) else _read_gguf)(path)
        graphs = {"step": build_graph(config, weights)}
        if not config.has_sliding:
            graphs["batched"] = build_batched_graph(config, weights)  # the same Weights: shared input names
        weights.check_all_used()
    arrays = {**weights.arrays, **rope_inputs(config, weights, graphs["step"])}
    say(f"built {', '.join(f'{name} ({len(g.nodes):,} nodes)' for name, g in graphs.items())}")
    return ModelBundle(config, graphs, arrays, tokenizer)


@contextlib.contextmanager
def recording_tuning():
    """Collect the tuning-cache entries that compiles inside the block read or write: the
    search's choices for these graphs on this machine (a dict, filled on exit)."""
    from ..compiler import search
    used: set[str] = set()
    load, store = search.load_tuning, search.store_tuning

    def recording_load(target, key, *args, **kwargs):
        used.add(key)
        return load(target, key, *args, **kwargs)

    def recording_store(target, key, choice):
        used.add(key)
        return store(target, key, choice)

    entries: dict[str, dict] = {}
    search.load_tuning, search.store_tuning = recording_load, recording_store
    try:
        yield entries
    finally:
        search.load_tuning, search.store_tuning = load, store
        for key in sorted(used):
            with contextlib.suppress(OSError, ValueError):
                entries[key] = json.loads(search.tuning_path(key).read_text())


# -- writing ---------------------------------------------------------------------------------------
def write_artifact(bundle: ModelBundle, path) -> Path:
    """Write `bundle` to `path` (atomically: a temporary file renamed over it). Returns the path."""
    import luminar
    path = Path(path)
    tensors, blobs, offset = {}, [], 0
    for name in sorted(bundle.arrays):
        array = np.ascontiguousarray(bundle.arrays[name])
        data = array.tobytes()
        tensors[name] = {"dtype": _dtype_name(array, name), "shape": list(array.shape), "offset": offset,
                         "nbytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        blobs.append(data)
        offset += _padded(len(data))
    header = {"format_version": FORMAT_VERSION, "luminar": luminar.__version__,
              "model": {"kind": "llama", "config": dataclasses.asdict(bundle.config)},
              "graphs": {name: graph_to_json(g) for name, g in bundle.graphs.items()},
              "tensors": tensors, "tokenizer": _tokenizer_to_json(bundle.tokenizer), "tuning": bundle.tuning}
    text = json.dumps(header, separators=(",", ":"), allow_nan=False).encode()
    prefix = _PREFIX.pack(MAGIC, FORMAT_VERSION, 0, len(text), hashlib.sha256(text).digest())
    head = prefix + text
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False)
    try:
        with temporary as out:
            out.write(head + bytes(_padded(len(head)) - len(head)))
            for data in blobs:
                out.write(data + bytes(_padded(len(data)) - len(data)))
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary.name, 0o666 & ~_umask())  # a temporary file is private; the artifact is not
        os.replace(temporary.name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary.name)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _dtype_name(array: np.ndarray, name: str) -> str:
    for storage, numpy_dtype in dtypes.STORAGE.items():
        if array.dtype == numpy_dtype and storage != dtypes.bfloat16:
            return storage
    raise WeightFileError(f"export: input {name!r} has dtype {array.dtype}, which an artifact does not store")


def _padded(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _tokenizer_to_json(tokenizer) -> dict | None:
    if tokenizer is None:
        return None
    return {"json": tokenizer.backend.to_str(), "bos_id": tokenizer.bos_id, "eos_id": tokenizer.eos_id,
            "add_bos": tokenizer.add_bos, "chat_template": tokenizer.chat_template}


# -- reading ---------------------------------------------------------------------------------------
def is_artifact(path) -> bool:
    """Whether `path` is a file that starts with the artifact magic."""
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def read_artifact(path) -> ModelBundle:
    """The ModelBundle stored in `path`; WeightFileError if it is missing, corrupt, truncated or of
    a newer format version."""
    from ..models.llama import LlamaConfig
    where = os.fspath(path)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise WeightFileError(f"{where}: cannot read the artifact ({e.strerror or e})") from None
    if len(raw) < _PREFIX.size or raw[:len(MAGIC)] != MAGIC:
        raise WeightFileError(f"{where}: not a luminar artifact (no {MAGIC!r} magic at its start)")
    _, version, _, length, digest = _PREFIX.unpack_from(raw)
    if version > FORMAT_VERSION:
        raise WeightFileError(f"{where}: artifact format version {version} is newer than this luminar reads "
                              f"(up to {FORMAT_VERSION}); upgrade luminar or export the model again")
    if version < 1:
        raise WeightFileError(f"{where}: artifact format version {version} does not exist")
    if length > min(_MAX_HEADER, len(raw) - _PREFIX.size):
        raise WeightFileError(f"{where}: truncated: the header says {length} bytes, the file has "
                              f"{len(raw) - _PREFIX.size} after the prefix")
    text = raw[_PREFIX.size:_PREFIX.size + length]
    if hashlib.sha256(text).digest() != digest:
        raise WeightFileError(f"{where}: corrupt: the header's checksum does not match")
    try:
        header = json.loads(text)
        unknown = sorted(set(header) - _HEADER_FIELDS)
        if unknown:
            raise WeightFileError(f"{where}: header field {unknown[0]!r} is unknown to this luminar")
        data_start = _padded(_PREFIX.size + length)
        arrays = _tensors(raw, data_start, header["tensors"], where)
        config = _config(LlamaConfig, header["model"], where)
        graphs = {name: graph_from_json(g, f"{where}: graph {name!r}") for name, g in header["graphs"].items()}
        if "step" not in graphs:
            raise WeightFileError(f"{where}: the artifact has no 'step' graph")
        for name, g in graphs.items():
            missing = sorted(n for n in g.inputs if n not in arrays and n not in _CALL_INPUTS)
            if missing:
                raise WeightFileError(f"{where}: graph {name!r} input {missing[0]!r} has no stored tensor")
        unused = sorted(set(arrays) - {n for g in graphs.values() for n in g.inputs})
        if unused:  # (as a strict load_state_dict: a tensor no graph reads is refused, not dropped)
            raise WeightFileError(f"{where}: stored tensor {unused[0]!r} is an input of no graph")
        tokenizer = _tokenizer_from_json(header["tokenizer"], where)
        tuning = _tuning(header.get("tuning") or {}, where)
    except LuminarError:
        raise
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, RecursionError) as e:
        raise WeightFileError(f"{where}: malformed artifact header ({type(e).__name__}: {e})") from None
    return ModelBundle(config, graphs, arrays, tokenizer, tuning)


_HEADER_FIELDS = {"format_version", "luminar", "model", "graphs", "tensors", "tokenizer", "tuning"}

# inputs given at each call, not stored: the new tokens and the KV caches of both graphs
_CALL_INPUTS = {"tokens", "k_cache", "v_cache", "k_local", "v_local", "seen", "k_slots", "v_slots"}


def _tensors(raw: bytes, start: int, table: dict, where: str) -> dict[str, np.ndarray]:
    arrays = {}
    for name, t in table.items():
        dtype = dtypes.STORAGE[dtypes.normalize(t["dtype"])]
        shape = tuple(t["shape"])
        offset, nbytes = t["offset"], t["nbytes"]
        if not all(type(v) is int and v >= 0 for v in (offset, nbytes, *shape)) or offset % _ALIGN:
            raise WeightFileError(f"{where}: tensor {name!r} has an invalid offset, size or shape")
        if nbytes != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
            raise WeightFileError(f"{where}: tensor {name!r}: {nbytes} bytes do not hold {shape} of {dtype}")
        if start + offset + nbytes > len(raw):
            raise WeightFileError(f"{where}: truncated: tensor {name!r} ends at byte {start + offset + nbytes}, "
                                  f"the file has {len(raw)}")
        view = memoryview(raw)[start + offset:start + offset + nbytes]
        if hashlib.sha256(view).hexdigest() != t["sha256"]:
            raise WeightFileError(f"{where}: corrupt: tensor {name!r} does not match its checksum")
        arrays[name] = np.frombuffer(raw, dtype, count=nbytes // dtype.itemsize, offset=start + offset).reshape(shape)
    return arrays


def _config(cls, model: dict, where: str):
    if model.get("kind") != "llama":
        raise WeightFileError(f"{where}: model kind {model.get('kind')!r} is not one luminar loads (llama)")
    fields = dict(model["config"])
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise WeightFileError(f"{where}: model config field {unknown[0]!r} is unknown to this luminar")
    for f in dataclasses.fields(cls):  # the types the annotations name: a hostile config is refused here
        if f.name not in fields:
            continue
        value, allowed = fields[f.name], _CONFIG_TYPES[f.type]
        if isinstance(value, list) and tuple in allowed and all(isinstance(v, str) for v in value):
            value = fields[f.name] = tuple(value)
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            raise WeightFileError(f"{where}: model config field {f.name} must be {f.type}, got {value!r}")
    return cls(**fields)


_CONFIG_TYPES = {"int": (int,), "float": (float, int), "bool": (bool,), "str": (str,), "dict | None": (dict, type(None)),
                 "float | None": (float, int, type(None)), "int | None": (int, type(None)),
                 "tuple[str, ...] | None": (tuple, type(None))}


def _tokenizer_from_json(data, where: str):
    if data is None:
        return None
    from ..io.tokenizer import Tokenizer, _tokenizers
    try:
        backend = _tokenizers().Tokenizer.from_str(data["json"])
    except Exception as e:  # tokenizers raises a bare Exception on malformed JSON
        raise WeightFileError(f"{where}: the stored tokenizer is not valid ({e})") from None
    return Tokenizer(backend, bos_id=data["bos_id"], eos_id=data["eos_id"], add_bos=bool(data["add_bos"]),
                     chat_template=data["chat_template"], source=where)


def _tuning(entries: dict, where: str) -> dict[str, dict]:
    for key, entry in entries.items():
        if not _TUNING_KEY.fullmatch(key) or not isinstance(entry, dict):
            raise WeightFileError(f"{where}: tuning entry {key!r} is not a tuning-cache key and object")
    return entries


def install_tuning(entries: dict[str, dict]) -> int:
    """Put the artifact's tuning entries into this machine's cache where it has none of its own
    (an entry's key names the machine and compiler it was measured with, so on another machine
    the entries are simply never looked up). Returns how many were added."""
    from ..compiler.search import tuning_path
    added = 0
    for key, entry in entries.items():
        target = tuning_path(key)
        if target.exists():
            continue
        with tempfile.NamedTemporaryFile("w", dir=target.parent, suffix=".tmp", delete=False) as f:
            json.dump(entry, f)
        os.replace(f.name, target)
        added += 1
    return added


def search_dims(graph: Graph) -> dict:
    """The shape buckets the search times for a model graph: models.llama.SEARCH_BUCKETS for the
    step graph, models.batched.BATCH_SEARCH_DIMS for the batched one."""
    from ..models.batched import BATCH_SEARCH_DIMS
    from ..models.llama import SEARCH_BUCKETS
    buckets = BATCH_SEARCH_DIMS if "k_slots" in graph.inputs else SEARCH_BUCKETS
    return {d: v for d, v in buckets.items() if d in graph.dims()}


def load_artifact(path, backend: str = "cpu", progress: Callable[[str], None] | None = None, **compile_options):
    """Read an artifact written by `luminar export` and compile its model: a LlamaModel
    (logits, generate, chat), rebuilt from the stored graph without the model code."""
    say = progress or (lambda message: None)
    started = time.perf_counter()
    bundle = read_artifact(path)
    added = install_tuning(bundle.tuning)
    say(f"read {path} in {time.perf_counter() - started:.1f} s ({len(bundle.arrays)} tensors, "
        f"{added} tuning entries added to the cache)")
    from ..models import relaxed_collector
    with relaxed_collector():  # (as models.load: compiling is not rescanned, generation is not paused)
        return bundle.model(backend, progress=say, **compile_options)


def export(model=None, path="model.luminar", progress: Callable[[str], None] | None = None,
           search: bool | float | None = None) -> Path:
    """Export `model` (anything models.load takes) to an artifact at `path`. With `search`, the
    graphs are compiled with the search compiler first and its choices go into the artifact."""
    say = progress or (lambda message: None)
    bundle = bundle_from_model(model, progress=say)
    if search:
        with recording_tuning() as entries:
            for name, graph in bundle.graphs.items():
                say(f"compiling {name} with search to record its tuning...")
                graph.compile("cpu", search=search, search_dims=search_dims(graph))
        bundle.tuning = entries
    written = write_artifact(bundle, path)
    say(f"wrote {written} ({written.stat().st_size / 2**20:.1f} MiB)")
    return written
