"""luminar.optim against torch.optim: optimizer trajectories, lr schedules, gradient clipping,
and the compiled training step (TrainStep) with its safetensors checkpoints.

Optimizers run as graph updates: parameters and optimizer state are graph inputs the program
rewrites after each call (Graph.update), so a trajectory is a sequence of program calls. Torch
gets the same gradients through p.grad (or computes them with autograd for the same loss).
"""
import math
import os
import sys

import numpy as np
import pytest
import torch

import luminar as lm
from luminar.errors import DTypeError, InputError, ShapeError, UnsupportedError, ValueDomainError, WeightFileError
from luminar.optim import (SGD, Adam, AdamW, CosineAnnealingLR, LambdaLR, LinearLR, SequentialLR, StepLR, TrainStep,
                           clip_grad_norm, warmup_cosine)

from conftest import rand

STEPS = 20
SHAPES = {"w": (3, 4), "b": (5,)}

SGD_CASES = {
    "plain": dict(lr=0.1),
    "momentum": dict(lr=0.05, momentum=0.9),
    "nesterov": dict(lr=0.05, momentum=0.9, nesterov=True),
    "weight_decay": dict(lr=0.1, weight_decay=0.05),
    "dampening": dict(lr=0.05, momentum=0.8, dampening=0.3),
    "everything": dict(lr=0.05, momentum=0.7, dampening=0.2, weight_decay=0.01, maximize=True),
}
ADAM_CASES = {
    "default": dict(lr=0.01),
    "weight_decay": dict(lr=0.01, weight_decay=0.1),
    "amsgrad": dict(lr=0.01, amsgrad=True),
    "betas_eps": dict(lr=0.02, betas=(0.5, 0.9), eps=1e-3),
    "beta1_zero": dict(lr=0.01, betas=(0.0, 0.99)),
    "maximize": dict(lr=0.01, maximize=True),
}
ADAMW_CASES = {
    "default": dict(lr=0.01),
    "strong_decay": dict(lr=0.01, weight_decay=0.5),
    "amsgrad": dict(lr=0.01, weight_decay=0.1, amsgrad=True),
}
TORCH = {SGD: torch.optim.SGD, Adam: torch.optim.Adam, AdamW: torch.optim.AdamW}


def initial_params():
    return {key: rand(*shape, seed=k) for k, (key, shape) in enumerate(SHAPES.items())}


def gradient_sequence(steps=STEPS):
    rng = np.random.default_rng(7)
    return [{key: rng.standard_normal(shape).astype(np.float32) for key, shape in SHAPES.items()}
            for _ in range(steps)]


def luminar_trajectory(optimizer, backend, grads, lrs=None):
    """Parameters after each step, the gradients fed as graph inputs."""
    g = lm.Graph()
    params = {key: g.tensor(key, shape) for key, shape in SHAPES.items()}
    optimizer.apply(params, [g.tensor(f"grad_{key}", shape) for key, shape in SHAPES.items()])
    program = g.compile(backend).set_inputs({**initial_params(), **optimizer.initial_state()})
    trajectory = []
    for step, grad in enumerate(grads):
        program(**{f"grad_{k}": v for k, v in grad.items()}, **optimizer.feed(None if lrs is None else lrs[step]))
        trajectory.append({key: program.state[key].copy() for key in SHAPES})
    return trajectory, program


def torch_trajectory(optimizer_class, kwargs, grads, lrs=None):
    params = {key: torch.nn.Parameter(torch.from_numpy(v)) for key, v in initial_params().items()}
    optimizer = optimizer_class(list(params.values()), **kwargs)
    trajectory = []
    for step, grad in enumerate(grads):
        if lrs is not None:
            optimizer.param_groups[0]["lr"] = lrs[step]
        for key, p in params.items():
            p.grad = torch.from_numpy(grad[key])
        optimizer.step()
        trajectory.append({key: p.detach().numpy().copy() for key, p in params.items()})
    return trajectory, optimizer, params


def assert_trajectories_match(ours, theirs, rtol=1e-4, atol=1e-6):
    for step, (a, b) in enumerate(zip(ours, theirs)):
        for key in a:
            np.testing.assert_allclose(a[key], b[key], rtol=rtol, atol=atol, err_msg=f"step {step}, param {key}")


# -- optimizer trajectories with gradients fed per step ------------------------------------------
@pytest.mark.parametrize("case", SGD_CASES)
def test_sgd_matches_torch(case):
    grads = gradient_sequence()
    ours, _ = luminar_trajectory(SGD(**SGD_CASES[case]), "reference", grads)
    theirs, _, _ = torch_trajectory(torch.optim.SGD, SGD_CASES[case], grads)
    assert_trajectories_match(ours, theirs)


@pytest.mark.parametrize("case", ADAM_CASES)
def test_adam_matches_torch(case):
    grads = gradient_sequence()
    ours, _ = luminar_trajectory(Adam(**ADAM_CASES[case]), "reference", grads)
    theirs, _, _ = torch_trajectory(torch.optim.Adam, ADAM_CASES[case], grads)
    assert_trajectories_match(ours, theirs)


@pytest.mark.parametrize("beta2", [0.999, 0.99999])
def test_adam_bias_correction_keeps_its_precision_on_the_first_steps(beta2):
    """1 - beta2^t is tiny for t = 1 and beta2 near 1: computing it as -expm1(t ln beta2) keeps
    the first updates within float32 rounding of torch's (1 - exp2(t log2 beta2) is off by 7e-4
    relative at beta2 = 0.99999)."""
    g = lm.Graph()
    w, gw = g.tensor("w", (64,)), g.tensor("gw", (64,))
    optimizer = Adam(lr=1.0, betas=(0.9, beta2))
    optimizer.apply({"w": w}, [gw])
    program = g.compile("reference").set_inputs({"w": np.zeros(64, np.float32), **optimizer.initial_state()})
    grad = rand(64, seed=5)
    program(gw=grad, **optimizer.feed())
    w_t = torch.nn.Parameter(torch.zeros(64))
    w_t.grad = torch.from_numpy(grad)
    torch.optim.Adam([w_t], lr=1.0, betas=(0.9, beta2)).step()
    np.testing.assert_allclose(program.state["w"], w_t.detach().numpy(), rtol=2e-6)


@pytest.mark.parametrize("case", ADAMW_CASES)
def test_adamw_matches_torch(case):
    grads = gradient_sequence()
    ours, _ = luminar_trajectory(AdamW(**ADAMW_CASES[case]), "reference", grads)
    theirs, _, _ = torch_trajectory(torch.optim.AdamW, ADAMW_CASES[case], grads)
    assert_trajectories_match(ours, theirs)


@pytest.mark.parametrize("optimizer_class, kwargs", [(SGD, SGD_CASES["everything"]), (SGD, SGD_CASES["nesterov"]),
                                                     (Adam, ADAM_CASES["amsgrad"]), (AdamW, ADAMW_CASES["default"])],
                         ids=["sgd", "sgd_nesterov", "adam_amsgrad", "adamw"])
def test_compiled_cpu_trajectory_matches_torch(optimizer_class, kwargs):
    grads = gradient_sequence()
    ours, _ = luminar_trajectory(optimizer_class(**kwargs), "cpu", grads)
    theirs, _, _ = torch_trajectory(TORCH[optimizer_class], kwargs, grads)
    assert_trajectories_match(ours, theirs)


@pytest.mark.parametrize("optimizer_class, kwargs", [(SGD, dict(lr=0.1, momentum=0.9)),
                                                     (Adam, dict(lr=0.01, amsgrad=True))], ids=["sgd", "adam"])
def test_optimizer_state_matches_torch(optimizer_class, kwargs):
    """The state inputs hold torch's optimizer.state[p] (momentum_buffer, exp_avg, ..., step)."""
    grads = gradient_sequence(5)
    optimizer = optimizer_class(**kwargs)
    _, program = luminar_trajectory(optimizer, "reference", grads)
    _, torch_optimizer, torch_params = torch_trajectory(TORCH[optimizer_class], kwargs, grads)
    for key, p in torch_params.items():
        for kind, value in torch_optimizer.state[p].items():
            name = optimizer.state_names["optim.step" if kind == "step" else f"optim.{key}.{kind}"]
            np.testing.assert_allclose(program.state[name], value.numpy(), rtol=1e-5, atol=1e-7, err_msg=name)
    assert program.state[optimizer.step_input] == len(grads)


def test_learning_rate_is_an_input_changed_per_step_without_recompiling():
    lrs = [0.01 * (1 + math.sin(k)) for k in range(STEPS)]
    grads = gradient_sequence()
    ours, _ = luminar_trajectory(Adam(lr=0.01), "reference", grads, lrs=lrs)
    theirs, _, _ = torch_trajectory(torch.optim.Adam, dict(lr=0.01), grads, lrs=lrs)
    assert_trajectories_match(ours, theirs)


def test_initial_state_is_zeros_and_step_zero():
    g = lm.Graph()
    optimizer = Adam(amsgrad=True, name="adam")
    optimizer.apply({"layer.weight": g.tensor("w", (2, 3))}, [g.tensor("gw", (2, 3))])
    state = optimizer.initial_state()
    assert set(state) == {"adam__step", "adam__w__exp_avg", "adam__w__exp_avg_sq", "adam__w__max_exp_avg_sq"}
    assert state["adam__step"].shape == () and state["adam__w__exp_avg"].shape == (2, 3)
    assert all(not v.any() for v in state.values())
    assert optimizer.state_names["adam.layer.weight.exp_avg"] == "adam__w__exp_avg"


# -- the training step with an in-graph gradient ---------------------------------------------------
N, D = 16, 3


def least_squares(backend, optimizer, **options):
    """loss = mean((x @ w + b - y)^2) with its hand-derived gradient, as a TrainStep."""
    g = lm.Graph()
    x, y = g.tensor("x", (N, D)), g.tensor("y", (N, 1))
    w, b = g.tensor("w", (D, 1)), g.tensor("b", (1,))
    residual = x @ w + b - y
    loss = (residual * residual).mean()
    grads = [(x.T @ residual) * (2.0 / N), residual.sum(0) * (2.0 / N)]
    init = {"w": rand(D, 1, seed=3), "b": np.zeros(1, np.float32)}
    return TrainStep(loss, {"w": w, "b": b}, optimizer, init, grads=grads, backend=backend, **options)


def least_squares_batches(steps=STEPS):
    rng = np.random.default_rng(11)
    true_w = rng.standard_normal((D, 1)).astype(np.float32)
    batches = []
    for _ in range(steps):
        x = rng.standard_normal((N, D)).astype(np.float32)
        batches.append({"x": x, "y": x @ true_w + 0.5 + 0.01 * rng.standard_normal((N, 1)).astype(np.float32)})
    return batches


def torch_least_squares(optimizer_class, kwargs, batches, schedule=None, max_norm=None):
    w = torch.nn.Parameter(torch.from_numpy(rand(D, 1, seed=3)))
    b = torch.nn.Parameter(torch.zeros(1))
    optimizer = optimizer_class([w, b], **kwargs)
    scheduler = schedule(optimizer) if schedule else None
    losses, params = [], []
    for batch in batches:
        x, y = torch.from_numpy(batch["x"]), torch.from_numpy(batch["y"])
        optimizer.zero_grad()
        loss = ((x @ w + b - y) ** 2).mean()
        loss.backward()
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_([w, b], max_norm)
        optimizer.step()
        if scheduler:
            scheduler.step()
        losses.append(loss.item())
        params.append({"w": w.detach().numpy().copy(), "b": b.detach().numpy().copy()})
    return losses, params


@pytest.mark.parametrize("optimizer_class, kwargs", [(SGD, dict(lr=0.05, momentum=0.9, nesterov=True)),
                                                     (AdamW, dict(lr=0.2, weight_decay=0.1))], ids=["sgd", "adamw"])
def test_train_step_with_in_graph_gradient_matches_torch(optimizer_class, kwargs):
    batches = least_squares_batches()
    train = least_squares("cpu", optimizer_class(**kwargs))
    losses, params = [], []
    for batch in batches:
        losses.append(train.step(batch))
        params.append({k: v.copy() for k, v in train.params().items()})
    torch_losses, torch_params = torch_least_squares(TORCH[optimizer_class], kwargs, batches)
    np.testing.assert_allclose(losses, torch_losses, rtol=1e-4)
    assert_trajectories_match(params, torch_params)
    assert losses[-1] < losses[0] / 4  # it trains
    assert train.step_count == STEPS


def test_train_step_follows_a_schedule_like_torch_scheduler():
    batches = least_squares_batches()
    optimizer = Adam(lr=0.1)
    train = least_squares("reference", optimizer, schedule=warmup_cosine(optimizer, 5, STEPS, start_factor=0.1))
    losses = [train.step(batch) for batch in batches]

    def torch_schedule(opt):
        return torch.optim.lr_scheduler.SequentialLR(opt, [
            torch.optim.lr_scheduler.LinearLR(opt, 0.1, 1.0, 5),
            torch.optim.lr_scheduler.CosineAnnealingLR(opt, STEPS - 5)], milestones=[5])

    torch_losses, torch_params = torch_least_squares(torch.optim.Adam, dict(lr=0.1), batches, schedule=torch_schedule)
    np.testing.assert_allclose(losses, torch_losses, rtol=1e-4)
    assert_trajectories_match([train.params()], torch_params[-1:])
    assert train.last_lr == pytest.approx(optimizer.lr * 0.5 * (1 + math.cos(math.pi * 14 / 15)))


def test_train_step_clips_gradients_like_torch():
    batches = least_squares_batches(8)
    train = least_squares("reference", SGD(lr=0.1, momentum=0.5), max_grad_norm=0.5)
    losses = [train.step(batch) for batch in batches]
    torch_losses, torch_params = torch_least_squares(torch.optim.SGD, dict(lr=0.1, momentum=0.5), batches, max_norm=0.5)
    np.testing.assert_allclose(losses, torch_losses, rtol=1e-4)
    assert_trajectories_match([train.params()], torch_params[-1:])
    assert train.last_outputs["grad_norm"].shape == ()


def test_train_step_computes_extra_outputs():
    g = lm.Graph()
    x, w = g.tensor("x", (4, 2)), g.tensor("w", (2,))
    prediction = x @ w
    loss = (prediction * prediction).sum()
    train = TrainStep(loss, {"w": w}, SGD(lr=0.01), {"w": np.ones(2)}, grads=[2.0 * (x.T @ prediction)],
                      outputs={"prediction": prediction}, backend="reference")
    x0 = rand(4, 2)
    train.step({"x": x0})
    np.testing.assert_allclose(train.last_outputs["prediction"], x0 @ np.ones(2, np.float32), rtol=1e-6)


def test_batch_size_may_change_between_steps_without_recompiling():
    """A symbolic batch dim: loss = mean(x @ w) over n rows, whose gradient is the mean row."""
    g = lm.Graph()
    x, w = g.tensor("x", ("n", 2)), g.tensor("w", (2,))
    train = TrainStep((x @ w).mean(), {"w": w}, SGD(lr=0.5), {"w": np.zeros(2)}, grads=[x.mean(0)], backend="cpu")
    w_expected = np.zeros(2, np.float32)
    for n in (3, 7, 1):
        batch = rand(n, 2, seed=n)
        assert train.step({"x": batch}) == pytest.approx(float((batch @ w_expected).mean()), abs=1e-6)
        w_expected = w_expected - 0.5 * batch.mean(0)
    np.testing.assert_allclose(train.params()["w"], w_expected, rtol=1e-6)


def test_params_are_read_only_views_of_the_program_state():
    train = least_squares("reference", SGD(lr=0.1))
    train.step(least_squares_batches(1)[0])
    params = train.params()
    np.testing.assert_array_equal(params["w"], train.program.state["w"])
    with pytest.raises(ValueError):
        params["w"][0, 0] = 1.0


def test_grads_none_uses_luminar_grad():
    pytest.importorskip("luminar.autograd")
    batches = least_squares_batches(3)
    g = lm.Graph()
    x, y, w = g.tensor("x", (N, D)), g.tensor("y", (N, 1)), g.tensor("w", (D, 1))
    loss = ((x @ w - y) * (x @ w - y)).mean()
    train = TrainStep(loss, {"w": w}, SGD(lr=0.1), {"w": rand(D, 1, seed=3)}, backend="reference")
    losses = [train.step(batch) for batch in batches]
    w_t = torch.nn.Parameter(torch.from_numpy(rand(D, 1, seed=3)))
    torch_optimizer = torch.optim.SGD([w_t], lr=0.1)
    for batch, ours in zip(batches, losses):
        torch_optimizer.zero_grad()
        loss_t = ((torch.from_numpy(batch["x"]) @ w_t - torch.from_numpy(batch["y"])) ** 2).mean()
        loss_t.backward()
        torch_optimizer.step()
        assert ours == pytest.approx(loss_t.item(), rel=1e-4)


def test_grads_none_without_autograd_is_unsupported(monkeypatch):
    monkeypatch.setitem(sys.modules, "luminar.autograd", None)  # as if the module did not exist
    g = lm.Graph()
    w = g.tensor("w", (2,))
    with pytest.raises(UnsupportedError, match="luminar.grad"):
        TrainStep((w * w).sum(), {"w": w}, SGD(lr=0.1), {"w": np.ones(2)}, backend="reference")


# -- checkpoints ----------------------------------------------------------------------------------
def test_save_and_load_continue_the_identical_trajectory(tmp_path):
    batches = least_squares_batches(10)
    optimizer = Adam(lr=0.05, amsgrad=True)
    train = least_squares("cpu", optimizer, schedule=StepLR(optimizer, step_size=3, gamma=0.5))
    for batch in batches[:5]:
        train.step(batch)
    path = tmp_path / "run.safetensors"
    train.save(path)
    expected = [train.step(batch) for batch in batches[5:]]

    optimizer = Adam(lr=0.05, amsgrad=True)
    resumed = least_squares("cpu", optimizer, schedule=StepLR(optimizer, step_size=3, gamma=0.5))
    resumed.load(path)
    assert resumed.step_count == 5
    assert [resumed.step(batch) for batch in batches[5:]] == expected
    for key, value in train.state_dict().items():
        np.testing.assert_array_equal(resumed.state_dict()[key], value, err_msg=key)
    assert os.listdir(tmp_path) == ["run.safetensors"]  # the temporary file was renamed into place


def test_saved_file_holds_params_and_optimizer_state(tmp_path):
    from safetensors.numpy import load_file
    train = least_squares("reference", Adam(lr=0.1))
    train.step(least_squares_batches(1)[0])
    train.save(tmp_path / "run.safetensors")
    tensors = load_file(tmp_path / "run.safetensors")
    assert set(tensors) == {"w", "b", "optim.step", "optim.w.exp_avg", "optim.w.exp_avg_sq",
                            "optim.b.exp_avg", "optim.b.exp_avg_sq"}
    assert tensors["optim.step"] == 1.0
    np.testing.assert_array_equal(tensors["w"], train.params()["w"])


def save_modified(tmp_path, change):
    """A checkpoint of a fresh least-squares TrainStep with `change` applied to its tensors."""
    from safetensors.numpy import save_file
    tensors = {k: np.array(v) for k, v in least_squares("reference", SGD(lr=0.1, momentum=0.9)).state_dict().items()}
    change(tensors)
    path = tmp_path / "bad.safetensors"
    save_file(tensors, path)
    return path


@pytest.mark.parametrize("change, error, message", [
    (lambda t: t.pop("optim.w.momentum_buffer"), WeightFileError, "'optim.w.momentum_buffer' is missing"),
    (lambda t: t.update(extra=np.zeros(2, np.float32)), WeightFileError, "unexpected tensor 'extra'"),
    (lambda t: t.update(w=np.zeros((2, 1), np.float32)), ShapeError, r"'w' has shape \(2, 1\), expected \(3, 1\)"),
    (lambda t: t.update(b=np.zeros(1, np.float64)), WeightFileError, "'b' has dtype float64"),
    (lambda t: t.update({"optim.step": np.array(1.5, np.float32)}), WeightFileError, "'optim.step' must hold a step"),
], ids=["missing", "unexpected", "shape", "dtype", "step"])
def test_load_rejects_a_mismatched_file_naming_the_tensor(tmp_path, change, error, message):
    train = least_squares("reference", SGD(lr=0.1, momentum=0.9))
    before = {k: v.copy() for k, v in train.state_dict().items()}
    with pytest.raises(error, match=message):
        train.load(save_modified(tmp_path, change))
    for key, value in train.state_dict().items():  # nothing changed
        np.testing.assert_array_equal(value, before[key])


@pytest.mark.parametrize("content", [b"not a safetensors file at all", b""], ids=["garbage", "empty"])
def test_load_rejects_a_corrupt_file(tmp_path, content):
    path = tmp_path / "corrupt.safetensors"
    path.write_bytes(content)
    with pytest.raises(WeightFileError, match="corrupt.safetensors"):
        least_squares("reference", SGD(lr=0.1)).load(path)


def test_load_rejects_a_truncated_file(tmp_path):
    train = least_squares("reference", Adam())
    train.save(tmp_path / "run.safetensors")
    data = (tmp_path / "run.safetensors").read_bytes()
    (tmp_path / "run.safetensors").write_bytes(data[:-8])
    with pytest.raises(WeightFileError, match="run.safetensors"):
        train.load(tmp_path / "run.safetensors")


def test_load_of_a_missing_file(tmp_path):
    with pytest.raises(WeightFileError, match="no such file"):
        least_squares("reference", SGD(lr=0.1)).load(tmp_path / "absent.safetensors")


# -- learning-rate schedules ----------------------------------------------------------------------
def torch_lrs(make_scheduler, steps=40, lr=0.1):
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    scheduler = make_scheduler(optimizer)
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


S = torch.optim.lr_scheduler
SCHEDULES = {
    "step": (lambda o: StepLR(o, step_size=7, gamma=0.5), lambda o: S.StepLR(o, step_size=7, gamma=0.5)),
    "cosine": (lambda o: CosineAnnealingLR(o, T_max=15, eta_min=0.01),
               lambda o: S.CosineAnnealingLR(o, T_max=15, eta_min=0.01)),  # 40 steps: past T_max too
    "linear_warmup": (lambda o: LinearLR(o, start_factor=0.25, total_iters=8),
                      lambda o: S.LinearLR(o, start_factor=0.25, total_iters=8)),
    "linear_decay": (lambda o: LinearLR(o, start_factor=1.0, end_factor=0.1, total_iters=30),
                     lambda o: S.LinearLR(o, start_factor=1.0, end_factor=0.1, total_iters=30)),
    "lambda": (lambda o: LambdaLR(o, lambda k: 0.95 ** k), lambda o: S.LambdaLR(o, lambda k: 0.95 ** k)),
    "warmup_then_cosine": (
        lambda o: SequentialLR(o, [LinearLR(o, 0.1, total_iters=10), CosineAnnealingLR(o, T_max=30)], [10]),
        lambda o: S.SequentialLR(o, [S.LinearLR(o, 0.1, total_iters=10), S.CosineAnnealingLR(o, T_max=30)], [10])),
    "three_phases": (
        lambda o: SequentialLR(o, [LinearLR(o, 0.5, total_iters=5), StepLR(o, 4, 0.5), CosineAnnealingLR(o, 10)],
                               [5, 20]),
        lambda o: S.SequentialLR(o, [S.LinearLR(o, 0.5, total_iters=5), S.StepLR(o, 4, 0.5),
                                     S.CosineAnnealingLR(o, 10)], [5, 20])),
}


@pytest.mark.parametrize("name", SCHEDULES)
def test_schedule_matches_torch_scheduler(name):
    ours, theirs = SCHEDULES[name]
    schedule = ours(SGD(lr=0.1))
    np.testing.assert_allclose([schedule(k) for k in range(40)], torch_lrs(theirs), rtol=1e-9, atol=1e-15)


def test_warmup_cosine_is_linear_warmup_then_cosine_annealing():
    schedule = warmup_cosine(0.1, warmup_steps=10, total_steps=40, start_factor=0.1, eta_min=1e-3)
    expected = torch_lrs(lambda o: S.SequentialLR(o, [S.LinearLR(o, 0.1, total_iters=10),
                                                      S.CosineAnnealingLR(o, T_max=30, eta_min=1e-3)], [10]))
    np.testing.assert_allclose([schedule(k) for k in range(40)], expected, rtol=1e-9)


@pytest.mark.parametrize("make, message", [
    (lambda: StepLR(0.1, step_size=0), "step_size must be >= 1"),
    (lambda: CosineAnnealingLR(0.1, T_max=2.5), "T_max must be an int"),
    (lambda: LinearLR(0.1, start_factor=0.0), r"start_factor must be in \(0, 1\]"),
    (lambda: LinearLR(0.1, end_factor=1.5), r"end_factor must be in \[0, 1\]"),
    (lambda: SequentialLR(0.1, [StepLR(0.1, 2), StepLR(0.1, 3)], []), "2 schedulers need 1 milestones"),
    (lambda: LambdaLR(-0.1, lambda k: 1.0), "base learning rate >= 0"),
    (lambda: StepLR(0.1, 2)(-1), "step must be >= 0"),
    (lambda: warmup_cosine(0.1, warmup_steps=10, total_steps=10), "total_steps must be >= 11"),
])
def test_schedule_rejects_bad_arguments(make, message):
    with pytest.raises(ValueDomainError, match=message):
        make()


# -- gradient clipping ----------------------------------------------------------------------------
@pytest.mark.parametrize("max_norm", [0.5, 100.0], ids=["clipped", "unclipped"])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf, 3.0])
def test_clip_grad_norm_matches_torch(norm_type, max_norm):
    arrays = [rand(3, 4, seed=1), rand(5, seed=2), rand(2, 2, 2, seed=3)]
    g = lm.Graph()
    grads = [g.tensor(f"g{k}", a.shape) for k, a in enumerate(arrays)]
    clipped, total_norm = clip_grad_norm(grads, max_norm, norm_type)
    for k, c in enumerate(clipped):
        c.output(f"clipped{k}")
    total_norm.output("total_norm")
    out = g.compile("reference")(**{f"g{k}": a for k, a in enumerate(arrays)})
    tensors = [torch.nn.Parameter(torch.zeros(a.shape)) for a in arrays]
    for t, a in zip(tensors, arrays):
        t.grad = torch.from_numpy(a.copy())
    torch_norm = torch.nn.utils.clip_grad_norm_(tensors, max_norm, norm_type)
    np.testing.assert_allclose(out["total_norm"], torch_norm.numpy(), rtol=1e-5)
    for k, t in enumerate(tensors):
        np.testing.assert_allclose(out[f"clipped{k}"], t.grad.numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("args, error, message", [
    (([], 1.0), InputError, "no gradients"),
    ((None, -1.0), ValueDomainError, "max_norm must be a finite number >= 0"),
    ((None, 1.0, 0.0), ValueDomainError, "norm_type must be a finite number > 0 or inf"),
    ((None, float("nan")), ValueDomainError, "max_norm"),
])
def test_clip_grad_norm_rejects_bad_arguments(args, error, message):
    g = lm.Graph()
    grads = [g.tensor("g", (2,))] if args[0] is None else args[0]
    with pytest.raises(error, match=message):
        clip_grad_norm(grads, *args[1:])


# -- errors ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("make, message", [
    (lambda: SGD(lr=-0.1), r"SGD: invalid lr: -0.1 \(must be >= 0.0\)"),
    (lambda: SGD(lr=0.1, momentum=-0.5), "SGD: invalid momentum"),
    (lambda: SGD(lr=0.1, weight_decay=-1e-4), "SGD: invalid weight_decay"),
    (lambda: SGD(lr=0.1, nesterov=True), "Nesterov momentum requires a momentum > 0 and zero dampening"),
    (lambda: SGD(lr=0.1, momentum=0.9, dampening=0.1, nesterov=True), "Nesterov"),
    (lambda: Adam(lr=float("nan")), "Adam: invalid lr: nan"),
    (lambda: Adam(betas=(1.0, 0.999)), r"Adam: invalid beta parameter at index 0: 1.0 \(must be \[0.0, 1.0\)\)"),
    (lambda: Adam(betas=(0.9, -0.1)), "invalid beta parameter at index 1"),
    (lambda: Adam(betas=(0.9,)), "betas must be a pair"),
    (lambda: Adam(eps=-1e-8), "Adam: invalid epsilon value"),
    (lambda: AdamW(weight_decay=-0.01), "AdamW: invalid weight_decay"),
    (lambda: AdamW(name="not an identifier"), "name must be an identifier"),
])
def test_optimizer_rejects_bad_hyperparameters(make, message):
    with pytest.raises(ValueDomainError, match=message):
        make()


def test_apply_rejects_a_gradient_of_the_wrong_shape():
    g = lm.Graph()
    with pytest.raises(ShapeError, match=r"gradient of 'w' has shape \(4, 3\), the parameter has shape \(3, 4\)"):
        Adam().apply({"w": g.tensor("w", (3, 4))}, [g.tensor("gw", (4, 3))])


@pytest.mark.parametrize("params, error, message", [
    (lambda g: {"w": g.tensor("w", (2,)) * 2.0}, InputError, "parameter 'w' must be an input"),
    (lambda g: {"w": g.tensor("w", (2,), dtype="int32")}, DTypeError, "parameter 'w' must be float32"),
    (lambda g: {"w": g.tensor("w", ("n",))}, ShapeError, "parameter 'w' has symbolic shape"),
    (lambda g: {}, InputError, "no parameters"),
])
def test_apply_rejects_bad_parameters(params, error, message):
    g = lm.Graph()
    with pytest.raises(error, match=message):
        SGD().apply(params(g), [g.tensor("gw", (2,))])


def test_apply_rejects_a_missing_gradient():
    g = lm.Graph()
    params = {"w": g.tensor("w", (2,)), "b": g.tensor("b", (1,))}
    with pytest.raises(InputError, match="2 parameters but 1 gradients"):
        SGD().apply(params, [g.tensor("gw", (2,))])
    with pytest.raises(InputError, match=r"missing \['b'\]"):
        SGD().apply(params, {"w": g.tensor("gw2", (2,))})


def test_an_optimizer_is_applied_once():
    g = lm.Graph()
    optimizer = SGD(lr=0.1)
    optimizer.apply({"w": g.tensor("w", (2,))}, [g.tensor("gw", (2,))])
    with pytest.raises(UnsupportedError, match="already applied"):
        optimizer.apply({"v": g.tensor("v", (2,))}, [g.tensor("gv", (2,))])


def test_train_step_rejects_bad_init_and_loss():
    g = lm.Graph()
    x, w = g.tensor("x", (4, 2)), g.tensor("w", (2,))
    with pytest.raises(ShapeError, match="loss must be a scalar"):
        TrainStep(x @ w, {"w": w}, SGD(lr=0.1), {"w": np.ones(2)}, grads=[x.sum(0)], backend="reference")
    with pytest.raises(ShapeError, match=r"init of parameter 'w' has shape \(3,\), expected \(2,\)"):
        TrainStep((x @ w).sum(), {"w": w}, SGD(lr=0.1), {"w": np.ones(3)}, grads=[x.sum(0)], backend="reference")
    with pytest.raises(DTypeError, match="init of parameter 'w' is not a float array"):
        TrainStep((x @ w).sum(), {"w": w}, SGD(lr=0.1), {"w": "ones"}, grads=[x.sum(0)], backend="reference")
    other = lm.Graph().tensor("v", ())
    with pytest.raises(InputError, match="parameters must be inputs of the loss's graph"):
        TrainStep(other, {"w": w}, SGD(lr=0.1), {"w": np.ones(2)}, grads=[x.sum(0)], backend="reference")


def test_train_step_rejects_a_parameter_passed_as_batch_input():
    train = least_squares("reference", SGD(lr=0.1))
    batch = least_squares_batches(1)[0]
    with pytest.raises(InputError, match="'w' is a parameter or optimizer input"):
        train.step({**batch, "w": np.zeros((D, 1), np.float32)})
    with pytest.raises(InputError, match="missing input 'y'"):
        train.step({"x": batch["x"]})



def test_for_module_carries_batchnorm_statistics_through_checkpoints(tmp_path):
    """TrainStep.for_module trains the parameters and carries the buffers (running stats) as state:
    they are updated by the graph, and saved and restored with the checkpoint."""
    import luminar as lm
    from luminar import nn
    torch = pytest.importorskip("torch")
    model = nn.Sequential(nn.Conv2d(1, 2, 3, rng=0), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(8, 1, rng=1))
    twin = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2), torch.nn.Flatten(), torch.nn.Linear(8, 1))
    twin.load_state_dict({k: torch.from_numpy(v) for k, v in model.state_dict().items()})
    g = lm.Graph()
    x, y = g.tensor("x", (4, 1, 4, 4)), g.tensor("y", (4, 1))
    step = TrainStep.for_module(model, lm.mse_loss(model(x), y), SGD(lr=0.1), backend="reference")
    opt = torch.optim.SGD(twin.parameters(), lr=0.1)
    rng = np.random.default_rng(0)
    for _ in range(3):
        xb, yb = rng.standard_normal((4, 1, 4, 4), np.float32), rng.standard_normal((4, 1), np.float32)
        ours = step.step({"x": xb, "y": yb})
        opt.zero_grad()
        theirs = torch.nn.functional.mse_loss(twin(torch.from_numpy(xb)), torch.from_numpy(yb))
        theirs.backward()
        opt.step()
        np.testing.assert_allclose(ours, theirs.item(), rtol=1e-4)
    state = step.state_dict()
    np.testing.assert_allclose(state["1.running_var"], twin[1].running_var.numpy(), rtol=1e-4)
    np.testing.assert_allclose(state["0.weight"], twin[0].weight.detach().numpy(), rtol=1e-4, atol=1e-6)
    step.save(tmp_path / "ckpt.safetensors")
    step.load_state_dict({k: np.zeros_like(v) for k, v in state.items()})  # scramble, then restore
    step.load(tmp_path / "ckpt.safetensors")
    np.testing.assert_array_equal(step.state_dict()["1.running_mean"], state["1.running_mean"])
