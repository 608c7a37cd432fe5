"""luminar.nn modules against torch.nn: torch's state_dict loads into ours and gives torch's outputs."""
import numpy as np
import pytest
import torch

import luminar as lm
import luminar.nn as nn
from luminar.nn.dropout import P, STREAM_STEP, _ROUND_CONSTANTS, hash_of_index, random_integers
from luminar.shape import index_var
from conftest import rand


def build(module, *shapes, dtypes=None, **kwargs):
    """A graph applying `module` to inputs x0, x1, ... of `shapes`; returns (graph, outputs)."""
    g = lm.Graph()
    dtypes = dtypes or ["float32"] * len(shapes)
    inputs = [g.tensor(f"x{k}", shape, dtype) for k, (shape, dtype) in enumerate(zip(shapes, dtypes))]
    result = module(*inputs, **kwargs)
    outputs = [r for r in (result if isinstance(result, tuple) else (result,)) if r is not None]
    for k, r in enumerate(outputs):
        r.output(f"y{k}")
    return g, outputs


def run(module, *arrays, backend="reference", symbolic=None, **kwargs):
    """Apply `module` in a graph to `arrays` (symbolic: {position: shape with names}); return its outputs."""
    shapes = [symbolic.get(k, a.shape) if symbolic else a.shape for k, a in enumerate(arrays)]
    g, outputs = build(module, *shapes, dtypes=[a.dtype.name for a in arrays], **kwargs)
    program = g.compile(backend).set_inputs(module.inputs(g))
    out = program(**{f"x{k}": a for k, a in enumerate(arrays)})
    return [out[f"y{k}"] for k in range(len(outputs))]


def torch_outputs(module, *arrays, **kwargs):
    tensors = [torch.from_numpy(a).long() if a.dtype == np.int32 else torch.from_numpy(a) for a in arrays]
    with torch.no_grad():
        result = module(*tensors, **kwargs)
    return [r.numpy() for r in (result if isinstance(result, tuple) else (result,)) if r is not None]


def assert_matches_torch(ours, theirs, *arrays, backend="reference", our_kwargs=None, torch_kwargs=None,
                         rtol=1e-5, atol=1e-5, symbolic=None):
    """Load theirs' state_dict into ours, run both on `arrays`, compare every output."""
    ours.load_state_dict(theirs.state_dict())
    got = run(ours, *arrays, backend=backend, symbolic=symbolic, **(our_kwargs or {}))
    expected = torch_outputs(theirs, *arrays, **(torch_kwargs or {}))
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


def randomized(module):
    """A torch module with every parameter and buffer randomized (so loading is really tested)."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, tensor in module.state_dict().items():
            if tensor.is_floating_point():
                tensor.copy_(torch.rand(tensor.shape, generator=generator) + 0.5 if "var" in name
                             else torch.randn(tensor.shape, generator=generator) * 0.5)
    return module


# -- state dicts ---------------------------------------------------------------------------------------
PAIRS = {  # name: (ours, torch's)
    "Linear": (lambda: nn.Linear(5, 3), lambda: torch.nn.Linear(5, 3)),
    "Linear(bias=False)": (lambda: nn.Linear(5, 3, bias=False), lambda: torch.nn.Linear(5, 3, bias=False)),
    "Conv2d": (lambda: nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2),
               lambda: torch.nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2)),
    "BatchNorm2d": (lambda: nn.BatchNorm2d(4), lambda: torch.nn.BatchNorm2d(4)),
    "LayerNorm": (lambda: nn.LayerNorm((3, 4)), lambda: torch.nn.LayerNorm((3, 4))),
    "Embedding": (lambda: nn.Embedding(10, 4, padding_idx=0), lambda: torch.nn.Embedding(10, 4, padding_idx=0)),
    "MultiheadAttention": (lambda: nn.MultiheadAttention(8, 2, batch_first=True),
                           lambda: torch.nn.MultiheadAttention(8, 2, batch_first=True)),
    "TransformerEncoderLayer": (lambda: nn.TransformerEncoderLayer(8, 2, 16, batch_first=True),
                                lambda: torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)),
    "Sequential": (lambda: nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2)),
                   lambda: torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2))),
    "CrossEntropyLoss(weight)": (lambda: nn.CrossEntropyLoss(weight=np.ones(3)),
                                 lambda: torch.nn.CrossEntropyLoss(weight=torch.ones(3))),
}


@pytest.mark.parametrize("name", PAIRS)
def test_state_dict_has_torch_names_and_shapes(name):
    ours, theirs = (make() for make in PAIRS[name])
    expected = {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
    assert {k: v.shape for k, v in ours.state_dict().items()} == expected
    assert [k for k, _ in ours.named_parameters()] == [k for k, _ in theirs.named_parameters()]


def test_state_dict_round_trips_and_returns_copies():
    model = nn.Sequential(nn.Linear(3, 4, rng=1), nn.BatchNorm2d(4))
    state = model.state_dict()
    state["0.weight"][:] = 7.0
    assert not np.any(model[0].weight == 7.0)
    other = nn.Sequential(nn.Linear(3, 4, rng=2), nn.BatchNorm2d(4))
    assert other.load_state_dict(state) == nn.IncompatibleKeys([], [])
    np.testing.assert_array_equal(other[0].weight, state["0.weight"])


def test_load_state_dict_rejects_unknown_and_missing_keys_when_strict():
    model = nn.Linear(3, 2)
    state = {k: v.numpy() for k, v in torch.nn.Linear(3, 2).state_dict().items()}
    with pytest.raises(lm.InputError, match=r"unexpected key\(s\) \['extra'\]"):
        model.load_state_dict({**state, "extra": np.zeros(1)})
    with pytest.raises(lm.InputError, match=r"missing key\(s\) \['bias'\]"):
        model.load_state_dict({"weight": state["weight"]})
    result = model.load_state_dict({"weight": state["weight"], "extra": np.zeros(1)}, strict=False)
    assert result == (["bias"], ["extra"])
    np.testing.assert_array_equal(model.weight, state["weight"])


def test_load_state_dict_rejects_shape_mismatch_and_changes_nothing():
    model = nn.Linear(3, 2, rng=0)
    before = model.state_dict()
    with pytest.raises(lm.ShapeError, match=r"'weight' has shape \(3, 3\), the module expects \(2, 3\)"):
        model.load_state_dict({"bias": np.zeros(2), "weight": np.zeros((3, 3))})
    np.testing.assert_array_equal(model.bias, before["bias"])


def test_assigning_an_array_of_another_shape_to_a_parameter_is_an_error():
    model = nn.Linear(3, 2)
    model.weight = np.ones((2, 3))  # same shape: replaces the values
    assert model.weight.dtype == np.float32 and np.all(model.weight == 1)
    with pytest.raises(lm.ShapeError, match=r"Linear.weight: expected shape \(2, 3\), got \(3, 3\)"):
        model.weight = np.ones((3, 3))


def test_custom_modules_register_parameters_buffers_and_children():
    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.gain = nn.Parameter(np.full(3, 2.0))
            self.register_buffer("offset", np.ones(3))
            self.inner = nn.Linear(3, 3)
            self.note = "plain attribute"

        def forward(self, x):
            return self.inner(x) * self.graph_tensor(x.graph, "gain") + self.graph_tensor(x.graph, "offset")

    module = Scale()
    assert [k for k, _ in module.named_parameters()] == ["gain", "inner.weight", "inner.bias"]
    assert list(module.state_dict()) == ["gain", "offset", "inner.weight", "inner.bias"]  # torch's order
    x = rand(2, 3)
    (out,) = run(module, x)
    np.testing.assert_allclose(out, (x @ module.inner.weight.T + module.inner.bias) * 2 + 1, rtol=1e-6, atol=1e-6)


def test_train_and_eval_set_every_submodule():
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Dropout(), nn.BatchNorm2d(2)))
    assert all(m.training for m in model.modules())
    model.eval()
    assert not any(m.training for m in model.modules())
    model.train()
    assert all(m.training for m in model.modules())


# -- forward passes against torch -------------------------------------------------------------------------
def test_linear_matches_torch(backend):
    assert_matches_torch(nn.Linear(5, 3), torch.nn.Linear(5, 3), rand(2, 4, 5), backend=backend)


def test_linear_on_symbolic_leading_dims_matches_torch(backend):
    """Linear views the leading dims as one axis of rows (for its weight gradient's sake), which
    works when they are symbolic too."""
    x = rand(3, 2, 4, 5)
    assert_matches_torch(nn.Linear(5, 3), torch.nn.Linear(5, 3), x, backend=backend,
                         symbolic={0: ("a", 2, "b", 5)})


@pytest.mark.parametrize("options", [dict(stride=2, padding=1, groups=2), dict(dilation=2, bias=False),
                                     dict(padding="same")], ids=["strided-grouped", "dilated-no-bias", "same"])
def test_conv2d_matches_torch(options, backend):
    assert_matches_torch(nn.Conv2d(4, 6, 3, **options), torch.nn.Conv2d(4, 6, 3, **options), rand(2, 4, 7, 7),
                         backend=backend)


def test_small_cnn_matches_torch_in_eval_and_train_mode(backend):
    def cnn(lib):
        return lib.Sequential(lib.Conv2d(3, 4, 3, padding=1), lib.BatchNorm2d(4), lib.ReLU(), lib.MaxPool2d(2),
                              lib.Flatten(), lib.Linear(4 * 3 * 3, 5))
    theirs = randomized(cnn(torch.nn))
    x = rand(2, 3, 6, 6)
    assert_matches_torch(cnn(nn).eval(), theirs.eval(), x, backend=backend)
    assert_matches_torch(cnn(nn).train(), theirs.train(), x, backend=backend)


@pytest.mark.parametrize("make", [lambda lib: lib.ReLU(), lambda lib: lib.GELU(), lambda lib: lib.GELU("tanh"),
                                  lambda lib: lib.Sigmoid(), lambda lib: lib.Tanh(), lambda lib: lib.SiLU(),
                                  lambda lib: lib.Identity(), lambda lib: lib.Flatten(0, 1),
                                  lambda lib: lib.MaxPool2d(2, stride=1, padding=1)],
                         ids=["ReLU", "GELU", "GELU-tanh", "Sigmoid", "Tanh", "SiLU", "Identity", "Flatten", "MaxPool2d"])
def test_stateless_modules_match_torch(make):
    assert_matches_torch(make(nn), make(torch.nn), rand(2, 3, 4, 4, seed=3) * 3, rtol=1e-4)


def test_layer_norm_matches_torch():
    assert_matches_torch(nn.LayerNorm((3, 4)), randomized(torch.nn.LayerNorm((3, 4))), rand(2, 3, 4) * 5)


def test_embedding_matches_torch_on_int_and_float_ids():
    ids = np.array([[0, 3, 9], [2, 2, 1]], np.int32)
    theirs = torch.nn.Embedding(10, 4, padding_idx=0)
    assert_matches_torch(nn.Embedding(10, 4, padding_idx=0), theirs, ids)
    ours = nn.Embedding(10, 4)
    ours.load_state_dict(theirs.state_dict())
    (out,) = run(ours, ids.astype(np.float32))
    np.testing.assert_array_equal(out, theirs.weight.detach().numpy()[ids])


# -- batch normalization state ------------------------------------------------------------------------------
@pytest.mark.parametrize("momentum", [0.1, None], ids=["momentum", "cumulative"])
def test_batch_norm_running_stats_after_two_steps_equal_torch(momentum, backend):
    theirs = randomized(torch.nn.BatchNorm2d(3, momentum=momentum)).train()
    ours = nn.BatchNorm2d(3, momentum=momentum)
    ours.load_state_dict(theirs.state_dict())
    g, (y,) = build(ours, ("n", 3, 4, 5))  # a symbolic batch: the unbiased factor n / (n - 1) is computed in the graph
    program = g.compile(backend).set_inputs(ours.inputs(g))
    for step, batch in enumerate([2, 3]):
        x = rand(batch, 3, 4, 5, seed=step) * 2 + 1
        np.testing.assert_allclose(program(x0=x)["y0"], theirs(torch.from_numpy(x)).detach().numpy(),
                                   rtol=1e-5, atol=1e-5)
    assert sorted(ours.load_program_state(program, g)) == ["num_batches_tracked", "running_mean", "running_var"]
    for name, value in theirs.state_dict().items():
        np.testing.assert_allclose(ours.state_dict()[name], value.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


def test_batch_norm_in_eval_mode_uses_running_stats_and_updates_nothing():
    theirs = randomized(torch.nn.BatchNorm2d(3)).eval()
    ours = nn.BatchNorm2d(3).eval()
    assert_matches_torch(ours, theirs, rand(2, 3, 4, 4))
    g, _ = build(ours, (2, 3, 4, 4))
    assert g.updates == {} and "running_var" in ours.input_names(g)


def test_batch_norm_without_running_stats_always_uses_the_batch():
    theirs, ours = torch.nn.BatchNorm2d(3, track_running_stats=False).eval(), nn.BatchNorm2d(3, track_running_stats=False).eval()
    assert_matches_torch(ours, theirs, rand(2, 3, 4, 4) * 3)
    assert "running_mean" not in ours.state_dict()


# -- attention ----------------------------------------------------------------------------------------------
def causal_mask(length):
    return np.triu(np.full((length, length), -1e30, np.float32), 1)


@pytest.mark.parametrize("layout", ["batch_first", "sequence_first", "unbatched"])
def test_multihead_attention_matches_torch(layout):
    batch_first = layout == "batch_first"
    shape = {"batch_first": (2, 5, 8), "sequence_first": (5, 2, 8), "unbatched": (5, 8)}[layout]
    q, k, v = rand(*shape, seed=1), rand(*shape, seed=2), rand(*shape, seed=3)
    assert_matches_torch(nn.MultiheadAttention(8, 2, batch_first=batch_first),
                         randomized(torch.nn.MultiheadAttention(8, 2, batch_first=batch_first)), q, k, v,
                         torch_kwargs={"need_weights": False})


def test_multihead_attention_masks_and_weights_match_torch(backend):
    """Masks are additive floats (torch's float masks); need_weights returns the head-averaged weights."""
    q, kv = rand(2, 4, 8, seed=1), rand(2, 6, 8, seed=2)
    attn_mask = rand(4, 6, seed=3)
    padding = np.zeros((2, 6), np.float32)
    padding[1, -2:] = -1e30  # the last two keys of the second sequence are padding
    ours = nn.MultiheadAttention(8, 2, batch_first=True)
    theirs = randomized(torch.nn.MultiheadAttention(8, 2, batch_first=True))
    ours.load_state_dict(theirs.state_dict())
    g = lm.Graph()
    x = {name: g.tensor(name, a.shape) for name, a in [("q", q), ("kv", kv), ("mask", attn_mask), ("padding", padding)]}
    out, weights = ours(x["q"], x["kv"], x["kv"], attn_mask=x["mask"], key_padding_mask=x["padding"], need_weights=True)
    out.output("out"), weights.output("weights")
    result = g.compile(backend).set_inputs(ours.inputs(g))(q=q, kv=kv, mask=attn_mask, padding=padding)
    t = [torch.from_numpy(a) for a in (q, kv, attn_mask, padding)]
    with torch.no_grad():
        expected = theirs(t[0], t[1], t[1], attn_mask=t[2], key_padding_mask=t[3], need_weights=True)
    np.testing.assert_allclose(result["out"], expected[0].numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(result["weights"], expected[1].numpy(), rtol=1e-5, atol=1e-6)


def test_multihead_attention_is_causal_builds_the_causal_mask():
    x = rand(2, 5, 8)
    theirs = randomized(torch.nn.MultiheadAttention(8, 2, batch_first=True))
    assert_matches_torch(nn.MultiheadAttention(8, 2, batch_first=True), theirs, x, x, x,
                         our_kwargs={"is_causal": True},
                         torch_kwargs={"attn_mask": torch.from_numpy(causal_mask(5)), "need_weights": False})


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_self_attention_output_and_gradients_match_torch(backend, bias):
    """One tensor as query, key and value projects once with the packed weight: the same output
    and the same gradients (input and every parameter) as torch's."""
    x = rand(2, 5, 8)
    ours = nn.MultiheadAttention(8, 2, bias=bias, batch_first=True)
    theirs = randomized(torch.nn.MultiheadAttention(8, 2, bias=bias, batch_first=True))
    ours.load_state_dict(theirs.state_dict())
    g = lm.Graph()
    xt = g.tensor("x", x.shape)
    out, _ = ours(xt, xt, xt)
    params = ours.parameter_tensors(g)
    grads = lm.grad((out * out).sum(), [xt, *params.values()])
    out.output("out")
    for name, grad in zip(["x", *params], grads):
        grad.output("d_" + name.replace(".", "_"))
    result = g.compile(backend).set_inputs(ours.inputs(g))(x=x)
    x_torch = torch.from_numpy(x).requires_grad_()
    expected, _ = theirs(x_torch, x_torch, x_torch, need_weights=False)
    (expected * expected).sum().backward()
    np.testing.assert_allclose(result["out"], expected.detach().numpy(), rtol=1e-5, atol=1e-5)
    torch_grads = {"x": x_torch.grad, **{n: p.grad for n, p in theirs.named_parameters()}}
    assert set(torch_grads) == {"x", *params}
    for name, expected_grad in torch_grads.items():
        np.testing.assert_allclose(result["d_" + name.replace(".", "_")], expected_grad.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_transformer_encoder_layer_matches_torch_in_eval_mode(norm_first, activation):
    options = dict(dim_feedforward=16, activation=activation, batch_first=True, norm_first=norm_first)
    assert_matches_torch(nn.TransformerEncoderLayer(8, 2, **options).eval(),
                         randomized(torch.nn.TransformerEncoderLayer(8, 2, **options)).eval(), rand(2, 5, 8) * 2,
                         rtol=1e-4, atol=1e-5)


def test_transformer_encoder_layer_in_train_mode_without_dropout_matches_torch(backend):
    options = dict(dim_feedforward=16, dropout=0.0, batch_first=True)
    assert_matches_torch(nn.TransformerEncoderLayer(8, 2, **options).train(),
                         randomized(torch.nn.TransformerEncoderLayer(8, 2, **options)).train(), rand(2, 5, 8),
                         backend=backend, rtol=1e-4, atol=1e-5)


def test_transformer_with_symbolic_batch_and_length_runs_any_size(backend):
    theirs = randomized(torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)).eval()
    ours = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True).eval()
    ours.load_state_dict(theirs.state_dict())
    g, _ = build(ours, ("b", "s", 8), src_mask=None, is_causal=True)
    program = g.compile(backend).set_inputs(ours.inputs(g))
    for batch, length in [(1, 3), (2, 6)]:
        x = rand(batch, length, 8, seed=length)
        with torch.no_grad():
            expected = theirs(torch.from_numpy(x), src_mask=torch.from_numpy(causal_mask(length)), is_causal=True)
        np.testing.assert_allclose(program(x0=x)["y0"], expected.numpy(), rtol=1e-4, atol=1e-5)


# -- initialization ------------------------------------------------------------------------------------------
def test_linear_and_conv_init_is_uniform_within_one_over_sqrt_fan_in():
    for module, fan_in in [(nn.Linear(400, 300, rng=0), 400), (nn.Conv2d(16, 64, 5, groups=2, rng=0), 8 * 25)]:
        bound = 1 / np.sqrt(fan_in)
        for array in (module.weight, module.bias):
            assert array.dtype == np.float32 and np.abs(array).max() <= bound
        w = module.weight  # U(-b, b): mean 0, std b / sqrt(3), reaching close to the bound
        assert abs(w.mean()) < 0.01 * bound and abs(w.std() - bound / np.sqrt(3)) < 0.02 * bound
        assert np.abs(w).max() > 0.99 * bound


def test_embedding_init_is_standard_normal_with_a_zero_padding_row():
    weight = nn.Embedding(1000, 64, padding_idx=-1, rng=0).weight
    assert abs(weight.mean()) < 0.01 and abs(weight.std() - 1) < 0.01
    assert np.all(weight[-1] == 0)


def test_attention_init_matches_torchs_scheme():
    mha = nn.MultiheadAttention(64, 4, rng=0)
    xavier = np.sqrt(6 / (64 + 3 * 64))
    assert np.abs(mha.in_proj_weight).max() <= xavier and np.abs(mha.in_proj_weight).max() > 0.99 * xavier
    assert np.abs(mha.out_proj.weight).max() <= 1 / 8
    assert not mha.in_proj_bias.any() and not mha.out_proj.bias.any()
    layer_norm = nn.LayerNorm(8)
    assert np.all(layer_norm.weight == 1) and not layer_norm.bias.any()


def test_the_same_rng_seed_gives_the_same_parameters():
    def state(seed):
        return nn.TransformerEncoderLayer(8, 2, 16, rng=seed).state_dict()
    a, b, c = state(3), state(3), state(4)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["linear1.weight"], c["linear1.weight"])


# -- graph inputs and naming ----------------------------------------------------------------------------------
def test_inputs_are_named_by_dotted_path_with_the_prefix():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    g, _ = build(model, (2, 3))
    assert model.input_names(g) == {"0.weight": "_0__weight", "0.bias": "_0__bias",
                                    "2.weight": "_2__weight", "2.bias": "_2__bias"}
    assert nn.input_name("enc.layers", "0.norm1.weight") == "enc__layers__0__norm1__weight"
    prefixed = nn.Sequential(nn.Linear(3, 4), prefix="enc")
    g, _ = build(prefixed, (2, 3))
    assert sorted(prefixed.inputs(g)) == ["enc__0__bias", "enc__0__weight"]
    assert prefixed.inputs(g)["enc__0__weight"] is prefixed[0].weight


def test_two_models_in_one_graph_need_different_prefixes():
    g = lm.Graph()
    x = g.tensor("x", (2, 3))
    nn.Linear(3, 3)(x)
    with pytest.raises(lm.InputError, match="input 'weight' is already declared.*different prefixes"):
        nn.Linear(3, 3)(x)
    nn.Linear(3, 3, prefix="second")(x)
    assert {"weight", "second__weight"} <= set(g.inputs)


def test_a_module_applied_twice_shares_its_inputs():
    layer = nn.Linear(3, 3)
    g = lm.Graph()
    layer(layer(g.tensor("x", (2, 3)))).output("y")
    assert sorted(g.inputs) == ["bias", "weight", "x"]
    x = rand(2, 3)
    out = g.compile("reference").set_inputs(layer.inputs(g))(x=x)["y"]
    once = x @ layer.weight.T + layer.bias
    np.testing.assert_allclose(out, once @ layer.weight.T + layer.bias, rtol=1e-5)


def test_parameter_tensors_are_the_parameters_the_graph_reads():
    model = nn.Sequential(nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2)).eval()
    g, _ = build(model, (1, 2, 3, 3))
    params = model.parameter_tensors(g)
    assert list(params) == ["0.weight", "0.bias", "1.weight", "1.bias"]  # running stats are buffers
    assert all(t.node.op == "input" and t.graph is g for t in params.values())
    assert model.graph_tensor(g, "1.weight") is params["1.weight"]
    with pytest.raises(lm.InputError, match="no parameter or buffer '1.gamma'"):
        model.graph_tensor(g, "1.gamma")


def test_only_what_forward_reads_becomes_an_input():
    model = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5)).eval()  # eval: no seed input
    g, _ = build(model, (2, 3))
    assert sorted(g.inputs) == ["_0__bias", "_0__weight", "x0"]


def test_a_child_applied_on_its_own_keeps_its_names_when_the_parent_follows():
    child = nn.Linear(3, 3, prefix="solo")
    parent = nn.Sequential(child, prefix="seq")
    g = lm.Graph()
    x = g.tensor("x", (1, 3))
    child(x), parent(x)
    assert parent.input_names(g) == {"0.weight": "solo__weight", "0.bias": "solo__bias"}


# -- dropout ------------------------------------------------------------------------------------------
def reference_hash(n, seed, stream=0, start=0):
    """The documented generator in int64 numpy for indices start .. start + n - 1: the graph's float32
    arithmetic must be exact."""
    i = np.arange(start, start + n, dtype=np.int64)
    left, right, block = i % P, (i // P) % P, (i // (P * P)) % P
    a, b = seed % P, (seed // P) % P
    for m, n_, o, c in _ROUND_CONSTANTS:
        key = (a * m % P + b * n_ % P + (block + STREAM_STEP * stream) * o % P + c) % P
        mixed = (right + key) % P
        left, right = right, (left + mixed * mixed) % P
    return left * P + right


@pytest.mark.parametrize("seed, stream", [(0, 0), (12345, 0), (2 ** 24 - 1, 3)])
def test_dropout_random_numbers_equal_the_documented_hash_exactly(seed, stream, backend):
    g = lm.Graph()
    random_integers(g.tensor("x", ("b", 7, 5)), g.tensor("seed", ()), stream).output("v")
    v = g.compile(backend)(x=np.zeros((30, 7, 5), np.float32), seed=np.float32(seed))["v"]
    np.testing.assert_array_equal(v.ravel(), reference_hash(30 * 7 * 5, seed, stream))


def test_dropout_elements_past_the_first_block_of_p_squared_get_their_own_keys():
    """Indices P^2 - 4 .. P^2 + 3 (a 16.7M-element tensor's tail) without building the whole tensor."""
    g = lm.Graph()
    flat = index_var(0, 8) + (P * P - 4)
    hash_of_index(g, flat, (8,), g.tensor("seed", ()), stream=1, blocks=True).output("v")
    v = g.compile("reference")(seed=np.float32(5))["v"]
    np.testing.assert_array_equal(v, reference_hash(8, 5, stream=1, start=P * P - 4))
    assert not np.array_equal(v[4:], reference_hash(4, 5, stream=1))  # the second block is not the first again


def dropout_program(p, shape=(200, 500), backend="reference", seed=7, applications=1):
    layer = nn.Dropout(p, seed=seed)
    g = lm.Graph()
    x = g.tensor("x", shape)
    for k in range(applications):
        layer(x).output(f"y{k}")
    return layer, g, g.compile(backend).set_inputs(layer.inputs(g))


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_dropout_keeps_the_expected_fraction_and_scales_by_one_over_one_minus_p(p):
    _, _, program = dropout_program(p)
    out = program(x=np.ones((200, 500), np.float32))["y0"]
    kept = out != 0
    sigma = np.sqrt(p * (1 - p) / out.size)
    assert abs(kept.mean() - (1 - p)) < 5 * sigma
    np.testing.assert_allclose(out[kept], 1 / (1 - p), rtol=1e-6)
    # no structure along rows or columns: each row's and column's keep rate is binomial too
    assert abs(kept.mean(1).std() - np.sqrt(p * (1 - p) / 500)) < 0.25 * np.sqrt(p * (1 - p) / 500)
    assert abs(kept.mean(0).std() - np.sqrt(p * (1 - p) / 200)) < 0.25 * np.sqrt(p * (1 - p) / 200)


def test_dropout_random_numbers_are_uniform_and_independent_of_neighbours():
    g = lm.Graph()
    random_integers(g.tensor("x", (1 << 16,)), g.tensor("seed", ()), 0).output("v")
    u = g.compile("reference")(x=np.zeros(1 << 16, np.float32), seed=np.float32(99))["v"] / (P * P)
    counts = np.histogram(u, bins=64, range=(0, 1))[0]
    expected = u.size / 64
    assert ((counts - expected) ** 2 / expected).sum() < 120  # chi-square, 63 dof: p < 1e-5 above 120
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.02


def test_each_program_call_draws_a_new_mask_and_the_seed_is_state(backend):
    layer, g, program = dropout_program(0.5, shape=(64, 64), backend=backend)
    ones = np.ones((64, 64), np.float32)
    first, second = program(x=ones)["y0"], program(x=ones)["y0"]
    agreement = ((first != 0) == (second != 0)).mean()
    assert 0.45 < agreement < 0.55  # independent masks agree half the time at p = 0.5
    assert program.state[layer.input_names(g)["seed"]] == 9.0  # seed 7, two calls
    # the same seed gives the same mask, in a new graph and on either backend
    _, _, replay = dropout_program(0.5, shape=(64, 64), seed=8)
    np.testing.assert_array_equal(replay(x=ones)["y0"], second)
    assert layer.seed == 7 and layer.load_program_state(program, g) == ["seed"] and layer.seed == 9


def test_dropout_applied_twice_in_one_graph_draws_two_masks():
    _, g, program = dropout_program(0.5, shape=(64, 64), applications=2)
    out = program(x=np.ones((64, 64), np.float32))
    assert 0.45 < ((out["y0"] != 0) == (out["y1"] != 0)).mean() < 0.55
    assert len(g.updates) == 1


@pytest.mark.parametrize("p, mode, expected", [(0.5, "eval", "x"), (0.0, "train", "x"), (1.0, "train", "zeros")])
def test_dropout_is_identity_in_eval_mode_and_at_the_extremes(p, mode, expected):
    layer = nn.Dropout(p)
    getattr(layer, mode)()
    x = rand(4, 5)
    (out,) = run(layer, x)
    np.testing.assert_array_equal(out, x if expected == "x" else np.zeros_like(x))


def test_dropout_on_a_symbolic_shape():
    _, _, program = dropout_program(0.25, shape=("b", 100))
    out = program(x=np.ones((50, 100), np.float32))["y0"]
    assert out.shape == (50, 100) and abs((out != 0).mean() - 0.75) < 0.03


def test_functional_dropout_takes_an_explicit_seed():
    g = lm.Graph()
    x = g.tensor("x", (1000,))
    nn.functional.dropout(x, 0.5, seed=3).output("a")
    nn.functional.dropout(x, 0.5, training=False).output("b")
    out = g.compile("reference")(x=np.ones(1000, np.float32))
    np.testing.assert_array_equal(out["a"] != 0, reference_hash(1000, 3) >= round(0.5 * P * P))
    np.testing.assert_array_equal(out["b"], 1.0)
    with pytest.raises(lm.ValueDomainError, match="training needs a seed"):
        nn.functional.dropout(x, 0.5)


# -- losses as modules -----------------------------------------------------------------------------------------
def test_cross_entropy_loss_module_matches_torch(backend):
    weight = rand(4, seed=5, low=0.5, high=2.0)
    ours = nn.CrossEntropyLoss(weight=weight, label_smoothing=0.1)
    theirs = torch.nn.CrossEntropyLoss(weight=torch.from_numpy(weight), label_smoothing=0.1)
    assert_matches_torch(ours, theirs, rand(6, 4), np.array([0, 1, 3, 2, 2, 0], np.int32), backend=backend)


def test_training_a_linear_model_end_to_end_with_graph_updates():
    """What an optimizer does with these APIs: parameter tensors in, updated state out."""
    model = nn.Linear(3, 1, rng=0)
    g = lm.Graph()
    x, y = g.tensor("x", ("b", 3)), g.tensor("y", ("b", 1))
    loss = lm.mse_loss(model(x), y).output("loss")
    for name, w in model.parameter_tensors(g).items():  # a hand-written SGD step: d(mse)/dw
        error = (model(x) - y) * (2.0 / 8)
        grad = error.mT @ x if name == "weight" else error.sum(0)
        g.update(w, w - grad * 0.1)
    program = g.compile("reference").set_inputs(model.inputs(g))
    xs = rand(8, 3, seed=1)
    ys = xs @ np.array([[1.0], [-2.0], [0.5]], np.float32) + 0.3
    losses = [float(program(x=xs, y=ys)["loss"]) for _ in range(200)]
    assert losses[-1] < 1e-3 * losses[0]
    assert model.load_program_state(program, g) == ["weight", "bias"]
    np.testing.assert_allclose(model.weight, [[1.0, -2.0, 0.5]], atol=0.05)
    assert loss is not None


# -- errors -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("module, shape, error, message", [
    (lambda: nn.BatchNorm2d(3), (2, 3, 4), lm.ShapeError, r"BatchNorm2d: expected 4D input"),
    (lambda: nn.BatchNorm2d(3), (2, 4, 4, 4), lm.ShapeError, r"BatchNorm2d: expected 3 channels"),
    (lambda: nn.Conv2d(3, 4, 3), (2, 5, 8, 8), lm.ShapeError, r"conv2d: expected input with 3 channels"),
    (lambda: nn.Conv2d(3, 4, 3), (8, 8), lm.ShapeError, r"conv2d: expected 3-D \(unbatched\) or 4-D"),
    (lambda: nn.Linear(3, 4), (2, 5), lm.ShapeError, r"linear: input has 5 features"),
    (lambda: nn.LayerNorm(4), (2, 5), lm.ShapeError, r"layer_norm: input shape \(2, 5\) does not end with"),
    (lambda: nn.MaxPool2d(2), (4, 4), lm.ShapeError, r"MaxPool2d: expected a 3-D"),
    (lambda: nn.MultiheadAttention(8, 2, batch_first=True), (2, 3, 6), lm.ShapeError, r"embed_dim=8"),
])
def test_wrong_input_rank_or_size_is_reported(module, shape, error, message):
    g = lm.Graph()
    x = g.tensor("x", shape)
    m = module()
    with pytest.raises(error, match=message):
        m(x, x, x) if isinstance(m, nn.MultiheadAttention) else m(x)


@pytest.mark.parametrize("make, error, message", [
    (lambda: nn.Dropout(1.5), lm.ValueDomainError, "between 0 and 1"),
    (lambda: nn.Dropout(0.5, seed=-1), lm.ValueDomainError, r"seed must be an int in \[0, 2\^24\)"),
    (lambda: nn.MultiheadAttention(10, 3), lm.ValueDomainError, "divisible by num_heads"),
    (lambda: nn.Conv2d(3, 4, 3, groups=2), lm.ValueDomainError, "divisible by groups"),
    (lambda: nn.Linear(0, 3), lm.ValueDomainError, "in_features must be a positive int"),
    (lambda: nn.TransformerEncoderLayer(8, 2, activation="swish"), lm.ValueDomainError, "activation"),
    (lambda: nn.Linear(3, 3, prefix="bad name"), lm.InputError, "module prefix"),
    (lambda: nn.Linear(3, 3, rng="seed"), lm.ValueDomainError, "rng must be"),
])
def test_bad_constructor_arguments_are_rejected(make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_modules_must_be_applied_to_graph_tensors():
    with pytest.raises(lm.UnsupportedError, match="apply modules to GraphTensors"):
        nn.Linear(2, 2)(np.zeros((1, 2), np.float32))


def test_batch_norm_in_training_needs_more_than_one_value_per_channel():
    g = lm.Graph()
    with pytest.raises(lm.ShapeError, match="more than 1 value per channel"):
        nn.BatchNorm2d(3)(g.tensor("x", (1, 3, 1, 1)))
