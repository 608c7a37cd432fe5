"""English words to ARPAbet phonemes with g2p-en's GRU seq2seq model, run by luminar.

    python examples/g2p.py activationist luminar recurrent
    activationist AE2 K T AH0 V EY1 SH AH0 N IH0 S T
    ...

One line per word: the word, then its phonemes. The weights come from the g2p-en package
(pip install --no-deps g2p-en; the package is not imported). Words are lower-cased; letters outside
a..z count as unknown, as in g2p-en's network (this is its neural predictor only, without its
dictionary lookup).
"""
import argparse
import sys

from luminar.errors import LuminarError
from luminar.models.g2p import load_g2p


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("words", nargs="+", metavar="WORD")
    parser.add_argument("--backend", default="cpu", choices=["cpu", "reference"])
    parser.add_argument("--checkpoint", default=None, help="a g2p-en checkpoint20.npz (default: the package's)")
    args = parser.parse_args(argv)
    try:
        g2p = load_g2p(args.checkpoint, args.backend)
        for word in args.words:
            print(word, " ".join(g2p.predict(word.lower())))
    except LuminarError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
