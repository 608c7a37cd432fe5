"""`luminar onnx MODEL.onnx`: describe an ONNX model, or run it on .npy inputs.

    luminar onnx model.onnx                                  # inputs, outputs, op histogram
    luminar onnx model.onnx --input x=x.npy --out-dir out/   # run it: out/<output>.npy per output
    luminar onnx model.onnx --input x=x.npy --dim batch=1 --const sr=sr.npy --backend reference

Loading builds the whole graph, so an unsupported op or a bad file is reported before any run.
Outputs are written atomically (a temporary name, then a rename).
"""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import numpy as np

from ..errors import InputError, WeightFileError


def add_commands(commands) -> None:
    p = commands.add_parser("onnx", help="describe an ONNX model, or run it on .npy inputs",
                            description="Load an ONNX model as a luminar graph; print its inputs, outputs and op "
                                        "histogram, or run it with --input and write each output as a .npy file.")
    p.add_argument("model", metavar="MODEL.onnx", help="the ONNX model (external data next to it is read too)")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                   help="an input array (repeat for each input); with any --input the model is run")
    p.add_argument("--const", action="append", default=[], metavar="NAME=FILE.npy",
                   help="bind a graph input to a fixed value at load time (folded into the graph)")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                   help="fix a symbolic dim (dim_param) to a size at load time")
    p.add_argument("--out-dir", default=".", metavar="DIR", help="where outputs are written (default: .)")
    p.add_argument("--backend", default="cpu", choices=["cpu", "reference"], help="where to run (default: cpu)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(handler=run_command)


def _pairs(items, what: str) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise InputError(f"{what} must look like NAME=VALUE, got {item!r}")
        out[name] = value
    return out


def _read_npy(path: str, name: str) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise WeightFileError(f"input {name!r}: file {path!r} does not exist") from None
    except (ValueError, OSError) as e:
        raise WeightFileError(f"input {name!r}: {path!r} is not a readable .npy file ({e})") from None


def _save_atomic(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.save(f, array, allow_pickle=False)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def describe(model) -> str:
    opsets = ", ".join(f"{domain or 'ai.onnx'} {version}" for domain, version in sorted(model.opsets.items()))
    lines = [f"model {model.name}: opsets {opsets}", "inputs:"]
    lines += [f"  {info}" for info in model.inputs] or ["  (none)"]
    lines.append("outputs:")
    lines += [f"  {info}" for info in model.outputs]
    lines.append("ops:")
    lines += [f"  {count:6d}  {name}" for name, count in model.op_histogram.items()]
    lines.append(f"weights: {len(model.weights)} arrays, {sum(a.nbytes for a in model.weights.values()) / 1e6:.1f} MB")
    return "\n".join(lines)


def run_command(args, log) -> int:
    from . import load
    dims = {}
    for name, value in _pairs(args.dim, "--dim").items():
        if not value.isdigit():
            raise InputError(f"--dim {name}: the size must be a non-negative int, got {value!r}")
        dims[name] = int(value)
    constants = {name: _read_npy(path, name) for name, path in _pairs(args.const, "--const").items()}
    model = load(args.model, constants=constants, dims=dims)
    print(describe(model))
    if not args.input:
        return 0
    inputs = {name: _read_npy(path, name) for name, path in _pairs(args.input, "--input").items()}
    model.compile(args.backend)
    outputs = model(inputs)
    for name, array in outputs.items():
        path = Path(args.out_dir) / (re.sub(r"[^\w.-]", "_", name) + ".npy")
        _save_atomic(path, array)
        print(f"wrote {path}  {array.dtype} {list(array.shape)}")
    return 0
