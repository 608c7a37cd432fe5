"""Train a tiny character-level transformer with luminar (cpu backend), plot its loss, sample text.

    .venv/bin/python examples/train_charlm.py                         # about a minute
    .venv/bin/python examples/train_charlm.py --steps 300 --out loss.png --corpus my_text.txt

The model: token embedding + learned position embedding, `nn.TransformerEncoderLayer`s (one by
default, --layers 2 for two; pre-norm, causal self-attention with 4 heads, GELU feed-forward),
a final LayerNorm and a linear head over the characters, trained with cross-entropy to predict
each next character.

The corpus (unless --corpus names a text file) is generated here by a small deterministic
grammar: about 40 KB of sentences about a harbour town, so the example needs no download
and the text is the same on every machine. A model that has learned it spells the words,
puts articles before nouns and ends sentences with a full stop.

Training is one compiled program (`luminar.optim.TrainStep`): forward, loss, gradients,
gradient clipping and the AdamW update with a warm-up + cosine schedule. A second graph, in
eval mode with symbolic batch and length dims ("b", "t"), scores held-out text and samples:
the same compiled program takes any batch and any context length up to --context.

Each step trains on --batch-size windows of --context characters; the default is a single
window of 128. (Batches of several windows work but are much slower today: the weight gradients
then sum over two axes, batch and position, and the cpu backend's tiled matmul schedule only
applies to single-axis reductions; see bench/TRAIN.md.) The kernels run on --threads threads
(default 1): each kernel of this small model takes well under a millisecond, and on a machine
shared with other work a two-thread parallel region stalls whenever one of its threads is
descheduled, which made steps about 5x slower than one thread in our measurements.

The loss curve goes to --out (a PNG; default charlm_loss.png in the system's temporary folder).
The last line printed is the final loss, e.g.

    final loss: train 0.460, validation 0.530 nats/char (3.906 before training)
"""
from __future__ import annotations

import argparse
import math
import os
import random
import sys
import tempfile
import time

import numpy as np

import luminar as lm
import luminar.nn as nn
from luminar.optim import AdamW, TrainStep, warmup_cosine

DEFAULT_OUT = os.path.join(tempfile.gettempdir(), "charlm_loss.png")


# -- the corpus: a deterministic grammar -----------------------------------------------------------
WORDS = {
    "name": "Mara Tomas Ilse Ben Orla Pieter Nadia Ruth Anselm Kit".split(),
    "noun": ("keeper fisherman baker girl sailor teacher ferryman widow boy captain harbourmaster "
             "painter dog cat gull").split(),
    "thing": ("lamp boat net letter bell window rope kettle map lantern basket door ladder coat "
              "anchor loaf book").split(),
    "place": ("harbour lighthouse market quay chapel bakery school tavern beach square bridge "
              "breakwater").split(),
    "adjective": ("old young quiet tired cheerful small grey wet heavy bright narrow careful patient "
                  "restless salty").split(),
    "intransitive": "slept|waited|laughed|sang|listened|worked|walked home|shivered|whistled".split("|"),
    "transitive": "mended carried painted opened found lost polished sold lit counted dropped".split(),
    "adverb": "slowly|quietly|early|carefully|again|gladly|at last|once more".split("|"),
    "time": ("in the morning|before the storm|after supper|at dawn|all night|on Sunday|when the tide "
             "turned|while the bell rang|before the ferry came").split("|"),
    "weather": ("the wind rose|the rain stopped|fog covered the bay|the tide came in|the gulls "
                "cried|the lamps were lit|snow fell on the roofs").split("|"),
    "saying": ("the sea gives and the sea takes|bring the lamp inside|the ferry is late again|mend "
               "the net before dark|we will sail at dawn|the bread is still warm").split("|"),
}


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _noun_phrase(rng: random.Random, kind: str, definite: bool | None = None) -> str:
    """'the old keeper', 'an empty basket', or a name (for people)."""
    if kind == "noun" and rng.random() < 0.3:
        return rng.choice(WORDS["name"])
    words = ([rng.choice(WORDS["adjective"])] if rng.random() < 0.5 else []) + [rng.choice(WORDS[kind])]
    definite = rng.random() < 0.6 if definite is None else definite
    return " ".join(["the" if definite else _article(words[0]), *words])


def _clause(rng: random.Random) -> str:
    subject = _noun_phrase(rng, "noun", definite=True)
    if rng.random() < 0.55:
        verb = f"{rng.choice(WORDS['transitive'])} {_noun_phrase(rng, 'thing')}"
    else:
        verb = rng.choice(WORDS["intransitive"])
    parts = [subject, verb]
    if rng.random() < 0.35:
        parts.append(rng.choice(WORDS["adverb"]))
    if rng.random() < 0.5:
        parts.append(f"{rng.choice(['at', 'near', 'behind', 'by'])} the {rng.choice(WORDS['place'])}")
    if rng.random() < 0.3:
        parts.append(rng.choice(WORDS["time"]))
    return " ".join(parts)


def _sentence(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.12:
        text = f'"{rng.choice(WORDS["saying"]).capitalize()}," said {_noun_phrase(rng, "noun", definite=True)}'
    elif roll < 0.22:
        text = f"{rng.choice(WORDS['weather'])}, and {_clause(rng)}"
    elif roll < 0.45:
        text = f"{_clause(rng)} {rng.choice(['and', 'but', 'while', 'because'])} {_clause(rng)}"
    else:
        text = _clause(rng)
    return text[0].upper() + text[1:] + "."


def grammar_corpus(chars: int = 40_000, seed: int = 0) -> str:
    """Paragraphs of 3 to 6 generated sentences, about `chars` characters, the same for a seed."""
    rng = random.Random(seed)
    paragraphs, size = [], 0
    while size < chars:
        paragraph = " ".join(_sentence(rng) for _ in range(rng.randint(3, 6)))
        paragraphs.append(paragraph)
        size += len(paragraph) + 2
    return "\n\n".join(paragraphs) + "\n"


# -- the model --------------------------------------------------------------------------------------
class CharTransformer(nn.Module):
    """Embeddings, causal TransformerEncoderLayers, LayerNorm and a linear head: (B, T) ids -> (B, T, V) logits.

    The same layers in torch.nn, with the same forward, give the same function (state-dict keys
    match): bench/train.py builds that twin.
    """

    def __init__(self, vocab: int, context: int, width: int = 64, heads: int = 4, layers: int = 2, *, rng=None):
        super().__init__()
        rng = np.random.default_rng(rng)
        self.context = context
        self.tok = nn.Embedding(vocab, width, rng=rng)
        self.pos = nn.Embedding(context, width, rng=rng)
        self.layers = nn.ModuleList([
            nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, activation="gelu", batch_first=True,
                                       norm_first=True, rng=rng)
            for _ in range(layers)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, rng=rng)
        # torch's N(0, 1) embedding default makes the first logits large; GPT-style N(0, 0.02) trains faster
        self.tok.weight = self.tok.weight * 0.02
        self.pos.weight = self.pos.weight * 0.02

    def forward(self, ids):
        positions = ids.graph.arange(ids.dims[1])  # 0 .. T-1 (T may be symbolic)
        x = self.tok(ids) + self.pos(positions)
        for layer in self.layers:
            x = layer(x, is_causal=True)  # luminar builds the causal mask inside the graph
        return self.head(self.norm(x))


class Vocabulary:
    """Characters <-> int32 ids, sorted so the ids are the same for the same text."""

    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.ids = {c: i for i, c in enumerate(self.chars)}

    def encode(self, text: str) -> np.ndarray:
        return np.array([self.ids[c] for c in text], np.int32)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)

    def __len__(self):
        return len(self.chars)


def windows(data: np.ndarray, starts: np.ndarray, context: int) -> tuple[np.ndarray, np.ndarray]:
    """Inputs data[s : s+context] and targets data[s+1 : s+context+1] for every start s."""
    rows = starts[:, None] + np.arange(context + 1)[None, :]
    chunk = data[rows]
    return chunk[:, :-1], chunk[:, 1:]


# -- training, evaluation, sampling ----------------------------------------------------------------
def build_trainer(model: CharTransformer, batch_size: int, steps: int, lr: float) -> tuple[TrainStep, lm.Graph]:
    """The compiled training step on (batch_size, context) windows: AdamW, warm-up + cosine, clipping."""
    model.train()
    graph = lm.Graph()
    ids = graph.tensor("ids", (batch_size, model.context), "int32")
    targets = graph.tensor("targets", (batch_size, model.context), "int32")
    logits = model(ids)
    vocab = logits.dims[-1]
    loss = lm.cross_entropy(logits.reshape(batch_size * model.context, vocab), targets.reshape(-1))
    optimizer = AdamW(lr=lr, betas=(0.9, 0.99), weight_decay=0.01)
    schedule = warmup_cosine(optimizer, warmup_steps=max(1, steps // 20), total_steps=steps)
    step = TrainStep.for_module(model, loss, optimizer, schedule=schedule, max_grad_norm=1.0)
    return step, graph


class Predictor:
    """The model in eval mode, compiled once with symbolic batch and length: (b, t) ids -> logits."""

    def __init__(self, model: CharTransformer):
        model.eval()
        self.model, self.graph = model, lm.Graph()
        model(self.graph.tensor("ids", ("b", "t"), "int32")).output("logits")
        self.program = self.graph.compile("cpu")
        model.train()

    def load(self, trainer: TrainStep, train_graph: lm.Graph) -> None:
        """Take the trainer's current weights."""
        self.model.load_program_state(trainer.program, train_graph)
        self.program.set_inputs(self.model.inputs(self.graph))

    def loss(self, ids: np.ndarray, targets: np.ndarray) -> float:
        """Mean cross-entropy (nats per character) of predicting `targets` from `ids`."""
        logits = self.program(ids=ids)["logits"].astype(np.float64)
        logits -= logits.max(-1, keepdims=True)
        log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        return float(-np.take_along_axis(log_probs, targets[..., None].astype(np.int64), -1).mean())

    def sample(self, prompt: np.ndarray, count: int, temperature: float, rng: np.random.Generator) -> np.ndarray:
        """`count` new ids after `prompt`, each drawn from softmax(logits / temperature) of the last
        position (no cache: every step reruns the model on the last `context` ids)."""
        ids = list(prompt)
        for _ in range(count):
            window = np.array(ids[-self.model.context:], np.int32)[None]
            logits = self.program(ids=window)["logits"][0, -1].astype(np.float64) / temperature
            probs = np.exp(logits - logits.max())
            ids.append(int(rng.choice(len(probs), p=probs / probs.sum())))
        return np.array(ids[len(prompt):], np.int32)


def use_threads(threads: int) -> None:
    """Run luminar's kernels on `threads` OpenMP threads (0: leave OMP_NUM_THREADS as it is).

    OpenMP reads the variable when the first compiled program loads, so call this before compiling."""
    if threads > 0:
        os.environ["OMP_NUM_THREADS"] = str(threads)


def plot_losses(path: str, steps: list[int], losses: list[float], val_steps: list[int], val_losses: list[float],
                title: str) -> None:
    """The training loss (per step, and smoothed) and the validation loss, as a PNG."""
    import matplotlib
    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    ax.plot(steps, losses, color="tab:blue", alpha=0.25, linewidth=0.8, label="train (per step)")
    width = max(1, len(losses) // 50)
    smooth = np.convolve(losses, np.ones(width) / width, mode="valid")
    ax.plot(steps[width - 1:], smooth, color="tab:blue", label=f"train (mean of {width} steps)")
    ax.plot(val_steps, val_losses, "o-", color="tab:orange", label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats per character)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=8000, help="training steps (default 8000)")
    p.add_argument("--batch-size", type=int, default=1, help="windows per step (default 1; see above)")
    p.add_argument("--context", type=int, default=128, help="characters per window (default 128)")
    p.add_argument("--width", type=int, default=64, help="model width (default 64)")
    p.add_argument("--layers", type=int, default=1, help="transformer layers (default 1)")
    p.add_argument("--lr", type=float, default=2e-3, help="AdamW's peak learning rate (default 2e-3)")
    p.add_argument("--seed", type=int, default=0, help="initial weights, window order and sampling (default 0)")
    p.add_argument("--corpus", default=None, help="a UTF-8 text file to train on (default: the generated grammar)")
    p.add_argument("--evals", type=int, default=10, help="validation-loss measurements during training")
    p.add_argument("--sample", type=int, default=300, help="characters to sample at the end (default 300)")
    p.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (default 0.8)")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"loss-curve PNG (default {DEFAULT_OUT})")
    p.add_argument("--threads", type=int, default=1, help="threads for luminar's kernels (OMP_NUM_THREADS; "
                   "default 1, see above; 0 keeps the environment's setting)")
    args = p.parse_args(argv)
    if args.threads < 0:
        p.error("--threads must be >= 0")
    for name in ("steps", "batch_size", "context", "width", "layers", "evals"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.temperature <= 0:
        p.error("--temperature must be > 0")
    return args


def load_text(path: str | None) -> str:
    """The training text: a UTF-8 file, or the generated grammar corpus."""
    if path is None:
        return grammar_corpus(seed=0)
    with open(path, encoding="utf-8") as f:
        return f.read()


def train(args, trainer: TrainStep, graph: lm.Graph, predictor: Predictor, train_data: np.ndarray,
          validation: tuple[np.ndarray, np.ndarray], rng: np.random.Generator) -> dict:
    """Run args.steps training steps on random windows of `train_data`, measuring the validation
    loss args.evals times; returns the curves {"steps", "losses", "val_steps", "val_losses"}."""
    predictor.load(trainer, graph)
    curves = {"steps": [], "losses": [], "val_steps": [0], "val_losses": [predictor.loss(*validation)]}
    eval_every = max(1, args.steps // args.evals)
    started = time.perf_counter()
    for step in range(1, args.steps + 1):
        starts = rng.integers(0, len(train_data) - args.context - 1, args.batch_size)
        ids, targets = windows(train_data, starts, args.context)
        curves["steps"].append(step)
        curves["losses"].append(trainer.step({"ids": ids, "targets": targets}))
        if step % eval_every == 0 or step == args.steps:
            predictor.load(trainer, graph)
            curves["val_steps"].append(step)
            curves["val_losses"].append(predictor.loss(*validation))
            print(f"step {step:5d}: train loss {np.mean(curves['losses'][-eval_every:]):.3f}, "
                  f"validation {curves['val_losses'][-1]:.3f}, lr {trainer.last_lr:.2e}, "
                  f"{time.perf_counter() - started:.1f} s")
    seconds = time.perf_counter() - started
    print(f"trained {args.steps} steps in {seconds:.1f} s ({seconds / args.steps * 1e3:.1f} ms per step of "
          f"{args.batch_size}x{args.context} characters)")
    curves["final_train_loss"] = float(np.mean(curves["losses"][-eval_every:]))
    return curves


def main(argv=None) -> None:
    args = parse_args(argv)
    use_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    text = load_text(args.corpus)
    vocab = Vocabulary(text)
    data = vocab.encode(text)
    split = int(len(data) * 0.9)
    train_data, val_data = data[:split], data[split:]
    if len(val_data) <= args.context + 1:
        sys.exit(f"the corpus ({len(text)} characters) is too short for --context {args.context}")
    validation = windows(val_data, np.arange(0, len(val_data) - args.context - 1, args.context), args.context)
    print(f"corpus: {len(text):,} characters ({len(vocab)} distinct), {len(train_data):,} for training, "
          f"{len(val_data):,} for validation")

    model = CharTransformer(len(vocab), args.context, args.width, layers=args.layers, rng=args.seed)
    parameters = sum(p.size for p in model.parameters())
    started = time.perf_counter()
    trainer, graph = build_trainer(model, args.batch_size, args.steps, args.lr)
    predictor = Predictor(model)
    print(f"model: {parameters:,} parameters; compiled in {time.perf_counter() - started:.1f} s")

    curves = train(args, trainer, graph, predictor, train_data, validation, rng)
    first, last = curves["val_losses"][0], curves["val_losses"][-1]
    if not (math.isfinite(last) and last < first):
        sys.exit(f"the validation loss did not decrease ({first:.3f} -> {last:.3f}): training is broken")
    plot_losses(args.out, curves["steps"], curves["losses"], curves["val_steps"], curves["val_losses"],
                f"character transformer, {parameters:,} parameters")
    print(f"loss curve: {args.out}")
    prompt = vocab.encode(text[:1])
    sample = predictor.sample(prompt, args.sample, args.temperature, rng)
    print("sample:\n" + vocab.decode(prompt) + vocab.decode(sample))
    print(f"final loss: train {curves['final_train_loss']:.3f}, validation {last:.3f} nats/char "
          f"({first:.3f} before training)")


if __name__ == "__main__":
    main()
