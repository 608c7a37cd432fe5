"""luminar.nn: PyTorch-style modules whose forward passes build luminar graphs.

Parameters are numpy float32 arrays held by the modules; applying a module to a GraphTensor
declares the parameters it reads as graph inputs (see module.py for the naming rule and the
helpers inputs(), parameter_tensors(), load_program_state()). State dicts use torch's names and
shapes, so torch weights load directly.

    import numpy as np
    import luminar as lm
    import luminar.nn as nn

    model = nn.Sequential(nn.Linear(4, 16, rng=0), nn.ReLU(), nn.Linear(16, 3, rng=0))
    g = lm.Graph()
    x, labels = g.tensor("x", ("b", 4)), g.tensor("labels", ("b",), "int32")
    loss = lm.cross_entropy(model(x), labels).output("loss")
    params = model.parameter_tensors(g)            # {"0.weight": GraphTensor, ...}: differentiate these
    # ... an optimizer adds g.update(params[name], new_value) for each ...
    program = g.compile("cpu").set_inputs(model.inputs(g))   # weights as inputs named "_0__weight", ...
    program(x=np.zeros((8, 4), np.float32), labels=np.zeros(8, np.int32))
    model.load_program_state(program, g)           # the updated weights back into the model
"""
from . import functional, init
from .attention import MultiheadAttention, TransformerEncoderLayer
from .dropout import Dropout
from .layers import (GELU, Conv2d, Embedding, Flatten, Identity, Linear, MaxPool2d, ReLU, Sigmoid, SiLU, Tanh)
from .loss import (BCEWithLogitsLoss, CrossEntropyLoss, HuberLoss, KLDivLoss, L1Loss, MSELoss, NLLLoss,
                   SmoothL1Loss)
from .module import IncompatibleKeys, Module, ModuleList, Parameter, Sequential, input_name
from .norm import BatchNorm2d, LayerNorm
from .rnn import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNCell, SequenceRunner

__all__ = ["Module", "Parameter", "Sequential", "ModuleList", "IncompatibleKeys", "input_name",
           "Linear", "Conv2d", "Embedding", "Identity", "ReLU", "GELU", "Sigmoid", "Tanh", "SiLU", "Flatten",
           "MaxPool2d", "Dropout", "BatchNorm2d", "LayerNorm", "MultiheadAttention", "TransformerEncoderLayer",
           "MSELoss", "L1Loss", "SmoothL1Loss", "HuberLoss", "CrossEntropyLoss", "NLLLoss", "BCEWithLogitsLoss",
           "KLDivLoss", "RNN", "LSTM", "GRU", "RNNCell", "LSTMCell", "GRUCell", "SequenceRunner",
           "functional", "init"]
