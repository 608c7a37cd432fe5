"""llama.cpp as a peer in luminar's benchmarks: built once from source, run as `llama-bench`
(and `llama-server`, the serving peer of bench/serve.py).

    binary, why_not = llama_bench()        # the path, or None and the reason it cannot be had
    run_llama_bench(binary, "model.gguf", prompt=512, generate=128, threads=2)
    # {"prefill_tok_s": ..., "prefill_s": ..., "decode_tok_s": ...}
    server, why_not = llama_server()       # the same build's OpenAI-compatible server

The source is the llama.cpp that the llama-cpp-python sdist vendors (`pip download --no-deps
--no-binary :all: llama-cpp-python==VERSION`), built natively with cmake (-DGGML_NATIVE=ON, no
curl, no OpenSSL, no tests or examples; only the llama-bench or llama-server target) under a cache directory
outside the repository: $LUMINAR_PEERS, default ~/.cache/luminar-peers. A stamp file written
after the build and a smoke run of the binary marks it usable, so a half-finished build is
never used, and later runs start at once. The build takes minutes on two cores (run niced);
when it is impossible (no cmake or C++ compiler, no package index, a compile error) the caller
gets the reason and skips llama.cpp with that message.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

VERSION = "0.3.36"  # llama-cpp-python's sdist, which vendors llama.cpp
CMAKE_OPTIONS = ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
                 "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF"]


def peers_dir() -> Path:
    return Path(os.environ.get("LUMINAR_PEERS") or Path.home() / ".cache" / "luminar-peers")


def source_dir() -> Path:
    return peers_dir() / f"llama_cpp_python-{VERSION}" / "vendor" / "llama.cpp"


def _binary(target: str = "llama-bench") -> Path:
    return source_dir() / "build" / "bin" / target


def _stamp(target: str = "llama-bench") -> Path:
    return peers_dir() / f"{target}-{VERSION}.ok"


def llama_bench(build: bool = True, log=lambda message: None) -> tuple[Path | None, str]:
    """(path of a working llama-bench, "") or (None, why not). Builds it when `build` and needed."""
    return _tool("llama-bench", build, log)


def llama_server(build: bool = True, log=lambda message: None) -> tuple[Path | None, str]:
    """(path of a working llama-server, "") or (None, why not), as llama_bench."""
    return _tool("llama-server", build, log)


def _tool(target: str, build: bool, log) -> tuple[Path | None, str]:
    if _stamp(target).is_file() and _binary(target).is_file():
        return _binary(target), ""
    if not build:
        return None, f"{target} is not built yet (build it by running without --no-build; it goes to {peers_dir()})"
    missing = [tool for tool in ("cmake", "c++") if shutil.which(tool) is None]
    if missing:
        return None, f"cannot build llama.cpp: {' and '.join(missing)} not found (apt-get install cmake g++)"
    try:
        _build(log, target)
    except (OSError, subprocess.SubprocessError, RuntimeError, tarfile.TarError) as e:
        return None, f"cannot build llama.cpp {VERSION}: {e}"
    return _binary(target), ""


def _build(log, target: str = "llama-bench") -> None:
    root = peers_dir()
    root.mkdir(parents=True, exist_ok=True)
    build_log = root / "build.log"
    if not (source_dir() / "CMakeLists.txt").is_file():
        sdist = root / f"llama_cpp_python-{VERSION}.tar.gz"
        if not sdist.is_file():
            log(f"downloading the llama-cpp-python {VERSION} sdist (llama.cpp's source) into {root}...")
            _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                  f"llama-cpp-python=={VERSION}", "-d", str(root)], build_log, timeout=600)
        with tarfile.open(sdist) as archive:
            archive.extractall(root, filter="data")
    log(f"building {target} (cmake, niced, -j2; minutes; log in {build_log})...")
    build = source_dir() / "build"
    _run(["nice", "-n", "10", "cmake", "-S", str(source_dir()), "-B", str(build), *CMAKE_OPTIONS], build_log, 600)
    _run(["nice", "-n", "10", "cmake", "--build", str(build), "-j2", "--target", target], build_log, 3600)
    _run([str(_binary(target)), "--help"], build_log, 60)  # it starts: its shared libraries resolve
    temporary = _stamp(target).with_suffix(".tmp")
    temporary.write_text(f"llama.cpp from llama-cpp-python {VERSION}: {_binary(target)}\n")
    os.replace(temporary, _stamp(target))


def _run(command: list[str], log_file: Path, timeout: float) -> None:
    with open(log_file, "a") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        proc = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(command[:4])} ...` exited {proc.returncode} (see {log_file})")


def run_llama_bench(binary: Path, model: str, prompt: int, generate: int, threads: int,
                    repetitions: int = 1) -> dict:
    """One `llama-bench -p PROMPT -n GENERATE -t THREADS -r REPETITIONS -o json` on `model`: prefill
    of `prompt` tokens and decode of `generate` tokens from an empty context (llama-bench's own
    warm-up run first), as tokens/s and seconds.

    llama.cpp's default repacks weights for the CPU's extra buffer types (AMX on Intel Xeons with
    it). On a Sapphire Rapids-class Xeon (2026-12-02) that path crashed with SIGSEGV on every
    prompt of more than one token, while one-token decode ran -- and ran 2.3x faster than with
    `--repack 0`. A part that crashes in the default is measured again alone with `--repack 0`,
    so the peer is as fast as it can run here without crashing; `out["repack"]` says per part
    (prefill, decode) which mode the figure is from and `out["crash"]` what failed."""
    parts = {"prefill": (prompt, 0), "decode": (0, generate)}
    out, rows = {"repack": {}, "crash": ""}, _llama_bench_rows(binary, model, prompt, generate, threads, repetitions)
    if rows is None:  # crashed: each part alone, in the default first, else without the repack
        out["crash"] = f"llama-bench -p {prompt} -n {generate} -t {threads} (default repack) died of a signal"
        rows = []
        for part, (p, n) in parts.items():
            if not p and not n:
                continue
            found = _llama_bench_rows(binary, model, p, n, threads, repetitions)
            out["repack"][part] = found is not None
            if found is None:
                found = _llama_bench_rows(binary, model, p, n, threads, repetitions, ("--repack", "0"))
            if found is None:
                raise RuntimeError(f"llama-bench crashed on {model} ({part}) with and without --repack 0")
            rows += found
    else:
        out["repack"] = {"prefill": True, "decode": True}
    out.update(build=rows[0].get("build_commit", "?"), threads=rows[0].get("n_threads", threads))
    for row in rows:
        if row.get("n_prompt") and not row.get("n_gen"):
            out["prefill_tok_s"] = row["avg_ts"]
            out["prefill_s"] = row["avg_ns"] / 1e9
        elif row.get("n_gen") and not row.get("n_prompt"):
            out["decode_tok_s"] = row["avg_ts"]
    return out


def _llama_bench_rows(binary: Path, model: str, prompt: int, generate: int, threads: int, repetitions: int,
                      extra: tuple = ()) -> list[dict] | None:
    """llama-bench's JSON rows, or None when it died of a signal (a crash: run_llama_bench retries);
    another failure raises RuntimeError with its stderr."""
    env = dict(os.environ, LD_LIBRARY_PATH=str(binary.parent))
    proc = subprocess.run([str(binary), "-m", model, "-p", str(prompt), "-n", str(generate), "-t", str(threads),
                           "-r", str(repetitions), *extra, "-o", "json"], capture_output=True, text=True, env=env,
                          timeout=1800)
    if proc.returncode < 0:
        return None
    if proc.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({proc.returncode}) on {model}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout)
