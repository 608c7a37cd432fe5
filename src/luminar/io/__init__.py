"""Weights and tokenizers from the ecosystem's files: GGUF, safetensors, tokenizer.json.

    from luminar.io import read_gguf, default_model_path, Tokenizer, weight
    model = read_gguf(default_model_path())          # SmolLM2-135M-Instruct, Q4_1
    tok = Tokenizer.from_gguf(model)
    g = lm.Graph()
    w, feeds = weight(g, "blk.0.ffn_up.weight", model.tensors["blk.0.ffn_up.weight"])

gguf.py reads GGUF (metadata + tensors still quantized), quant.py turns a stored tensor into
graph inputs plus a dequantization built from primitives, safetensors.py reads Hugging Face
checkpoints, tokenizer.py wraps the `tokenizers` package (optional dependencies: gguf,
tokenizers, jinja2 -- imported only when used).
"""
from .gguf import GGUFModel, GGUFTensor, default_model_path, read_gguf
from .quant import dense, input_name, weight
from .safetensors import load_safetensors, read_config
from .tokenizer import StreamDecoder, Tokenizer

__all__ = ["GGUFModel", "GGUFTensor", "read_gguf", "default_model_path", "weight", "dense", "input_name",
           "load_safetensors", "read_config", "Tokenizer", "StreamDecoder"]
