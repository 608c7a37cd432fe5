"""LLaVA: a CLIP vision transformer, a two-layer projector and a Llama decoder whose prompt holds
image tokens -- as two luminar graphs, loaded from a transformers checkpoint directory.

    model = luminar.models.load_llava("llava_dir")   # LlavaForConditionalGeneration.save_pretrained
    print(model.chat("What is in the picture?", ["cat.png"]))
    logits = model.logits(token_ids, ["cat.png"])     # (seq, vocab), image tokens as transformers expects

**Vision graph** (all images of a prompt in one call; ``n`` is a symbolic dim): pixels (n, 3, H, W)
-> patch convolution (stride = patch size) -> a class token in front, learned positions ->
pre-layer-norm -> CLIP encoder layers, up to the one `vision_feature_layer` names (-2: the
next-to-last layer's output, transformers' hidden_states[-2]) -> without the class token
("default" strategy; "full" keeps it) -> linear, GELU, linear: ``image_features`` (n, tokens,
text hidden size).

**Text graph**: the Llama decoder of models/llama.py (its RoPE, grouped-query attention and
KVCache), except that its input is not only token ids: at the image-token positions the rows of
``image_rows`` (s, hidden) -- the projected image features, placed by the host in prompt order,
as transformers' masked_scatter does -- replace the token embeddings (``is_image`` (s,) is 1
there). A decode step passes one zero row.

**Preprocessing** follows CLIPImageProcessor (its PIL backend) with the directory's
preprocessor_config.json: RGB (transparency composited onto white), the shortest edge resized to
`size.shortest_edge` with bicubic resampling, a centre crop to `crop_size`, x / 255, then
(x - mean) / std per channel. Images of 16-bit, 32-bit integer or float modes are refused.

**Prompts**: each `<image>` token in the ids is expanded to the image's feature count (ids that
already hold the expanded runs, as LlavaProcessor produces, are taken as they are). `chat`
builds "USER: <image>\\n... question ASSISTANT:" (LLaVA 1.5's format) unless the tokenizer has a
chat template.
"""
from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

import luminar as lm

from ..errors import InputError, LuminarError, ShapeError, UnsupportedError, WeightFileError
from ..graph import Graph, parse_dim
from ..tensor import GraphTensor
from .generate import Sampler, SamplingParams, generate_ids
from .llama import KVCache, LlamaConfig, Weights, _activation, _angles, _attention, _rope, rope_inv_freq

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
_REFUSED_MODES = {"I", "I;16", "I;16B", "I;16L", "I;16N", "F"}  # not 8-bit images: no faithful RGB


# -- configuration -------------------------------------------------------------------------------
@dataclass(frozen=True)
class VisionConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    image_size: int
    patch_size: int
    num_channels: int = 3
    layer_norm_eps: float = 1e-5
    hidden_act: str = "quick_gelu"

    @property
    def patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


@dataclass(frozen=True)
class LlavaConfig:
    vision: VisionConfig
    text: LlamaConfig
    image_token_id: int
    feature_layer: int          # transformers' vision_feature_layer (an index into hidden_states)
    keep_class_token: bool      # vision_feature_select_strategy "full" (else "default": dropped)
    projector_act: str
    projector_bias: bool

    @property
    def image_tokens(self) -> int:
        """Feature rows (prompt tokens) per image."""
        return self.vision.patches + (1 if self.keep_class_token else 0)

    @property
    def vision_layers_run(self) -> int:
        """How many CLIP layers run: hidden_states[k] is the output after k layers."""
        return self.feature_layer % (self.vision.num_hidden_layers + 1)

    @classmethod
    def from_hf(cls, config: dict) -> LlavaConfig:
        if config.get("model_type") != "llava":
            raise UnsupportedError(f"config.json: model_type {config.get('model_type')!r} is not llava")
        try:
            vision, text = dict(config["vision_config"]), dict(config["text_config"])
        except KeyError as e:
            raise WeightFileError(f"config.json: missing {e.args[0]!r}") from None
        if vision.get("model_type", "clip_vision_model") != "clip_vision_model":
            raise UnsupportedError(f"config.json: vision tower {vision.get('model_type')!r} is not supported "
                                   f"(clip_vision_model)")
        layer = config.get("vision_feature_layer", -2)
        if not isinstance(layer, int):
            raise UnsupportedError(f"config.json: vision_feature_layer {layer!r} (several layers) is not supported")
        strategy = config.get("vision_feature_select_strategy", "default")
        if strategy not in ("default", "full"):
            raise UnsupportedError(f"config.json: vision_feature_select_strategy {strategy!r} is not supported")
        act = config.get("projector_hidden_act", "gelu")
        if act not in ("gelu", "gelu_pytorch_tanh", "quick_gelu", "silu"):
            raise UnsupportedError(f"config.json: projector_hidden_act {act!r} is not supported")
        vision_act = vision.get("hidden_act", "quick_gelu")
        if vision_act not in ("quick_gelu", "gelu", "gelu_pytorch_tanh"):
            raise UnsupportedError(f"config.json: vision hidden_act {vision_act!r} is not supported")
        text_config = LlamaConfig.from_hf(_text_config(text))
        if text_config.has_sliding or text_config.sandwich_norms or text_config.attn_softcap or \
                text_config.final_softcap:
            raise UnsupportedError(f"llava: a {text_config.architecture} language model with sliding-window "
                                   f"layers, sandwich norms or soft caps is not supported")
        try:
            vc = VisionConfig(hidden_size=vision.get("hidden_size", 768), intermediate_size=vision.get("intermediate_size", 3072),
                              num_hidden_layers=vision.get("num_hidden_layers", 12),
                              num_attention_heads=vision.get("num_attention_heads", 12),
                              image_size=vision.get("image_size", 224), patch_size=vision.get("patch_size", 32),
                              num_channels=vision.get("num_channels", 3),
                              layer_norm_eps=vision.get("layer_norm_eps", 1e-5), hidden_act=vision_act)
        except TypeError as e:
            raise WeightFileError(f"config.json: bad vision_config ({e})") from None
        token = config.get("image_token_id", config.get("image_token_index", 32000))
        return cls(vision=vc, text=text_config, image_token_id=int(token), feature_layer=layer,
                   keep_class_token=strategy == "full", projector_act=act,
                   projector_bias=bool(config.get("multimodal_projector_bias", True)))


def _text_config(text: dict) -> dict:
    """The text_config as a standalone config.json: transformers leaves defaults out of nested
    configs, and a few of its fields only matter for training or serving."""
    text = {k: v for k, v in text.items() if k not in ("use_cache", "pretraining_tp", "initializer_range",
                                                        "attention_dropout", "pad_token_id", "bos_token_id",
                                                        "eos_token_id", "dtype", "torch_dtype")}
    text.setdefault("model_type", "llama")
    return text


# -- weights ---------------------------------------------------------------------------------------
# checkpoint prefixes (transformers 4.x llava-hf files, transformers 5 in-memory and saved names)
_PREFIXES = [("model.language_model.", "model."), ("language_model.model.", "model."),
             ("language_model.lm_head.", "lm_head."), ("lm_head.", "lm_head."),
             ("model.vision_tower.vision_model.", "vision."), ("model.vision_tower.", "vision."),
             ("vision_tower.vision_model.", "vision."), ("vision_tower.", "vision."),
             ("model.multi_modal_projector.", "projector."), ("multi_modal_projector.", "projector.")]


def canonical_names(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Checkpoint names -> model.* (the Llama decoder, as llama.Weights knows them), vision.*, projector.*"""
    out = {}
    for name, array in state.items():
        for prefix, new in _PREFIXES:
            if name.startswith(prefix):
                out[new + name[len(prefix):]] = array
                break
        else:
            raise WeightFileError(f"llava checkpoint: tensor {name!r} belongs to no part of the model")
    return out


def _act(x: GraphTensor, kind: str) -> GraphTensor:
    if kind == "quick_gelu":  # CLIP's x * sigmoid(1.702 x)
        return x * lm.sigmoid(x * 1.702)
    if kind == "silu":
        return x.silu()
    return lm.gelu(x, approximate="tanh" if kind == "gelu_pytorch_tanh" else "none")


# -- graphs ----------------------------------------------------------------------------------------
class _Params:
    """The weights of one graph by canonical name, and the linear layers and norms made of them."""

    def __init__(self, g: Graph, weights: Weights):
        self.g, self.weights = g, weights

    def __call__(self, name: str, *shape: int) -> GraphTensor:
        return self.weights(self.g, name, shape)

    def linear(self, x: GraphTensor, name: str, n_out: int, n_in: int, bias: bool) -> GraphTensor:
        return lm.linear(x, self(name + ".weight", n_out, n_in), self(name + ".bias", n_out) if bias else None)

    def layer_norm(self, x: GraphTensor, name: str, size: int, eps: float) -> GraphTensor:
        return lm.layer_norm(x, (size,), self(name + ".weight", size), self(name + ".bias", size), eps)

    def rms_norm(self, x: GraphTensor, name: str, size: int, c: LlamaConfig) -> GraphTensor:
        scale = self(name + ".weight", size)
        return lm.rms_norm(x, (size,), scale + c.norm_offset if c.norm_offset else scale, c.rms_norm_eps)


def build_vision_graph(c: LlavaConfig, weights: Weights) -> Graph:
    """pixels (n, 3, H, W) -> image_features (n, image_tokens, text hidden size)."""
    v = c.vision
    g = Graph()
    d, heads = v.hidden_size, v.num_attention_heads
    hd = d // heads
    pixels = g.tensor("pixels", ("n", v.num_channels, v.image_size, v.image_size))
    n, tokens = pixels.dims[0], v.patches + 1

    w = _Params(g, weights)

    def linear(x, name, n_out, n_in, bias=True):
        return w.linear(x, name, n_out, n_in, bias)

    def norm(x, name):
        return w.layer_norm(x, name, d, v.layer_norm_eps)

    patches = lm.conv2d(pixels, w("vision.embeddings.patch_embedding.weight", d, v.num_channels, v.patch_size,
                                  v.patch_size), stride=v.patch_size)  # (n, d, grid, grid)
    patches = patches.reshape(n, d, v.patches).permute(0, 2, 1)
    cls_token = w("vision.embeddings.class_embedding", d).reshape(1, 1, d).expand(n, 1, d)
    x = lm.cat([cls_token, patches], 1) + w("vision.embeddings.position_embedding.weight", tokens, d)
    x = norm(x, "vision.pre_layrnorm")
    for layer in range(c.vision_layers_run):
        p = f"vision.encoder.layers.{layer}."
        h = norm(x, p + "layer_norm1")
        q, k, val = (linear(h, p + f"self_attn.{kind}_proj", d, d).reshape(n, tokens, heads, hd).permute(0, 2, 1, 3)
                     for kind in ("q", "k", "v"))
        scores = (q @ k.permute(0, 1, 3, 2)) * (1.0 / math.sqrt(hd))  # (n, heads, tokens, tokens)
        attended = (scores.softmax(-1) @ val).permute(0, 2, 1, 3).reshape(n, tokens, d)
        x = x + linear(attended, p + "self_attn.out_proj", d, d)
        h = _act(linear(norm(x, p + "layer_norm2"), p + "mlp.fc1", v.intermediate_size, d), v.hidden_act)
        x = x + linear(h, p + "mlp.fc2", d, v.intermediate_size)
    if not c.keep_class_token:
        x = x[:, 1:]
    text_d = c.text.hidden_size
    h = _act(linear(x, "projector.linear_1", text_d, d, c.projector_bias), c.projector_act)
    linear(h, "projector.linear_2", text_d, text_d, c.projector_bias).output("image_features")
    return g


def build_text_graph(c: LlamaConfig, weights: Weights) -> Graph:
    """The Llama decoder of llama.build_graph (full attention layers) with image rows merged into
    its input embeddings; inputs and outputs as there, plus image_rows (s, d) and is_image (s,)."""
    g = Graph()
    d, heads, kv, hd = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
    tokens = g.tensor("tokens", ("s",), "int32")
    image_rows, is_image = g.tensor("image_rows", ("s", d)), g.tensor("is_image", ("s",))
    k_cache = g.tensor("k_cache", ("t", c.num_hidden_layers, kv, hd))
    v_cache = g.tensor("v_cache", ("t", c.num_hidden_layers, kv, hd))
    s, t = tokens.dims[0], k_cache.dims[0]
    slot = g.arange(t + s)  # slot j holds position j - 1; slot 0 is the cache's dummy
    visible = slot.ge(1.0) * slot.le(g.arange(t, t + s).unsqueeze(-1))
    cos, sin = _angles(g.tensor("inv_freq", (hd // 2,)), g.arange(t - 1, t - 1 + s).unsqueeze(-1))

    w = _Params(g, weights)
    text = lm.embedding(tokens, w("model.embed_tokens.weight", c.vocab_size, d))
    if c.embedding_scale is not None:
        text = text * float(np.float32(c.embedding_scale))
    x = text * (1.0 - is_image).unsqueeze(-1) + image_rows  # image rows are zero at text positions
    for layer in range(c.num_hidden_layers):
        p = f"model.layers.{layer}."
        h = w.rms_norm(x, p + "input_layernorm", d, c)
        q, k, v = (w.linear(h, p + f"self_attn.{name}_proj", n * hd, d, c.attention_bias).reshape(s, n, hd)
                   for name, n in (("q", heads), ("k", kv), ("v", kv)))
        if c.qk_norm:
            q, k = w.rms_norm(q, p + "self_attn.q_norm", hd, c), w.rms_norm(k, p + "self_attn.k_norm", hd, c)
        q, k = _rope(q, cos, sin, c.rope_interleaved), _rope(k, cos, sin, c.rope_interleaved).output(f"k{layer}")
        keys, values = lm.cat([k_cache[:, layer], k], 0), lm.cat([v_cache[:, layer], v.output(f"v{layer}")], 0)
        attended = _attention(q, keys, values, visible, c)
        x = x + w.linear(attended, p + "self_attn.o_proj", d, heads * hd, c.output_bias)
        h = w.rms_norm(x, p + "post_attention_layernorm", d, c)
        gate, up = (w.linear(h, p + f"mlp.{name}_proj", c.intermediate_size, d, c.mlp_bias) for name in ("gate", "up"))
        x = x + w.linear(_activation(gate, c.hidden_act) * up, p + "mlp.down_proj", d, c.intermediate_size, c.mlp_bias)
    x = w.rms_norm(x, "model.norm", d, c)
    head, r = "model.embed_tokens" if c.tie_word_embeddings else "lm_head", parse_dim("r")
    w.linear(x.narrow(0, s - r, r), head, c.vocab_size, d, False).output("logits")  # the last r positions
    return g


# -- images ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ImagePreprocessor:
    """CLIPImageProcessor's steps (see the module docstring) with its settings."""
    shortest_edge: int
    crop_height: int
    crop_width: int
    mean: tuple[float, ...] = OPENAI_CLIP_MEAN
    std: tuple[float, ...] = OPENAI_CLIP_STD
    rescale_factor: float = 1 / 255
    resample: int = 3  # PIL bicubic

    @classmethod
    def from_directory(cls, path: str, image_size: int) -> ImagePreprocessor:
        """From preprocessor_config.json, or CLIP's defaults at the vision tower's image size."""
        file = os.path.join(path, "preprocessor_config.json")
        if not os.path.isfile(file):
            return cls(image_size, image_size, image_size)
        from ..io.safetensors import read_config
        p = read_config(file)
        for flag in ("do_resize", "do_center_crop", "do_rescale", "do_normalize", "do_convert_rgb"):
            if p.get(flag) is False:
                raise UnsupportedError(f"{file}: {flag}=false is not supported")
        size, crop = p.get("size", {"shortest_edge": image_size}), p.get("crop_size", {})
        if isinstance(size, int):
            size = {"shortest_edge": size}
        if isinstance(crop, int):
            crop = {"height": crop, "width": crop}
        if "shortest_edge" not in size:
            raise UnsupportedError(f"{file}: size {size} (only shortest_edge resizing is supported)")
        return cls(int(size["shortest_edge"]), int(crop.get("height", image_size)), int(crop.get("width", image_size)),
                   tuple(p.get("image_mean", OPENAI_CLIP_MEAN)), tuple(p.get("image_std", OPENAI_CLIP_STD)),
                   float(p.get("rescale_factor", 1 / 255)), int(p.get("resample", 3)))

    def __call__(self, image) -> np.ndarray:
        """An image (a path, a PIL image, or an (H, W, 3) uint8 array) -> (3, crop_h, crop_w) float32."""
        from PIL import Image
        image = _open_image(image)
        if image.mode in _REFUSED_MODES:
            raise InputError(f"image mode {image.mode!r} (16/32-bit or float pixels) is not supported: "
                             f"convert it to 8-bit RGB")
        if "A" in image.getbands() or image.info.get("transparency") is not None:
            rgba = image.convert("RGBA")
            image = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
        else:
            image = image.convert("RGB")
        width, height = image.size
        short, long = (width, height) if width <= height else (height, width)
        new_short, new_long = self.shortest_edge, int(self.shortest_edge * long / short)
        size = (new_short, new_long) if width <= height else (new_long, new_short)
        pixels = np.asarray(image.resize(size, resample=self.resample), np.uint8).transpose(2, 0, 1)
        pixels = _center_crop(pixels, self.crop_height, self.crop_width)
        scaled = (pixels.astype(np.float64) * self.rescale_factor).astype(np.float32)
        mean, std = np.array(self.mean, np.float32)[:, None, None], np.array(self.std, np.float32)[:, None, None]
        return ((scaled - mean) / std).astype(np.float32)


def _open_image(image):
    from PIL import Image, UnidentifiedImageError
    if isinstance(image, Image.Image):
        return image
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim not in (2, 3):
            raise InputError(f"image arrays must be uint8 (H, W) or (H, W, C), got {image.dtype} {image.shape}")
        return Image.fromarray(image)
    path = os.fspath(image)
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such image file")
    try:
        opened = Image.open(path)
        opened.load()
        return opened
    except (UnidentifiedImageError, OSError) as e:
        raise InputError(f"{path}: not a readable image ({e})") from None


def _center_crop(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """(C, H, W) -> (C, height, width): the centre, zero-padded first if the image is smaller."""
    _, h, w = pixels.shape
    if h < height or w < width:
        padded = np.zeros((pixels.shape[0], max(h, height), max(w, width)), pixels.dtype)
        top, left = math.ceil((padded.shape[1] - h) / 2), math.ceil((padded.shape[2] - w) / 2)
        padded[:, top:top + h, left:left + w] = pixels
        pixels, h, w = padded, padded.shape[1], padded.shape[2]
    top, left = (h - height) // 2, (w - width) // 2
    return pixels[:, top:top + height, left:left + width]


# -- the model -------------------------------------------------------------------------------------
class LlavaModel:
    """A compiled LLaVA model: `image_features`, `logits`, `generate_ids`, `chat`."""

    def __init__(self, config: LlavaConfig, state: dict[str, np.ndarray], preprocess: ImagePreprocessor,
                 tokenizer=None, backend: str = "cpu", progress: Callable[[str], None] | None = None,
                 **compile_options):
        self.config, self.preprocess, self.tokenizer = config, preprocess, tokenizer
        say = progress or (lambda message: None)
        weights = Weights.from_state_dict(state, config.text)
        started = time.perf_counter()
        vision, text = build_vision_graph(config, weights), build_text_graph(config.text, weights)
        say(f"built the vision ({len(vision.nodes):,} nodes) and text ({len(text.nodes):,} nodes) graphs in "
            f"{time.perf_counter() - started:.1f} s; compiling for {backend}...")
        unused = [n for n in state if n not in weights.used and not _unused_by_llava(n, config)]
        if unused:
            raise WeightFileError(f"llava checkpoint: tensors this model does not use: {', '.join(unused[:3])}")
        started = time.perf_counter()
        self.vision = vision.compile(backend, **compile_options)
        self.vision.set_inputs({k: a for k, a in weights.arrays.items() if k in vision.inputs})
        self.text = text.compile(backend, **compile_options)
        self.text.set_inputs({k: a for k, a in weights.arrays.items() if k in text.inputs},
                             inv_freq=rope_inv_freq(config.text))
        say(f"compiled in {time.perf_counter() - started:.1f} s")

    # -- pieces ----------------------------------------------------------------------------------
    def image_features(self, images: Sequence) -> np.ndarray:
        """(n_images, image_tokens, hidden) projected features of images (paths, PIL images, arrays
        of preprocessed (3, H, W) float32 pixels or uint8 (H, W, C) images)."""
        v = self.config.vision
        pixels = []
        for image in images:
            if isinstance(image, np.ndarray) and image.dtype == np.float32:
                if image.shape != (v.num_channels, v.image_size, v.image_size):
                    raise ShapeError(f"preprocessed pixels must be {(v.num_channels, v.image_size, v.image_size)}, "
                                     f"got {image.shape}")
                pixels.append(image)
            else:
                pixels.append(self.preprocess(image))
        if not pixels:
            return np.zeros((0, self.config.image_tokens, self.config.text.hidden_size), np.float32)
        batch = np.stack(pixels)
        if batch.shape[2:] != (v.image_size, v.image_size):
            raise ShapeError(f"preprocessing gives {batch.shape[2:]} pixels, the vision tower takes "
                             f"{(v.image_size, v.image_size)} (check preprocessor_config.json's crop_size)")
        return self.vision(pixels=batch)["image_features"]

    def expand_image_tokens(self, ids: Sequence[int], n_images: int) -> list[int]:
        """One <image> id per image -> image_tokens ids each; already expanded ids pass as they are."""
        ids, token, per = [int(i) for i in ids], self.config.image_token_id, self.config.image_tokens
        count = ids.count(token)
        if count == n_images * per:
            return ids
        if count != n_images:
            raise ShapeError(f"the prompt has {count} image tokens (id {token}) for {n_images} images: expected "
                             f"{n_images} (one per image) or {n_images * per} ({per} per image)")
        out = []
        for i in ids:
            out.extend([token] * per if i == token else [i])
        return out

    def _run(self, ids: list[int], cache: KVCache, rows: np.ndarray | None, last_only: bool) -> np.ndarray:
        c = self.config.text
        array = np.asarray(ids, np.int32)
        if array.min() < 0 or array.max() >= c.vocab_size:
            raise ShapeError(f"token ids must be in 0..{c.vocab_size - 1}")
        is_image = (array == self.config.image_token_id).astype(np.float32)
        image_rows = np.zeros((len(ids), c.hidden_size), np.float32)
        if is_image.any():
            if rows is None or len(rows) != int(is_image.sum()):
                raise ShapeError("image tokens in a decode step, or image features that do not fit them")
            image_rows[is_image > 0] = rows
        out = self.text.run({"tokens": array, "image_rows": image_rows, "is_image": is_image, **cache.inputs()},
                            dims={"r": 1 if last_only else len(ids)})
        cache.append(out, len(ids))
        return out["logits"]

    def logits(self, token_ids: Sequence[int], images: Sequence = ()) -> np.ndarray:
        """Logits (seq, vocab) of every position of the (expanded) prompt with its images."""
        features = self.image_features(images)
        ids = self.expand_image_tokens(token_ids, len(features))
        return self._run(ids, KVCache(self.config.text, len(ids)), features.reshape(-1, features.shape[-1]), False)

    def generate_ids(self, token_ids: Sequence[int], images: Sequence = (), max_new_tokens: int = 64,
                     stop_ids: Sequence[int] = ()) -> Iterator[int]:
        """Greedy continuation of the prompt (token ids with image tokens) and its images."""
        features = self.image_features(images)
        ids = self.expand_image_tokens(token_ids, len(features))
        rows = features.reshape(-1, features.shape[-1])
        cache = KVCache(self.config.text, len(ids) + max_new_tokens)

        def next_logits(new_ids):
            return self._run(new_ids, cache, rows if cache.tokens == 0 else None, True)[-1]

        return generate_ids(next_logits, ids, max_new_tokens, Sampler(SamplingParams(temperature=0.0)), stop_ids)

    def chat(self, question: str, images: Sequence = (), max_new_tokens: int = 128, stream: bool = False):
        """Answer `question` about `images` (paths or PIL images); text, or text pieces with stream=True."""
        tokenizer = self.tokenizer
        if tokenizer is None:
            raise LuminarError("this LLaVA model has no tokenizer.json: use logits() or generate_ids() with ids")
        image_text = tokenizer.id_to_token(self.config.image_token_id)
        if image_text is None:
            raise WeightFileError(f"tokenizer: no token for the image token id {self.config.image_token_id}")
        content = "".join(f"{image_text}\n" for _ in images) + question
        if tokenizer.chat_template:
            prompt = tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
        else:
            prompt = f"USER: {content} ASSISTANT:"
        ids = tokenizer.encode(prompt)
        stop = set(getattr(tokenizer, "stop_ids", ()) or ())
        pieces = tokenizer.decode_stream(self.generate_ids(ids, images, max_new_tokens, stop), skip_special_tokens=True)
        return pieces if stream else "".join(pieces)


def _unused_by_llava(name: str, config: LlavaConfig) -> bool:
    """Tensors LLaVA never reads: the CLIP layers after the selected one and its post-layernorm."""
    if name.startswith("vision.post_layernorm."):
        return True
    if name.startswith("vision.encoder.layers."):
        return int(name.split(".")[3]) >= config.vision_layers_run
    return name.endswith("rotary_emb.inv_freq")


# -- loading ---------------------------------------------------------------------------------------
def load_llava(path, backend: str = "cpu", progress: Callable[[str], None] | None = None,
               **compile_options) -> LlavaModel:
    """Load and compile a LLaVA checkpoint directory (config.json, *.safetensors, optionally
    preprocessor_config.json and tokenizer.json)."""
    from ..io.safetensors import load_safetensors, read_config
    from ..io.tokenizer import Tokenizer
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise WeightFileError(f"{path}: not a directory (a LLaVA checkpoint is a directory with config.json "
                              f"and *.safetensors)")
    say = progress or (lambda message: None)
    say(f"reading {path}")
    config = LlavaConfig.from_hf(read_config(path))
    state = canonical_names(load_safetensors(path))
    tokenizer = Tokenizer.from_file(path) if os.path.isfile(os.path.join(path, "tokenizer.json")) else None
    preprocess = ImagePreprocessor.from_directory(path, config.vision.image_size)
    return LlavaModel(config, state, preprocess, tokenizer, backend=backend, progress=say, **compile_options)


__all__ = ["LlavaConfig", "VisionConfig", "LlavaModel", "ImagePreprocessor", "load_llava", "canonical_names"]
