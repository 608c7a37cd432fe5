"""Architectures from config.json, each checked against transformers on a small random model.

Every family luminar.models.load() reads from a Hugging Face directory -- Llama (with biases),
Mistral (sliding window), Qwen2 (sliding layers), Qwen3 (q/k norms), Phi-3 (fused projections),
Gemma, Gemma 2 (soft-capping, alternating windows), Gemma 3 (q/k norms, local RoPE base) -- is
built with transformers from a random config, saved with save_pretrained, loaded by luminar and
compared logit for logit. Windows are 4 tokens over an 11-token prompt, so they matter. Then
strict loading: a config field or a tensor that luminar would ignore is an error, never a
silently different model.
"""
import gc
import json
import shutil

import numpy as np
import pytest

from luminar.errors import UnsupportedError, WeightFileError
from luminar.models import load

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

BACKENDS = ["reference"] + (["cpu"] if shutil.which("gcc") or shutil.which("cc") else [])
IDS = np.array([3, 17, 99, 5, 64, 2, 7, 120, 33, 0, 127], np.int32)  # 11 tokens, as the repro
COMMON = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
              num_hidden_layers=2, vocab_size=128, max_position_embeddings=256)
GEMMA = dict(COMMON, head_dim=16, query_pre_attn_scalar=24, sliding_window=4)

ARCHS = {
    "llama-attention-bias": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
                             dict(COMMON, attention_bias=True, mlp_bias=True)),
    "mistral-sliding-window": (transformers.MistralConfig, transformers.MistralForCausalLM,
                               dict(COMMON, sliding_window=4)),
    "qwen2-sliding-layers": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
                             dict(COMMON, use_sliding_window=True, sliding_window=4, max_window_layers=1)),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, dict(COMMON, head_dim=24)),
    "phi3": (transformers.Phi3Config, transformers.Phi3ForCausalLM, dict(COMMON, pad_token_id=0)),
    "gemma": (transformers.GemmaConfig, transformers.GemmaForCausalLM, dict(COMMON, head_dim=16)),
    "gemma2": (transformers.Gemma2Config, transformers.Gemma2ForCausalLM,
               dict(GEMMA, attn_logit_softcapping=5.0, final_logit_softcapping=3.0)),
    "gemma3": (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM,
               dict(GEMMA, sliding_window_pattern=2, rope_local_base_freq=100.0)),
}


def _random_model(arch: str):
    """The transformers model, with weights large enough that mistakes show."""
    config_class, model_class, options = ARCHS[arch]
    model = model_class(config_class(**options))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 0.2 if "norm" in name else 0.15
            p.copy_((1.0 if "norm" in name else 0.0) + scale * torch.randn(p.shape, generator=generator))
    return model.eval()


_saved = {}


def _saved_model(arch: str, tmp_path_factory):
    """(directory, transformers model) of one architecture saved with save_pretrained, once."""
    if arch not in _saved:
        model = _random_model(arch)
        directory = tmp_path_factory.mktemp(arch)
        model.save_pretrained(directory)
        _saved[arch] = directory, model
    return _saved[arch]


@pytest.fixture(scope="module", params=list(ARCHS))
def saved(request, tmp_path_factory):
    return _saved_model(request.param, tmp_path_factory)


def _reference_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor(ids[None]).long()).logits[0].numpy()


# every architecture on the reference backend; the cpu backend compiles C (seconds per model),
# so it runs the two models with the most new paths (sliding windows, q/k norms, Gemma's norms)
CASES = [(arch, "reference") for arch in ARCHS] + \
    [(arch, "cpu") for arch in ("mistral-sliding-window", "gemma3") if "cpu" in BACKENDS]


@pytest.mark.parametrize("arch, backend", CASES)
def test_architecture_matches_transformers(arch, backend, tmp_path_factory):
    directory, reference = _saved_model(arch, tmp_path_factory)
    model = load(directory, backend=backend)
    ours, theirs = model.logits(IDS), _reference_logits(reference, IDS)
    np.testing.assert_allclose(ours, theirs, atol=2e-4, rtol=0)
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()


def test_decoding_through_the_cache_equals_the_full_prompt(saved):
    """Prefill a chunk, then one token at a time: sliding-window layers see only the window from
    their bounded cache, and the logits equal transformers' over the whole prompt."""
    directory, reference = saved
    model = load(directory, backend="reference")
    theirs = _reference_logits(reference, IDS)
    cache = model.new_cache(capacity=2)
    np.testing.assert_allclose(model.forward(IDS[:6], cache, last_only=False), theirs[:6], atol=2e-4, rtol=0)
    for i in range(6, len(IDS)):
        np.testing.assert_allclose(model.forward(IDS[i:i + 1], cache)[-1], theirs[i], atol=2e-4, rtol=0)
    assert cache.tokens == len(IDS)
    if model.config.has_sliding:
        assert cache.inputs()["k_local"].shape[0] == model.config.sliding_window  # held: window - 1, + dummy


def test_the_sliding_window_cache_stays_bounded():
    """30 decode steps through a 4-token window: the local cache holds 3 tokens, in a buffer that
    never grows, and the logits still follow transformers."""
    reference = _random_model("mistral-sliding-window")
    ids = np.random.default_rng(0).integers(0, 128, 40).astype(np.int32)
    with torch.no_grad():
        theirs = reference(torch.tensor(ids[None]).long()).logits[0].numpy()
    import tempfile
    with tempfile.TemporaryDirectory() as directory:
        reference.save_pretrained(directory)
        model = load(directory, backend="reference")
    cache = model.new_cache()
    buffer = cache.k_local
    model.forward(ids[:10], cache)
    for i in range(10, len(ids)):
        np.testing.assert_allclose(model.forward(ids[i:i + 1], cache)[-1], theirs[i], atol=2e-4, rtol=0)
        assert cache.k_local is buffer and cache.held == 3
    assert cache.k is None  # no full-attention layer, no growing cache


# -- strict loading -------------------------------------------------------------------------------
def _copy_with(saved, tmp_path, config_change=None, tensors_change=None):
    directory, _ = saved
    config = json.loads((directory / "config.json").read_text())
    if config_change:
        config_change(config)
    (tmp_path / "config.json").write_text(json.dumps(config))
    tensors = safetensors_numpy.load_file(directory / "model.safetensors")
    if tensors_change:
        tensors_change(tensors)
    safetensors_numpy.save_file(tensors, tmp_path / "model.safetensors")
    return tmp_path


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    model = _random_model("llama-attention-bias")
    directory = tmp_path_factory.mktemp("llama")
    model.save_pretrained(directory)
    return directory, model


@pytest.mark.parametrize("field, value, message", [
    ("model_type", "falcon", "architecture 'falcon' is not supported"),
    ("hidden_act", "relu", "hidden activation 'relu'"),
    ("rope_parameters", {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}, "rope scaling 'yarn'"),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}, "partial_rotary"),
    ("num_experts", 8, "field 'num_experts'"),
    ("layer_types", ["chunked_attention", "full_attention"], "layer type 'chunked_attention'"),
])
def test_a_config_field_luminar_would_ignore_is_refused(llama, tmp_path, field, value, message):
    directory = _copy_with(llama, tmp_path, lambda c: c.update({field: value}))
    with pytest.raises(UnsupportedError, match=message):
        load(directory, backend="reference")


def test_a_checkpoint_tensor_the_model_does_not_use_is_refused(llama, tmp_path):
    """As the issue's repro: biases in a checkpoint whose config says attention_bias=false."""
    def no_bias(config):
        config["attention_bias"] = False
    with pytest.raises(WeightFileError, match="does not use.*self_attn.*bias"):
        load(_copy_with(llama, tmp_path, no_bias), backend="reference")


def test_an_unknown_extra_tensor_is_refused(llama, tmp_path):
    def extra(tensors):
        tensors["model.layers.0.self_attn.rel_pos.weight"] = np.zeros(4, np.float32)
    with pytest.raises(WeightFileError, match="rel_pos"):
        load(_copy_with(llama, tmp_path, tensors_change=extra), backend="reference")


def test_a_null_or_false_unknown_field_is_accepted(llama, tmp_path):
    directory = _copy_with(llama, tmp_path, lambda c: c.update(some_future_feature=None, another_one=False))
    model = load(directory, backend="reference")
    np.testing.assert_allclose(model.logits(IDS), _reference_logits(llama[1], IDS), atol=2e-4, rtol=0)


def test_a_tied_model_with_its_own_lm_head_is_refused(llama, tmp_path):
    """tie_word_embeddings=true and an lm_head.weight that differs from the embeddings: one of
    the two would be ignored, so loading stops and names it."""
    def tie(config):
        config["tie_word_embeddings"] = True
    with pytest.raises(WeightFileError, match="lm_head.weight"):
        load(_copy_with(llama, tmp_path, tie), backend="reference")


def test_a_load_leaves_the_objects_it_made_to_the_oldest_garbage_generation(llama):
    """A load ends with a full garbage collection: the graph, kernels and expressions it made
    (hundreds of thousands of objects for SmolLM2) are then old, so the collections during
    generation scan only what generation makes. Left young, they were scanned by the first
    one: a 230 ms decode step of int8 SmolLM2."""
    model = load(llama[0])
    young = len(gc.get_objects(0)) + len(gc.get_objects(1))
    assert young < 1000, f"{young} objects in the young generations after load"
    assert model.logits(IDS).shape == (len(IDS), model.config.vocab_size)
