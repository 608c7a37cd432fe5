"""English grapheme-to-phoneme conversion with g2p-en's GRU sequence-to-sequence model.

    from luminar.models.g2p import load_g2p
    g2p = load_g2p()                   # checkpoint20.npz from the g2p-en package (located, not imported)
    g2p.predict("activationist")       # ['AE2', 'K', 'T', 'AH0', 'V', 'EY1', 'SH', 'AH0', 'N', 'IH0', 'S', 'T']

The model (Park & Kim's g2p, weights in g2p-en's ``checkpoint20.npz``):

- encoder: the word's letters and ``</s>`` as ids into 29 graphemes (``<pad> <unk> </s> a..z``),
  a 256-wide embedding, one GRU layer of 256 (torch's gate order r, z, n) from a zero state (the
  sizes are read from the file; g2p.py's comments say 64 and 128, the file holds 256 and 256);
- decoder: greedy, from ``<s>`` and the encoder's last state: a GRU cell on the embedding of the
  previous phoneme, a linear layer to 74 phoneme logits, argmax, until ``</s>`` or 20 phonemes.

This is only the neural part of g2p-en (its ``G2p.predict``, for words outside the CMU
dictionary); the package's text normalization, part-of-speech homograph rules and dictionary
lookup need nltk data and are not reproduced. Letters outside a..z map to ``<unk>``, as there.

How it runs: the encoder is an `nn.GRU` stepped by `nn.SequenceRunner` (any word length, no
recompiling), after one embedding program with a symbolic length; the decoder is one compiled step
(GRUCell, Linear, argmax) called per phoneme, since each input is the previous step's argmax.
"""
from __future__ import annotations

import importlib.metadata
import os
import zipfile

import numpy as np

from .. import nn
from ..errors import InputError, WeightFileError
from ..graph import Graph
from ..library.indexing import embedding
from ..library.reduce import argmax

GRAPHEMES = ["<pad>", "<unk>", "</s>"] + list("abcdefghijklmnopqrstuvwxyz")
PHONEMES = ["<pad>", "<unk>", "<s>", "</s>"] + [
    "AA0", "AA1", "AA2", "AE0", "AE1", "AE2", "AH0", "AH1", "AH2", "AO0", "AO1", "AO2", "AW0", "AW1", "AW2",
    "AY0", "AY1", "AY2", "B", "CH", "D", "DH", "EH0", "EH1", "EH2", "ER0", "ER1", "ER2", "EY0", "EY1", "EY2",
    "F", "G", "HH", "IH0", "IH1", "IH2", "IY0", "IY1", "IY2", "JH", "K", "L", "M", "N", "NG", "OW0", "OW1",
    "OW2", "OY0", "OY1", "OY2", "P", "R", "S", "SH", "T", "TH", "UH0", "UH1", "UH2", "UW", "UW0", "UW1", "UW2",
    "V", "W", "Y", "Z", "ZH"]
START, END = PHONEMES.index("<s>"), PHONEMES.index("</s>")
MAX_PHONEMES = 20  # g2p-en's decoder stops after 20 steps


def checkpoint_shapes(embed: int, hidden: int) -> dict[str, tuple]:
    """Checkpoint key -> shape for an embedding width and GRU size (g2p-en's file: 256 and 256; its
    source comments say 64 and 128). The GRUs' arrays are torch's weight_ih / weight_hh / bias_ih / bias_hh."""
    gru = {"w_ih": (3 * hidden, embed), "w_hh": (3 * hidden, hidden), "b_ih": (3 * hidden,), "b_hh": (3 * hidden,)}
    return {"enc_emb": (len(GRAPHEMES), embed), **{f"enc_{k}": v for k, v in gru.items()},
            "dec_emb": (len(PHONEMES), embed), **{f"dec_{k}": v for k, v in gru.items()},
            "fc_w": (len(PHONEMES), hidden), "fc_b": (len(PHONEMES),)}


def default_checkpoint() -> str:
    """The path of checkpoint20.npz inside the installed g2p-en package (which is not imported:
    its __init__ downloads nltk data)."""
    try:
        path = str(importlib.metadata.distribution("g2p-en").locate_file("g2p_en/checkpoint20.npz"))
    except importlib.metadata.PackageNotFoundError:
        raise WeightFileError("the g2p-en package is not installed (pip install --no-deps g2p-en), "
                              "or pass the path of its checkpoint20.npz") from None
    return path


def read_checkpoint(path) -> dict[str, np.ndarray]:
    """The twelve float32 arrays of a g2p-en checkpoint, checked by name and shape."""
    path = os.fspath(path)
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except FileNotFoundError:
        raise WeightFileError(f"{path}: no such file") from None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise WeightFileError(f"{path}: not a readable .npz checkpoint ({e})") from None
    for name in ("enc_emb", "enc_w_hh"):
        if name not in arrays or arrays[name].ndim != 2:
            raise WeightFileError(f"{path}: missing 2-D array {name!r} (has {sorted(arrays)})")
    expected = checkpoint_shapes(arrays["enc_emb"].shape[1], arrays["enc_w_hh"].shape[1])
    for name, shape in expected.items():
        if name not in arrays:
            raise WeightFileError(f"{path}: missing array {name!r} (has {sorted(arrays)})")
        if arrays[name].shape != shape:
            raise WeightFileError(f"{path}: array {name!r} has shape {arrays[name].shape}, expected {shape}")
    return {name: np.asarray(arrays[name], np.float32) for name in expected}


class G2P:
    """The g2p-en network compiled for `backend`: `predict(word)` -> list of ARPAbet phonemes."""

    def __init__(self, weights: dict[str, np.ndarray], backend: str = "cpu"):
        embed, hidden = weights["enc_emb"].shape[1], weights["enc_w_hh"].shape[1]
        self.encoder = nn.GRU(embed, hidden)
        self.encoder.load_state_dict({"weight_ih_l0": weights["enc_w_ih"], "weight_hh_l0": weights["enc_w_hh"],
                                      "bias_ih_l0": weights["enc_b_ih"], "bias_hh_l0": weights["enc_b_hh"]})
        self.runner = nn.SequenceRunner(self.encoder.eval(), backend)
        self.decoder = nn.GRUCell(embed, hidden, prefix="decoder")
        self.decoder.load_state_dict({"weight_ih": weights["dec_w_ih"], "weight_hh": weights["dec_w_hh"],
                                      "bias_ih": weights["dec_b_ih"], "bias_hh": weights["dec_b_hh"]})
        self.classifier = nn.Linear(hidden, len(PHONEMES), prefix="classifier")
        self.classifier.load_state_dict({"weight": weights["fc_w"], "bias": weights["fc_b"]})

        g = Graph()  # the encoder's embedding: a word of any length -> (s, 1, embed)
        ids = g.tensor("ids", ("s",), "int32")
        embedding(ids, g.tensor("table", (len(GRAPHEMES), embed))).unsqueeze(1).output("embedded")
        self.embed = g.compile(backend).set_inputs(table=weights["enc_emb"])

        g = Graph()  # one decoder step: previous phoneme id and state -> next id and state
        previous, h = g.tensor("previous", (1,), "int32"), g.tensor("h", (1, hidden))
        h_next = self.decoder(embedding(previous, g.tensor("table", (len(PHONEMES), embed))), h)
        h_next.output("h_next")
        argmax(self.classifier(h_next), -1).output("phoneme")
        self.step = g.compile(backend).set_inputs({"table": weights["dec_emb"], **self.decoder.inputs(g),
                                                   **self.classifier.inputs(g)})

    def grapheme_ids(self, word: str) -> np.ndarray:
        if not isinstance(word, str) or not word:
            raise InputError(f"g2p: expected a non-empty word, got {word!r}")
        unknown = GRAPHEMES.index("<unk>")
        return np.array([GRAPHEMES.index(ch) if ch in GRAPHEMES[3:] else unknown for ch in word]
                        + [GRAPHEMES.index("</s>")], np.int32)

    def predict(self, word: str) -> list[str]:
        """The phonemes g2p-en's network predicts for `word` (lower-case letters; others count as <unk>)."""
        embedded = self.embed(ids=self.grapheme_ids(word))["embedded"]
        _, h = self.runner(embedded)
        h, previous, phonemes = h[0], START, []
        for _ in range(MAX_PHONEMES):
            result = self.step(previous=np.array([previous], np.int32), h=h)
            h, previous = result["h_next"], int(result["phoneme"][0])
            if previous == END:
                break
            phonemes.append(PHONEMES[previous])
        return phonemes


def load_g2p(path=None, backend: str = "cpu") -> G2P:
    """g2p-en's model from `path` (default: the installed package's checkpoint20.npz)."""
    return G2P(read_checkpoint(default_checkpoint() if path is None else path), backend)
