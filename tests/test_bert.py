"""BERT sentence embeddings against transformers' BertModel (+ sentence-transformers' pooling) and the embed command."""
import json

import numpy as np
import pytest
import torch
import transformers

import luminar as lm
from luminar.backends.cpu import cc
from luminar.errors import InputError, ValueDomainError, WeightFileError
from luminar.models.bert import BertConfig, build_graph, default_model_directory, load_embedder

FOOD, BREAD = "A man is eating food.", "A man is eating a piece of bread."
TEXTS = [FOOD, BREAD, "The girl is carrying a baby.", "Ein Mann isst Brot — très bien, ça! 東京", "ok",
         "A monkey is playing drums. " * 80]  # the last is ~480 tokens: truncated to 256


def reference_embeddings(model, ids, mask):
    """transformers' BertModel, then sentence-transformers' mean pooling and L2 normalization."""
    with torch.no_grad():
        tokens = model(input_ids=torch.from_numpy(ids).long(), attention_mask=torch.from_numpy(mask)).last_hidden_state
        weights = torch.from_numpy(mask).unsqueeze(-1)
        mean = (tokens * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(mean, dim=-1).numpy()


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_small_random_bert_matches_transformers(backend):
    torch.manual_seed(0)
    hf = transformers.BertConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                 intermediate_size=48, max_position_embeddings=24, hidden_act="gelu")
    model = transformers.BertModel(hf).eval()
    config = BertConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=48, max_position_embeddings=24, layer_norm_eps=hf.layer_norm_eps)
    graph, arrays = build_graph(config, {k: v.numpy() for k, v in model.state_dict().items()})
    program = graph.compile(backend).set_inputs(arrays)
    rng = np.random.default_rng(0)
    for batch, length in [(3, 7), (1, 24), (2, 1)]:  # one program: b and s are symbolic
        ids = rng.integers(1, 97, (batch, length)).astype(np.int32)
        mask = np.ones((batch, length), np.float32)
        mask[0, max(1, length // 2):] = 0.0  # the first row is padded
        ids[mask == 0] = 0
        ours = program(input_ids=ids, attention_mask=mask)["embeddings"]
        np.testing.assert_allclose(ours, reference_embeddings(model, ids, mask), rtol=1e-4, atol=2e-5)


def test_missing_or_misshapen_weights():
    config = BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=16, max_position_embeddings=8)
    with pytest.raises(WeightFileError, match="missing tensor 'embeddings.word_embeddings.weight'"):
        build_graph(config, {})
    with pytest.raises(WeightFileError, match="has shape"):
        build_graph(config, {"embeddings.word_embeddings.weight": np.zeros((10, 9), np.float32)})


@pytest.fixture(scope="module")
def embedder():
    return load_embedder()


@pytest.fixture(scope="module")
def minilm_embeddings(embedder):
    """TEXTS encoded once (batches of 2: the long text is padded with only one other)."""
    return embedder.encode(TEXTS, batch_size=2)


@pytest.fixture(scope="module")
def hf_model():
    return transformers.BertModel.from_pretrained(default_model_directory()).eval()


@pytest.mark.slow
def test_minilm_matches_transformers(embedder, hf_model, minilm_embeddings):
    assert embedder.config.max_seq_length == 256  # sentence_bert_config.json
    tokenizer = transformers.AutoTokenizer.from_pretrained(default_model_directory())
    batch = tokenizer(TEXTS, padding=True, truncation=True, max_length=256, return_tensors="np")
    ids, mask = batch["input_ids"].astype(np.int32), batch["attention_mask"].astype(np.float32)
    assert ids.shape[1] == 256  # the long text was cut, as sentence-transformers cuts it
    assert [len(t) for t in embedder.tokenize(TEXTS)] == mask.sum(1).astype(int).tolist()
    expected = reference_embeddings(hf_model, ids, mask)
    ours = minilm_embeddings
    assert ours.shape == (len(TEXTS), 384) and ours.dtype == np.float32
    cosines = (ours * expected).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(expected, axis=1)
    assert cosines.min() >= 0.9999, cosines
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, rtol=1e-5)
    reference_similarity = float(expected[0] @ expected[1])
    assert abs(reference_similarity - 0.755) < 0.005
    assert abs(float(embedder.similarity(FOOD, [BREAD])[0]) - reference_similarity) < 1e-4


@pytest.mark.slow
def test_minilm_matches_sentence_transformers(minilm_embeddings):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    model = sentence_transformers.SentenceTransformer(default_model_directory(), device="cpu")
    expected = model.encode(TEXTS, convert_to_numpy=True)
    ours = minilm_embeddings
    cosines = (ours * expected).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(expected, axis=1)
    assert cosines.min() >= 0.9999, cosines


@pytest.mark.slow
def test_batches_do_not_recompile(embedder, monkeypatch):
    builds, compiles = [], []
    original_build, original_compile = cc.build_many, lm.Graph.compile
    monkeypatch.setattr(cc, "build_many", lambda sources: builds.append(len(sources)) or original_build(sources))
    monkeypatch.setattr(lm.Graph, "compile", lambda self, *a, **k: compiles.append(1) or original_compile(self, *a, **k))
    one_by_one = np.concatenate([embedder.encode([text]) for text in TEXTS[:5]])
    together = embedder.encode(TEXTS[:5], batch_size=3)
    assert builds == [] and compiles == []  # five lengths, batches of 1, 3 and 2: one program
    np.testing.assert_allclose(one_by_one, together, rtol=0, atol=1e-5)  # padding changes nothing


@pytest.mark.slow
def test_long_text_and_bad_input(embedder):
    with pytest.raises(InputError, match="max_seq_length 256"):
        embedder.encode(TEXTS, truncate=False)
    assert embedder.encode(TEXTS[:2], truncate=False).shape == (2, 384)
    with pytest.raises(InputError, match="list of strings"):
        embedder.encode("a single string")
    with pytest.raises(InputError, match="list of strings"):
        embedder.encode(["fine", 3])
    with pytest.raises(ValueDomainError, match="batch_size"):
        embedder.encode(["x"], batch_size=0)
    assert embedder.encode([]).shape == (0, 384)
    assert np.all(np.isfinite(embedder.encode([""])))  # [CLS] [SEP] only


@pytest.mark.slow
def test_embed_command(embedder, capsys):
    from luminar.cli import main
    assert main(["embed", FOOD, BREAD, "--quiet"]) == 0
    vectors = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(vectors) == 2 and len(vectors[0]) == 384
    np.testing.assert_allclose(np.array(vectors, np.float32), embedder.encode([FOOD, BREAD]), rtol=0, atol=1e-6)
    assert main(["embed", "--similarity", FOOD, BREAD, "The girl is carrying a baby.", "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0].startswith("0.75") and lines[0].endswith(BREAD)
    assert main(["embed", "--similarity", FOOD, "--quiet"]) == 1
    assert "at least one other" in capsys.readouterr().err


def test_a_tensor_the_model_does_not_use_is_refused():
    """Like torch's strict load_state_dict: an extra tensor (here a second pooler-like head under
    another name) is an error, not silently dropped; the pooler and position_ids are known unused."""
    torch.manual_seed(0)
    hf = transformers.BertConfig(vocab_size=31, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=24, max_position_embeddings=8)
    weights = {k: v.numpy() for k, v in transformers.BertModel(hf).state_dict().items()}
    config = BertConfig(vocab_size=31, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=24, max_position_embeddings=8)
    build_graph(config, weights)  # pooler.* and embeddings.position_ids are there and allowed
    with pytest.raises(WeightFileError, match="does not use, e.g. 'classifier.weight'"):
        build_graph(config, {**weights, "classifier.weight": np.zeros((2, 16), np.float32)})
