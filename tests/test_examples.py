"""The training examples work end to end, and the digits CNN trains exactly like PyTorch.

The examples run in a subprocess with tiny settings (one epoch, a few dozen steps) and must
exit cleanly with their documented last line. The CNN test compiles the example's own training
step (examples/train_digits.py: `cnn`, `train_step`) and compares a few SGD steps with the same
model built from torch.nn, from the same initial weights, on the same batches.
"""
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import luminar.nn as lnn
from luminar.optim import SGD

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load_example(name: str):
    """Import examples/<name>.py as a module (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_example(name: str, *args: str, cwd: Path) -> list[str]:
    """Run an example as a script; returns its stdout lines (fails the test on a non-zero exit)."""
    result = subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py"), *args], cwd=cwd,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{name} exited with {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result.stdout.strip().splitlines()


# -- the examples, end to end ----------------------------------------------------------------------
def test_train_digits_prints_both_test_accuracies_last(tmp_path):
    lines = run_example("train_digits", "--epochs", "1", cwd=tmp_path)
    match = re.fullmatch(r"test accuracy: mlp (\d+\.\d)%, cnn (\d+\.\d)%", lines[-1])
    assert match, f"unexpected last line {lines[-1]!r}"
    # one epoch already puts both models far above chance (10%)
    assert float(match[1]) > 50 and float(match[2]) > 50, lines[-1]


def test_train_charlm_plots_its_loss_and_prints_the_final_loss_last(tmp_path):
    png = tmp_path / "loss.png"
    lines = run_example("train_charlm", "--steps", "60", "--evals", "2", "--sample", "20", "--out", str(png),
                        cwd=tmp_path)
    match = re.fullmatch(r"final loss: train (\d+\.\d+), validation (\d+\.\d+) nats/char "
                         r"\((\d+\.\d+) before training\)", lines[-1])
    assert match, f"unexpected last line {lines[-1]!r}"
    assert float(match[2]) < float(match[3])  # the script checks this too: validation loss went down
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert any(line.startswith("sample:") for line in lines)


def rl_example_result(lines: list[str], episodes: int) -> tuple[float, float, float]:
    """(evaluation return, first-iteration and last-iteration mean training return) from the output
    of examples/rl_*.py."""
    match = re.fullmatch(rf"evaluation return: (-?\d+\.\d) over {episodes} episodes \((not )?solved .*\)", lines[-1])
    assert match, f"unexpected last line {lines[-1]!r}"
    training = re.fullmatch(r"training return: (-?\d+\.\d) in the first iteration, (-?\d+\.\d) in the last",
                            lines[-3])
    assert training, f"unexpected line {lines[-3]!r}"
    return float(match[1]), float(training[1]), float(training[2])


def test_rl_cartpole_learns_in_a_few_iterations_and_prints_the_evaluation_return_last(tmp_path):
    png = tmp_path / "cartpole.png"
    lines = run_example("rl_cartpole", "--iterations", "15", "--eval-episodes", "10", "--out", str(png), cwd=tmp_path)
    evaluation, first, last = rl_example_result(lines, 10)
    # 15 iterations (7,680 steps) of PPO: a random policy lasts ~22 steps, the trained one longer
    assert last > first + 5 and evaluation > first, lines[-3:]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rl_pendulum_learns_in_a_few_iterations_and_prints_the_evaluation_return_last(tmp_path):
    png = tmp_path / "pendulum.png"
    lines = run_example("rl_pendulum", "--iterations", "8", "--envs", "16", "--steps", "200", "--eval-episodes", "10",
                        "--out", str(png), cwd=tmp_path)  # 200 steps: every iteration ends one episode per environment
    evaluation, first, last = rl_example_result(lines, 10)
    # returns lie in [-3254, 0] (cost <= 16.27 per step); a random policy averages about -1200
    assert last > first and -1700 < evaluation < 0, lines[-3:]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("name, args, message", [
    ("rl_cartpole", ["--iterations", "0"], "--iterations"),
    ("rl_cartpole", ["--steps", "30"], "--steps-per-call"),
    ("train_digits", ["--models", "resnet"], "--models"),
    ("train_digits", ["--epochs", "0"], "--epochs"),
    ("train_charlm", ["--steps", "0"], "--steps"),
    ("train_charlm", ["--temperature", "0"], "--temperature"),
])
def test_bad_command_line_options_are_rejected_with_their_name(name, args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        load_example(name).parse_args(args)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_generated_corpus_is_deterministic_english_like_text():
    charlm = load_example("train_charlm")
    text = charlm.grammar_corpus(chars=5_000, seed=1)
    assert text == charlm.grammar_corpus(chars=5_000, seed=1)
    assert text != charlm.grammar_corpus(chars=5_000, seed=2)
    assert 5_000 <= len(text) < 6_000
    vocab = charlm.Vocabulary(text)
    assert vocab.decode(vocab.encode(text)) == text


# -- the digits CNN's training step against torch --------------------------------------------------
def torch_step_losses(model, batches, lr: float, momentum: float) -> list[float]:
    import torch
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    losses = []
    for images, labels in batches:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(images)), torch.from_numpy(labels).long())
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_digits_cnn_train_steps_match_torch():
    torch = pytest.importorskip("torch")
    digits = load_example("train_digits")
    x_train, y_train, _, _ = digits.load_data()
    batch_size, lr, momentum = 32, 0.05, 0.9
    rng = np.random.default_rng(7)
    batches = [(x_train[i], y_train[i]) for i in (rng.permutation(len(x_train))[:batch_size] for _ in range(5))]

    model = digits.cnn(lnn, rng=np.random.default_rng(3))
    twin = digits.cnn(torch.nn)
    twin.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in model.state_dict().items()})
    step, graph = digits.train_step(model, batch_size, SGD(lr=lr, momentum=momentum))
    losses = [step.step({"images": images, "labels": labels}) for images, labels in batches]
    expected = torch_step_losses(twin, batches, lr, momentum)

    np.testing.assert_allclose(losses, expected, rtol=1e-4)
    # the trained weights and BatchNorm's running statistics follow torch's too
    model.load_program_state(step.program, graph)
    for name, value in twin.state_dict().items():
        np.testing.assert_allclose(model.state_dict()[name], value.float().numpy(), rtol=1e-3, atol=1e-5,
                                   err_msg=name)
