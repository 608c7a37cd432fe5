"""nn.RNN / LSTM / GRU and the cells against torch.nn: state dicts, forward passes and gradients, both the
unrolled graph (lm.grad) and SequenceRunner (run-time lengths, backpropagation through time)."""
import time

import numpy as np
import pytest
import torch

import luminar as lm
import luminar.nn as nn
from conftest import rand

torch.set_num_threads(1)

# (class name, constructor options): small random configs covering every option
CONFIGS = {
    "RNN-tanh": ("RNN", dict()),
    "RNN-relu-2layers-nobias": ("RNN", dict(num_layers=2, nonlinearity="relu", bias=False)),
    "LSTM-2layers-bidirectional": ("LSTM", dict(num_layers=2, bidirectional=True)),
    "LSTM-batch_first-nobias": ("LSTM", dict(batch_first=True, bias=False)),
    "GRU-bidirectional-batch_first": ("GRU", dict(bidirectional=True, batch_first=True)),
    "GRU-2layers": ("GRU", dict(num_layers=2)),
}
FEATURES, HIDDEN = 3, 5


def make_pair(name, input_size=FEATURES, hidden=HIDDEN):
    """(ours, torch's) with torch's random weights loaded into ours."""
    kind, options = CONFIGS[name]
    torch.manual_seed(hash(name) % 1000)
    theirs = getattr(torch.nn, kind)(input_size, hidden, **options)
    ours = getattr(nn, kind)(input_size, hidden, **options)
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs


def sequence(module, steps, batch, seed=0):
    shape = (batch, steps, module.input_size) if module.batch_first else (steps, batch, module.input_size)
    return rand(*shape, seed=seed)


def initial_state(module, batch, seed):
    count = module.num_layers * module.num_directions
    h0 = rand(count, batch, module.hidden_size, seed=seed) * 0.5
    return (h0, rand(count, batch, module.hidden_size, seed=seed + 1) * 0.5) if module.mode == "LSTM" else h0


def torch_run(theirs, x, hx, d_out, d_states):
    """torch's outputs and the gradients of sum(out * d_out) + sum(states * d_states) (input, h0 (c0), parameters)."""
    theirs.zero_grad()  # .grad accumulates across calls
    x_t = torch.from_numpy(x).requires_grad_()
    hx_t = tuple(torch.from_numpy(s).requires_grad_() for s in hx) if isinstance(hx, tuple) else \
        torch.from_numpy(hx).requires_grad_()
    out, states = theirs(x_t, hx_t)
    states = states if isinstance(states, tuple) else (states,)
    loss = (out * torch.from_numpy(d_out)).sum() + sum((s * torch.from_numpy(d)).sum() for s, d in zip(states, d_states))
    loss.backward()
    hx_list = hx_t if isinstance(hx_t, tuple) else (hx_t,)
    grads = {"input": x_t.grad, **{k: t.grad for k, t in zip(("h0", "c0"), hx_list)},
             **{n: p.grad for n, p in theirs.named_parameters()}}
    return [out.detach().numpy(), *(s.detach().numpy() for s in states)], {k: v.numpy() for k, v in grads.items()}


def close(ours, theirs, what):
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=2e-6, err_msg=what)


# -- parameters ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", CONFIGS)
def test_parameters_have_torch_names_shapes_and_init_bounds(name):
    kind, options = CONFIGS[name]
    ours, theirs = getattr(nn, kind)(4, 6, rng=0, **options), getattr(torch.nn, kind)(4, 6, **options)
    assert [(k, v.shape) for k, v in ours.named_parameters()] == \
           [(k, tuple(v.shape)) for k, v in theirs.named_parameters()]
    assert list(ours.state_dict()) == list(theirs.state_dict())
    bound = 1 / np.sqrt(6)
    values = np.concatenate([v.ravel() for v in ours.parameters()])
    assert np.all(np.abs(values) <= bound) and values.std() > bound / 3  # U(-1/sqrt(H), 1/sqrt(H)), as torch


@pytest.mark.parametrize("kind", ["RNNCell", "LSTMCell", "GRUCell"])
def test_cells_have_torch_names_and_shapes(kind):
    for bias in (True, False):
        ours, theirs = getattr(nn, kind)(4, 6, bias=bias, rng=0), getattr(torch.nn, kind)(4, 6, bias=bias)
        assert [(k, v.shape) for k, v in ours.named_parameters()] == \
               [(k, tuple(v.shape)) for k, v in theirs.named_parameters()]


# -- the unrolled graph: forward and lm.grad ---------------------------------------------------------
def graph_run(ours, x, hx, d_out, d_states, backend):
    """Our outputs and lm.grad's gradients of the same loss as torch_run, from one compiled graph."""
    g = lm.Graph()
    x_t = g.tensor("x", x.shape)
    hx_t = tuple(g.tensor(n, s.shape) for n, s in zip(("h0", "c0"), hx)) if isinstance(hx, tuple) else \
        g.tensor("h0", hx.shape)
    out, states = ours(x_t, hx_t)
    states = states if isinstance(states, tuple) else (states,)
    loss = (out * g.tensor("d_out", d_out.shape)).sum()
    for k, (s, d) in enumerate(zip(states, d_states)):
        loss = loss + (s * g.tensor(f"d_state{k}", d.shape)).sum()
    params = ours.parameter_tensors(g)
    hx_list = hx_t if isinstance(hx_t, tuple) else (hx_t,)
    wanted = {"input": x_t, **dict(zip(("h0", "c0"), hx_list)), **params}
    for key, gradient in zip(wanted, lm.grad(loss, list(wanted.values()))):
        gradient.output("grad_" + key.replace(".", "_"))
    out.output("out")
    for k, s in enumerate(states):
        s.output(f"state{k}")
    program = g.compile(backend).set_inputs(ours.inputs(g))
    feeds = {"x": x, "d_out": d_out, **{f"d_state{k}": d for k, d in enumerate(d_states)},
             **dict(zip(("h0", "c0"), hx if isinstance(hx, tuple) else (hx,)))}
    result = program(**feeds)
    outputs = [result["out"], *(result[f"state{k}"] for k in range(len(states)))]
    return outputs, {key: result["grad_" + key.replace(".", "_")] for key in wanted}


def random_loss_weights(expected_outputs, seed):
    d_out = rand(*expected_outputs[0].shape, seed=seed)
    return d_out, [rand(*s.shape, seed=seed + 1 + k) for k, s in enumerate(expected_outputs[1:])]


@pytest.mark.parametrize("name", CONFIGS)
def test_unrolled_forward_and_gradients_match_torch(name, backend):
    ours, theirs = make_pair(name)
    x, hx = sequence(ours, steps=4, batch=2, seed=1), initial_state(ours, 2, seed=2)
    with torch.no_grad():
        out, states = theirs(torch.from_numpy(x), tuple(map(torch.from_numpy, hx)) if isinstance(hx, tuple)
                             else torch.from_numpy(hx))
    d_out, d_states = random_loss_weights([out.numpy(), *(s.numpy() for s in (states if isinstance(states, tuple)
                                                                             else (states,)))], seed=3)
    expected, expected_grads = torch_run(theirs, x, hx, d_out, d_states)
    got, grads = graph_run(ours, x, hx, d_out, d_states, backend)
    for k, (a, b) in enumerate(zip(got, expected)):
        close(a, b, f"output {k}")
    assert set(grads) == set(expected_grads)
    for key in expected_grads:
        close(grads[key], expected_grads[key], f"gradient of {key}")


def test_unbatched_input_and_default_states_match_torch(backend):
    ours, theirs = make_pair("LSTM-2layers-bidirectional")
    x = rand(6, FEATURES, seed=4)
    g = lm.Graph()
    out, (h_n, c_n) = ours(g.tensor("x", x.shape))
    for name, t in (("out", out), ("h", h_n), ("c", c_n)):
        t.output(name)
    result = g.compile(backend).set_inputs(ours.inputs(g))(x=x)
    with torch.no_grad():
        e_out, (e_h, e_c) = theirs(torch.from_numpy(x))
    for name, expected in (("out", e_out), ("h", e_h), ("c", e_c)):
        assert result[name].shape == tuple(expected.shape)
        close(result[name], expected.numpy(), name)


@pytest.mark.parametrize("kind", ["RNNCell", "LSTMCell", "GRUCell"])
def test_cells_forward_and_gradients_match_torch(kind, backend):
    torch.manual_seed(1)
    options = dict(nonlinearity="relu") if kind == "RNNCell" else {}
    theirs, ours = getattr(torch.nn, kind)(4, 3, **options), getattr(nn, kind)(4, 3, **options)
    ours.load_state_dict(theirs.state_dict())
    x, h, c = rand(2, 4, seed=5), rand(2, 3, seed=6), rand(2, 3, seed=7)
    lstm = kind == "LSTMCell"
    g = lm.Graph()
    xt, ht, ct = g.tensor("x", x.shape), g.tensor("h", h.shape), g.tensor("c", c.shape)
    result = ours(xt, (ht, ct) if lstm else ht)
    outs = result if lstm else (result,)
    loss = sum(((o * float(k + 1)) * o).sum() for k, o in enumerate(outs))  # a loss that is not linear
    params = ours.parameter_tensors(g)
    wanted = [xt, ht] + ([ct] if lstm else []) + list(params.values())
    for k, gradient in enumerate(lm.grad(loss, wanted)):
        gradient.output(f"g{k}")
    for k, o in enumerate(outs):
        o.output(f"o{k}")
    got = g.compile(backend).set_inputs(ours.inputs(g))(x=x, h=h, c=c)
    tx, th, tc = (torch.from_numpy(a).requires_grad_() for a in (x, h, c))
    t_result = theirs(tx, (th, tc) if lstm else th)
    t_outs = t_result if lstm else (t_result,)
    sum(((o * float(k + 1)) * o).sum() for k, o in enumerate(t_outs)).backward()
    for k, o in enumerate(t_outs):
        close(got[f"o{k}"], o.detach().numpy(), f"output {k}")
    expected = [tx.grad, th.grad] + ([tc.grad] if lstm else []) + [p.grad for p in theirs.parameters()]
    for k, e in enumerate(expected):
        close(got[f"g{k}"], e.numpy(), f"gradient {k}")


def test_dropout_between_layers_zeroes_the_next_layers_input():
    """p = 1 drops everything between the layers, so layer 2 sees zeros: its output is a torch layer fed zeros."""
    torch.manual_seed(2)
    theirs = torch.nn.GRU(FEATURES, HIDDEN, num_layers=2)
    ours = nn.GRU(FEATURES, HIDDEN, num_layers=2, dropout=1.0)
    ours.load_state_dict(theirs.state_dict())
    x = rand(4, 2, FEATURES, seed=8)
    g = lm.Graph()
    out, _ = ours(g.tensor("x", x.shape))
    out.output("out")
    got = g.compile("reference").set_inputs(ours.inputs(g))(x=x)["out"]
    second = torch.nn.GRU(HIDDEN, HIDDEN)
    second.load_state_dict({k.replace("_l1", "_l0"): v for k, v in theirs.state_dict().items() if "_l1" in k})
    with torch.no_grad():
        expected, _ = second(torch.zeros(4, 2, HIDDEN))
    close(got, expected.numpy(), "output after dropout(p=1)")
    assert "between_layers.seed" not in ours.state_dict()  # torch's state_dict, the seed is not persistent
    ours.eval()  # eval: no dropout, torch's output
    g = lm.Graph()
    out, _ = ours(g.tensor("x", x.shape))
    out.output("out")
    with torch.no_grad():
        close(g.compile("reference").set_inputs(ours.inputs(g))(x=x)["out"], theirs(torch.from_numpy(x))[0].numpy(),
              "eval output")


# -- SequenceRunner: run-time lengths ------------------------------------------------------------------
# every config on the reference backend; on cpu (five programs to compile each) the three that cover every option
RUNNER_CASES = [("reference", name) for name in CONFIGS] + \
    [("cpu", name) for name in ("RNN-relu-2layers-nobias", "LSTM-2layers-bidirectional", "GRU-bidirectional-batch_first")]


@pytest.mark.parametrize("backend,name", RUNNER_CASES)
def test_runner_forward_and_backward_match_torch_at_several_lengths(backend, name, chunk=1):
    ours, theirs = make_pair(name)
    runner = nn.SequenceRunner(ours, backend, chunk=chunk)
    programs = dict(runner._programs)
    for steps, batch in ((3, 2), (7, 1), (1, 2)):  # new lengths and batch sizes reuse the same programs
        x, hx = sequence(ours, steps, batch, seed=steps), initial_state(ours, batch, seed=steps + 1)
        out, states = runner(x, hx)
        states = states if isinstance(states, tuple) else (states,)
        d_out, d_states = random_loss_weights([out, *states], seed=steps + 2)
        expected, expected_grads = torch_run(theirs, x, hx, d_out, d_states)
        for k, (a, b) in enumerate(zip([out, *states], expected)):
            close(a, b, f"output {k} at {steps} steps")
        grads = runner.backward(d_out, *d_states)
        assert list(grads) == list(expected_grads)
        for key in expected_grads:
            close(grads[key], expected_grads[key], f"gradient of {key} at {steps} steps")
    assert all(runner._programs[key] is program for key, program in programs.items())


@pytest.mark.parametrize("name", ["RNN-relu-2layers-nobias", "LSTM-2layers-bidirectional", "GRU-2layers"])
def test_runner_with_chunks_of_steps_matches_torch(name):
    """chunk=3: 7 steps run as two 3-step programs and one single step, 3 steps as one chunk; 1 as a step."""
    test_runner_forward_and_backward_match_torch_at_several_lengths("reference", name, chunk=3)


def test_runner_compile_time_does_not_grow_with_the_length():
    """1,000 steps run on the programs compiled before the length was known (nothing compiles per length)."""
    torch.manual_seed(3)
    theirs = torch.nn.LSTM(8, 16)
    ours = nn.LSTM(8, 16)
    ours.load_state_dict(theirs.state_dict())
    start = time.perf_counter()
    runner = nn.SequenceRunner(ours, "cpu")
    compile_seconds = time.perf_counter() - start
    compiled = set(runner._programs)
    x = rand(1000, 2, 8, seed=9)
    start = time.perf_counter()
    out, (h_n, c_n) = runner(x)
    run_seconds = time.perf_counter() - start
    assert set(runner._programs) == compiled
    with torch.no_grad():
        e_out, (e_h, e_c) = theirs(torch.from_numpy(x))
    close(out, e_out.numpy(), "1,000-step output")
    close(c_n, e_c.numpy(), "1,000-step cell state")
    print(f"\nSequenceRunner LSTM(8, 16): compile {compile_seconds:.2f} s, 1,000 steps {run_seconds:.2f} s")


def test_unrolled_graph_grows_with_the_steps():
    """The unrolled graph holds a cell per step, so its size (and compile time, printed, not asserted:
    the machine is shared) grows linearly with the length: the README's trade-off."""
    nodes, seconds = {}, {}
    for steps in (2, 8):
        model = nn.GRU(2, 3, rng=0)
        start = time.perf_counter()
        g = lm.Graph()
        out, _ = model(g.tensor("x", (steps, 2, 2)))
        out.output("out")
        g.compile("cpu")
        seconds[steps], nodes[steps] = time.perf_counter() - start, len(g.nodes)
    print(f"\nunrolled GRU(2, 3) build + compile: 2 steps {seconds[2]:.2f} s ({nodes[2]} nodes), "
          f"8 steps {seconds[8]:.2f} s ({nodes[8]} nodes)")
    assert 3.5 < nodes[8] / nodes[2] < 4.5


# -- bad inputs ----------------------------------------------------------------------------------------
def test_bad_inputs_raise_luminar_errors():
    lstm = nn.LSTM(3, 4, num_layers=2)
    g = lm.Graph()
    with pytest.raises(lm.ShapeError, match=r"LSTM: expected a 3-D \(batched\) or 2-D \(unbatched\) input"):
        lstm(g.tensor("x4", (2, 3, 4, 3)))
    with pytest.raises(lm.ShapeError, match=r"LSTM: input has 5 features .* expected input_size=3"):
        lstm(g.tensor("x5", (6, 2, 5)))
    x = g.tensor("x", (6, 2, 3))
    with pytest.raises(lm.ShapeError, match=r"LSTM: expected h0 of shape \(2, 2, 4\), got \(1, 2, 4\)"):
        lstm(x, (g.tensor("h_bad", (1, 2, 4)), g.tensor("c", (2, 2, 4))))
    with pytest.raises(lm.UnsupportedError, match=r"LSTM: hx must be a tuple \(h0, c0\)"):
        lstm(x, g.tensor("h", (2, 2, 4)))
    with pytest.raises(lm.UnsupportedError, match=r"symbolic .*SequenceRunner"):
        lstm(g.tensor("xs", ("s", 2, 3)))
    with pytest.raises(lm.ShapeError, match=r"GRUCell: expected h of shape \(2, 4\), got \(2, 5\)"):
        nn.GRUCell(3, 4)(g.tensor("cx", (2, 3)), g.tensor("ch", (2, 5)))
    with pytest.raises(lm.ValueDomainError, match="nonlinearity"):
        nn.RNN(3, 4, nonlinearity="sigmoid")
    with pytest.raises(lm.UnsupportedError, match="proj_size"):
        nn.LSTM(3, 4, proj_size=2)
    runner = nn.SequenceRunner(lstm.eval(), "reference")
    with pytest.raises(lm.ShapeError, match=r"LSTM: input has 2 features"):
        runner(np.zeros((5, 1, 2), np.float32))
    with pytest.raises(lm.ShapeError, match=r"expected c0 of shape \(2, 1, 4\), got \(2, 3, 4\)"):
        runner(np.zeros((5, 1, 3), np.float32), (np.zeros((2, 1, 4)), np.zeros((2, 3, 4))))
    with pytest.raises(lm.UnsupportedError, match="run the sequence forward first"):
        runner.backward(np.zeros((5, 1, 4)))
    runner(np.zeros((5, 1, 3), np.float32))
    with pytest.raises(lm.ShapeError, match=r"expected grad_output of shape \(5, 1, 4\)"):
        runner.backward(np.zeros((5, 1, 8)))
    with pytest.raises(lm.DTypeError, match="LSTM: input: cannot read list as a float32 array"):
        runner([["a", "b", "c"]])
    with pytest.raises(lm.ValueDomainError, match="chunk must be a positive int"):
        nn.SequenceRunner(lstm, "reference", chunk=0)
    with pytest.raises(lm.UnsupportedError, match="dropout between layers in training mode"):
        nn.SequenceRunner(nn.GRU(3, 4, num_layers=2, dropout=0.5), "reference")(np.zeros((2, 1, 3)))


def test_unbatched_initial_states_and_symbolic_batch_match_torch():
    """Unbatched input with (h0, c0) on both paths, and an unrolled graph whose batch dim is symbolic."""
    ours, theirs = make_pair("LSTM-batch_first-nobias")  # batch_first does not apply to unbatched input
    x, h0, c0 = rand(5, FEATURES, seed=10), rand(1, HIDDEN, seed=11), rand(1, HIDDEN, seed=12)
    with torch.no_grad():
        e_out, (e_h, e_c) = theirs(torch.from_numpy(x), (torch.from_numpy(h0), torch.from_numpy(c0)))
    out, (h_n, c_n) = nn.SequenceRunner(ours, "reference")(x, (h0, c0))
    for got, expected, what in ((out, e_out, "output"), (h_n, e_h, "h_n"), (c_n, e_c, "c_n")):
        assert got.shape == tuple(expected.shape)
        close(got, expected.numpy(), f"runner {what}")
    g = lm.Graph()
    out, (h_n, _) = ours(g.tensor("x", x.shape), (g.tensor("h0", h0.shape), g.tensor("c0", c0.shape)))
    out.output("out"), h_n.output("h_n")
    result = g.compile("reference").set_inputs(ours.inputs(g))(x=x, h0=h0, c0=c0)
    close(result["out"], e_out.numpy(), "graph output")
    close(result["h_n"], e_h.numpy(), "graph h_n")

    g = lm.Graph()  # a symbolic batch: one program for every batch size
    out, _ = ours(g.tensor("x", ("b", 3, FEATURES)))
    out.output("out")
    program = g.compile("reference").set_inputs(ours.inputs(g))
    for batch in (1, 4):
        xb = rand(batch, 3, FEATURES, seed=batch)
        with torch.no_grad():
            close(program(x=xb)["out"], theirs(torch.from_numpy(xb))[0].numpy(), f"batch {batch}")


def test_training_an_unrolled_gru_with_trainstep_follows_torch_sgd():
    """A GRU + linear head trained by a compiled TrainStep (forward, BPTT, SGD in one program) takes
    torch's steps: the same losses, and the same weights after three steps."""
    from luminar.optim import SGD, TrainStep

    class Tagger(nn.Module):  # per-step regression from a 2-layer GRU
        def __init__(self, lib):
            super().__init__()
            self.gru, self.head = lib.GRU(3, 6, num_layers=2), lib.Linear(6, 1)

        def forward(self, x):
            return self.head(self.gru(x)[0])

    class TorchTagger(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gru, self.head = torch.nn.GRU(3, 6, num_layers=2), torch.nn.Linear(6, 1)

        def forward(self, x):
            return self.head(self.gru(x)[0])

    torch.manual_seed(4)
    theirs, ours = TorchTagger(), Tagger(nn)
    ours.load_state_dict(theirs.state_dict())
    x, target = rand(7, 2, 3, seed=13), rand(7, 2, 1, seed=14)
    g = lm.Graph()
    prediction = ours(g.tensor("x", x.shape))
    loss = lm.mse_loss(prediction, g.tensor("target", target.shape))
    train = TrainStep.for_module(ours, loss, SGD(lr=0.5), backend="reference")
    optimizer = torch.optim.SGD(theirs.parameters(), lr=0.5)
    for step in range(3):
        optimizer.zero_grad()
        expected = torch.nn.functional.mse_loss(theirs(torch.from_numpy(x)), torch.from_numpy(target))
        expected.backward()
        optimizer.step()
        assert train.step({"x": x, "target": target}) == pytest.approx(expected.item(), rel=1e-4), f"step {step}"
    trained = train.params()
    for name, value in theirs.state_dict().items():
        close(trained[name], value.numpy(), f"{name} after 3 steps")
