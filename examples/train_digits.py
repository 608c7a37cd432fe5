"""Train an MLP and a small CNN on scikit-learn's digits with luminar (cpu backend).

    .venv/bin/python examples/train_digits.py                  # both models, the defaults
    .venv/bin/python examples/train_digits.py --epochs 2 --seed 3 --models cnn

The data: the 1,797 8x8 grey-level digit images bundled with scikit-learn, split once into
1,347 training and 450 test images (stratified, fixed split seed, whatever --seed says).

Each model trains through one compiled program (`luminar.optim.TrainStep`): forward pass,
cross-entropy loss, gradients (`luminar.grad`) and the Adam update with a cosine learning-rate
schedule are a single graph, compiled once to C. Parameters, Adam's moments and BatchNorm's
running statistics live in the program between steps. Testing uses a second graph built in
eval mode (BatchNorm reads its running statistics) with a symbolic batch dim, so one compiled
program scores any number of images (here the whole test set in one call).

The kernels run on --threads threads (default 1): they are tiny, and on a machine shared with
other work a two-thread parallel region stalls whenever one of its threads is descheduled
(steps were 3-6x slower than with one thread in our measurements). 0 keeps OMP_NUM_THREADS.

The script checks that training worked (the loss of the last steps is below the loss of the
first ones) and prints the test accuracy of both models as its last line:

    test accuracy: mlp 96.9%, cnn 98.4%

Because luminar.nn mirrors torch.nn, `mlp(nn)` and `cnn(nn)` build the same architecture from
either module: the tests and the training benchmark (bench/train.py) build the PyTorch twin
with `cnn(torch.nn)` and load luminar's initial weights into it.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

import luminar as lm
import luminar.nn as lnn
from luminar.optim import Adam, CosineAnnealingLR, TrainStep

SPLIT_SEED = 0  # the train/test split never changes, so accuracies are comparable across --seed
TEST_FRACTION = 0.25
CLASSES = 10


# -- data ----------------------------------------------------------------------------------------
def load_data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test): images (N, 1, 8, 8) float32 in [0, 1], labels int32."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None]  # grey levels are 0..16
    labels = digits.target.astype(np.int32)
    x_train, x_test, y_train, y_test = train_test_split(images, labels, test_size=TEST_FRACTION,
                                                        random_state=SPLIT_SEED, stratify=labels)
    return x_train, y_train, x_test, y_test


def batches(count: int, batch_size: int, rng: np.random.Generator):
    """Index arrays of one shuffled epoch, full batches only (torch's DataLoader with drop_last=True):
    the training graph has a fixed batch size, and every sample is seen over the epochs."""
    order = rng.permutation(count)
    for start in range(0, count - batch_size + 1, batch_size):
        yield order[start:start + batch_size]


# -- models: the same code builds luminar's and torch's ---------------------------------------------
def mlp(nn, **init):
    """64 -> 128 -> 10 with ReLU. `nn` is luminar.nn or torch.nn; `init` goes to the weighted
    layers (luminar's rng=...; torch takes none)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 128, **init), nn.ReLU(), nn.Linear(128, CLASSES, **init))


def cnn(nn, **init):
    """Two 3x3 conv blocks (conv, batch norm, ReLU, 2x2 max pool: 8x8 -> 4x4 -> 2x2) and a linear
    classifier on the 32 x 2 x 2 features."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1, **init), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1, **init), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 2 * 2, CLASSES, **init))


MODELS = {"mlp": mlp, "cnn": cnn}


# -- training ------------------------------------------------------------------------------------
def train_step(model, batch_size: int, optimizer, schedule=None) -> tuple[TrainStep, lm.Graph]:
    """The compiled training step of `model` (in training mode) on batches of `batch_size`.

    Returns the TrainStep and its graph (to copy the trained state back into the model with
    `model.load_program_state(step.program, graph)`)."""
    model.train()
    graph = lm.Graph()
    images = graph.tensor("images", (batch_size, 1, 8, 8))
    labels = graph.tensor("labels", (batch_size,), "int32")
    loss = lm.cross_entropy(model(images), labels)
    # parameters are trained; BatchNorm's running statistics are carried as state the graph updates
    step = TrainStep.for_module(model, loss, optimizer, schedule=schedule)
    return step, graph


class Evaluator:
    """The model in eval mode as one compiled graph with a symbolic batch dim: logits for any N."""

    def __init__(self, model):
        model.eval()
        self.model, self.graph = model, lm.Graph()
        images = self.graph.tensor("images", ("n", 1, 8, 8))
        model(images).output("logits")
        self.program = self.graph.compile("cpu")
        model.train()

    def accuracy(self, images: np.ndarray, labels: np.ndarray) -> float:
        """Fraction of `images` classified as `labels`, with the model's current weights."""
        self.program.set_inputs(self.model.inputs(self.graph))
        logits = self.program(images=images)["logits"]
        return float(np.mean(logits.argmax(1) == labels))


def check_loss_decreased(name: str, losses: list[float]) -> None:
    """Training must have worked: the mean loss of the last tenth of the steps is below the first tenth's."""
    k = max(1, len(losses) // 10)
    first, last = float(np.mean(losses[:k])), float(np.mean(losses[-k:]))
    if not np.isfinite(losses).all() or not last < first:
        sys.exit(f"{name}: the training loss did not decrease (first {k} steps {first:.4f}, "
                 f"last {k} steps {last:.4f}); training is broken")


def train(name: str, data, epochs: int, batch_size: int, lr: float, seed: int, log=print) -> dict:
    """Train model `name` on `data`; returns its final test accuracy, losses and timings."""
    x_train, y_train, x_test, y_test = data
    rng = np.random.default_rng(seed)
    model = MODELS[name](lnn, rng=rng)
    steps_per_epoch = len(x_train) // batch_size
    optimizer = Adam(lr=lr)
    schedule = CosineAnnealingLR(optimizer, T_max=epochs * steps_per_epoch)
    started = time.perf_counter()
    step, graph = train_step(model, batch_size, optimizer, schedule)
    evaluator = Evaluator(model)
    compiled = time.perf_counter()
    losses = []
    for epoch in range(1, epochs + 1):
        for index in batches(len(x_train), batch_size, rng):
            losses.append(step.step({"images": x_train[index], "labels": y_train[index]}))
        model.load_program_state(step.program, graph)  # trained weights and running statistics
        accuracy = evaluator.accuracy(x_test, y_test)
        log(f"{name} epoch {epoch:2d}: loss {np.mean(losses[-steps_per_epoch:]):.4f}, "
            f"test accuracy {accuracy:.1%}")
    trained = time.perf_counter()
    check_loss_decreased(name, losses)
    log(f"{name}: {sum(p.size for p in model.parameters()):,} parameters, compile {compiled - started:.1f} s, "
        f"train {trained - compiled:.1f} s ({(trained - compiled) / len(losses) * 1e3:.2f} ms per step "
        f"of {batch_size} images)")
    return {"accuracy": accuracy, "losses": losses, "compile_s": compiled - started, "train_s": trained - compiled}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=15, help="passes over the training set (default 15)")
    p.add_argument("--seed", type=int, default=0, help="initial weights and batch order (default 0)")
    p.add_argument("--batch-size", type=int, default=32, help="images per training step (default 32)")
    p.add_argument("--lr", type=float, default=3e-3, help="Adam's peak learning rate, cosine-annealed to 0")
    p.add_argument("--models", default="mlp,cnn", help="comma-separated models to train (default mlp,cnn)")
    p.add_argument("--threads", type=int, default=1, help="threads for luminar's kernels (OMP_NUM_THREADS; "
                   "default 1; 0 keeps the environment's setting)")
    args = p.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in args.models if m not in MODELS]
    if unknown or not args.models:
        p.error(f"--models: choose from {', '.join(MODELS)}, got {unknown or 'none'}")
    if args.threads < 0:
        p.error("--threads must be >= 0")
    if args.epochs < 1 or args.batch_size < 2:
        p.error("--epochs must be >= 1 and --batch-size >= 2 (batch norm needs two images)")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads > 0:  # OpenMP reads it when the first compiled program loads: before compiling
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    data = load_data()
    print(f"digits: {len(data[0])} training and {len(data[2])} test images, 8x8; seed {args.seed}")
    results = {name: train(name, data, args.epochs, args.batch_size, args.lr, args.seed) for name in args.models}
    print("test accuracy: " + ", ".join(f"{name} {r['accuracy']:.1%}" for name, r in results.items()))


if __name__ == "__main__":
    main()
