"""g2p-en's GRU seq2seq in luminar against the package's own numpy reference (G2p.predict in its g2p.py).

The package is not imported the normal way (its __init__ downloads nltk data): its g2p.py is loaded
from the installed file with importlib, with stand-ins for nltk and for its number-spelling module,
which predict() does not use.
"""
import importlib.metadata
import importlib.util
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import luminar as lm
from luminar.models.g2p import load_g2p, read_checkpoint

pytestmark = pytest.mark.slow

WORDS = ["activationist", "luminar", "recurrent", "zebra", "gru", "tensorflow", "quixotic", "xylophone",
         "phthalate", "supercalifragilistic", "a", "naïve", "o'brien", "nvidia"]


def package_reference(monkeypatch):
    """An instance of g2p-en's own G2p class, from its installed g2p.py."""
    source = Path(str(importlib.metadata.distribution("g2p-en").locate_file("g2p_en/g2p.py")))
    nltk = types.ModuleType("nltk")
    nltk.pos_tag = lambda words: [(w, "NN") for w in words]
    nltk.data = types.SimpleNamespace(find=lambda name: name)  # "already downloaded": no download
    nltk.download = lambda name: pytest.fail(f"g2p.py tried to download {name}")
    corpus, tokenize = types.ModuleType("nltk.corpus"), types.ModuleType("nltk.tokenize")
    corpus.cmudict = types.SimpleNamespace(dict=dict)  # an empty CMU dictionary: every word goes to the network
    tokenize.TweetTokenizer = lambda: types.SimpleNamespace(tokenize=str.split)
    package = types.ModuleType("g2p_en")
    package.__path__ = [str(source.parent)]
    expand = types.ModuleType("g2p_en.expand")
    expand.normalize_numbers = lambda text: text
    for name, module in {"nltk": nltk, "nltk.corpus": corpus, "nltk.tokenize": tokenize, "g2p_en": package,
                         "g2p_en.expand": expand}.items():
        monkeypatch.setitem(sys.modules, name, module)
    spec = importlib.util.spec_from_file_location("g2p_en.g2p", source)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "g2p_en.g2p", module)
    spec.loader.exec_module(module)
    return module.G2p()


@pytest.fixture(scope="module")
def reference():
    with pytest.MonkeyPatch.context() as monkeypatch:
        return package_reference(monkeypatch)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_phonemes_equal_the_packages_numpy_reference(reference, backend):
    g2p = load_g2p(backend=backend)
    words = WORDS if backend == "cpu" else WORDS[:4]  # the numpy interpreter is slow; four words suffice there
    for word in words:
        assert g2p.predict(word) == reference.predict(word), word


def test_example_prints_the_references_phonemes(reference):
    example = Path(__file__).resolve().parent.parent / "examples" / "g2p.py"
    result = subprocess.run([sys.executable, str(example), "Activationist", "quixotic"], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"{w} {' '.join(reference.predict(w.lower()))}"
                                          for w in ("Activationist", "quixotic")]


def test_bad_checkpoints_and_words_raise_luminar_errors(tmp_path):
    with pytest.raises(lm.WeightFileError, match="no such file"):
        read_checkpoint(tmp_path / "missing.npz")
    good = Path(str(importlib.metadata.distribution("g2p-en").locate_file("g2p_en/checkpoint20.npz")))
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(good.read_bytes()[:100_000])
    with pytest.raises(lm.WeightFileError, match="not a readable .npz"):
        read_checkpoint(truncated)
    arrays = dict(np.load(good))
    arrays["fc_w"] = arrays["fc_w"][:, :10]
    np.savez(tmp_path / "wrong.npz", **arrays)
    with pytest.raises(lm.WeightFileError, match=r"'fc_w' has shape \(74, 10\), expected \(74, 256\)"):
        read_checkpoint(tmp_path / "wrong.npz")
    del arrays["dec_emb"]
    np.savez(tmp_path / "incomplete.npz", **arrays)
    with pytest.raises(lm.WeightFileError, match="missing array 'dec_emb'"):
        read_checkpoint(tmp_path / "incomplete.npz")
    with pytest.raises(lm.InputError, match="non-empty word"):
        load_g2p(backend="reference").predict("")
