"""Tokenizers: the vocabulary inside a GGUF file, or a Hugging Face tokenizer.json.

    tok = Tokenizer.from_gguf(read_gguf(default_model_path()))
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    ids = tok.encode(prompt)
    for piece in tok.decode_stream(generated_ids):   # text as the ids arrive
        print(piece, end="")

Encoding runs in the `tokenizers` package (Rust). A GGUF of tokenizer model "gpt2" holds a
byte-level BPE vocabulary and its merges; we build the same tokenizer that transformers' GGUF
converter builds (BPE + ByteLevel pre-tokenizer and decoder; CONTROL tokens such as <|im_start|>
become special tokens, USER_DEFINED ones plain added tokens), with one deliberate difference:
for pre-tokenizer types that llama.cpp splits digits for (SmolLM2's "smollm", "starcoder", ...)
every digit is its own pre-token first, as in llama.cpp and in SmolLM2's own tokenizer.json.
transformers skips that split; the two differ only on whitespace before a digit ("a  1").
"""
from __future__ import annotations

import bisect
import itertools
import json
import os
import re
from collections.abc import Iterable, Iterator

from ..errors import UnsupportedError, WeightFileError

_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types
# llama.cpp pre-tokenizer types whose first split isolates each digit (llama-vocab.cpp)
_DIGIT_SPLIT = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}
# llama 3's pattern, for the pre-tokenizer types that use it
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3_TYPES = {"llama3", "llama-v3", "llama-bpe", "falcon3", "smaug-bpe", "dbrx"}
# texts that end a chat turn when they are special tokens (llama.cpp's end-of-generation list)
_END_OF_TURN = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|end_of_text|>")


def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise UnsupportedError("tokenizers need the tokenizers package: pip install tokenizers") from None
    return tokenizers


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table that byte-level BPE vocabularies are spelled in."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_BYTE_ALPHABET = "".join(bytes_to_unicode().values())
_OUTSIDE_BYTE_ALPHABET = re.compile(f"[^{re.escape(_BYTE_ALPHABET)}]")


def _outside_byte_alphabet(tokens: list[str]) -> list[int]:
    """Indices of the tokens with a character that is not in bytes_to_unicode()'s alphabet.

    One regex pass over all the tokens joined (a vocabulary has tens of thousands), with each
    hit mapped back to its token through the tokens' start offsets."""
    starts = list(itertools.accumulate(map(len, tokens), initial=0))
    hits = (bisect.bisect_right(starts, m.start()) - 1 for m in _OUTSIDE_BYTE_ALPHABET.finditer("".join(tokens)))
    return sorted(set(hits))


class Tokenizer:
    """Text <-> token ids, special tokens, the chat template and streaming decode.

    `bos_id` / `eos_id` are None when unknown; `stop_ids` holds the ids that end a generated turn:
    eos plus the special tokens named like an end of turn (<|im_end|>, <|endoftext|>, ...)."""

    def __init__(self, backend, *, bos_id=None, eos_id=None, add_bos=False, chat_template=None, source="?"):
        self.backend = backend  # a tokenizers.Tokenizer
        self.bos_id, self.eos_id = bos_id, eos_id
        self.add_bos = add_bos
        self.chat_template = chat_template
        self.source = source
        specials = {t.content: i for i, t in backend.get_added_tokens_decoder().items() if t.special}
        self.stop_ids = {specials[t] for t in _END_OF_TURN if t in specials}
        if eos_id is not None:
            self.stop_ids.add(eos_id)
        if add_bos and bos_id is not None:
            tk = _tokenizers()
            bos = backend.id_to_token(bos_id)
            backend.post_processor = tk.processors.TemplateProcessing(
                single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)])

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, model) -> "Tokenizer":
        """The tokenizer stored in a GGUFModel's metadata: tokenizer model "gpt2" (byte-level BPE)
        or "llama" (SentencePiece BPE with byte fallback, e.g. Gemma's)."""
        meta = model.metadata
        kind = meta.get("tokenizer.ggml.model")
        if kind == "llama":
            backend = _sentencepiece_backend(model)
        elif kind == "gpt2":
            backend = _byte_level_backend(model)
        else:
            error = WeightFileError if kind is None else UnsupportedError  # None: the file has no tokenizer
            raise error(f"{model.path}: tokenizer model {kind!r} is not supported "
                                   f"(tokenizer.ggml.model 'gpt2': byte-level BPE, or 'llama': SentencePiece)")
        return cls(backend, bos_id=meta.get("tokenizer.ggml.bos_token_id"),
                   eos_id=meta.get("tokenizer.ggml.eos_token_id"),
                   add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", kind == "llama")),
                   chat_template=meta.get("tokenizer.chat_template"), source=model.path)

    @classmethod
    def from_file(cls, path) -> "Tokenizer":
        """A Hugging Face tokenizer.json (or a directory holding one). Special tokens, add_bos_token
        and the chat template come from tokenizer_config.json (and chat_template.jinja) beside it."""
        tk = _tokenizers()
        path = os.fspath(path)
        file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
        if not os.path.isfile(file):
            raise WeightFileError(f"{file}: no such file")
        try:
            backend = tk.Tokenizer.from_file(file)
        except Exception as e:  # tokenizers raises a bare Exception on malformed JSON
            raise WeightFileError(f"{file}: not a valid tokenizer.json ({e})") from None
        config = _read_json(os.path.join(os.path.dirname(file), "tokenizer_config.json"))
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        jinja_file = os.path.join(os.path.dirname(file), "chat_template.jinja")
        if template is None and os.path.isfile(jinja_file):
            with open(jinja_file, encoding="utf-8") as f:
                template = f.read()

        def token_id(key):
            token = config.get(key)
            token = token.get("content") if isinstance(token, dict) else token
            return backend.token_to_id(token) if isinstance(token, str) else None

        # add_bos_token is only honoured when the tokenizer.json has no post-processor of its own
        add_bos = bool(config.get("add_bos_token", False)) and backend.post_processor is None
        return cls(backend, bos_id=token_id("bos_token"), eos_id=token_id("eos_token"), add_bos=add_bos,
                   chat_template=template, source=file)

    # -- encoding and decoding ------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(int(token_id))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`. Special-token texts in it (e.g. "<|im_start|>") become their ids.
        add_special_tokens adds what the tokenizer adds by itself: BOS only if the GGUF says
        add_bos_token (SmolLM2's does not), or a tokenizer.json's post-processor ([CLS] ... [SEP])."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """The text of `ids` (invalid UTF-8 becomes U+FFFD), special tokens included unless skipped."""
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def stream_decoder(self, skip_special_tokens: bool = False) -> "StreamDecoder":
        return StreamDecoder(self, skip_special_tokens)

    def decode_stream(self, ids: Iterable[int], skip_special_tokens: bool = False) -> Iterator[str]:
        """Yield text pieces as `ids` arrive (any iterable, e.g. a generator of sampled tokens);
        a character whose UTF-8 bytes span several tokens comes out once it is complete."""
        decoder = StreamDecoder(self, skip_special_tokens)
        for token_id in ids:
            piece = decoder.step(token_id)
            if piece:
                yield piece
        tail = decoder.flush()
        if tail:
            yield tail

    # -- chat -----------------------------------------------------------------------------------
    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The prompt text for `messages` ([{"role": ..., "content": ...}]) from the model's chat
        template, rendered with jinja2 the way transformers renders it (SmolLM2's template adds a
        default system prompt when the first message is not one). Without a template: ChatML."""
        template = self.chat_template or (_GEMMA_TURNS if self.token_to_id("<start_of_turn>") is not None
                                          else _CHATML)
        try:
            import jinja2  # noqa: F401
        except ImportError:
            return _render_chatml(template, messages, add_generation_prompt)
        specials = {"bos_token": self._token_text(self.bos_id), "eos_token": self._token_text(self.eos_id)}
        return _compile_template(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                                  **specials)

    def _token_text(self, token_id) -> str:
        if token_id is None:
            return ""
        return self.backend.id_to_token(token_id) or ""

    def __repr__(self):
        return f"Tokenizer({self.source!r}, vocab_size={self.vocab_size}, bos_id={self.bos_id}, eos_id={self.eos_id})"


class StreamDecoder:
    """Incremental decoding: `step(id)` returns the text that id completes ("" while a multi-byte
    character is still incomplete); `flush()` returns what is left at the end of the stream.

    Each step decodes a short window of ids (the previous emitted token onwards) twice and emits
    the difference, so decoders that depend on context (a leading space, byte fallback) stay right
    and the cost does not grow with the length of the text."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False):
        self.tokenizer, self.skip_special_tokens = tokenizer, skip_special_tokens
        self.ids: list[int] = []
        self._prefix = 0  # window start: the token before the last emitted text
        self._read = 0    # ids before this are emitted

    def _decode(self, ids):
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def step(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        before = self._decode(self.ids[self._prefix:self._read])
        after = self._decode(self.ids[self._prefix:])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self.ids)
            return after[len(before):]
        return ""

    def flush(self) -> str:
        """The rest (an incomplete character at the end comes out as U+FFFD)."""
        before = self._decode(self.ids[self._prefix:self._read])
        after = self._decode(self.ids[self._prefix:])
        self._prefix = self._read = len(self.ids)
        return after[len(before):]


# -- helpers ------------------------------------------------------------------------------------
def _pre_tokenizer(tk, pre_type):
    """The pre-tokenizer llama.cpp uses for `tokenizer.ggml.pre` (GPT-2's split when unknown)."""
    byte_level = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    if pre_type in _DIGIT_SPLIT:
        return tk.pre_tokenizers.Sequence([tk.pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre_type in _LLAMA3_TYPES:
        return tk.pre_tokenizers.Sequence([tk.pre_tokenizers.Split(tk.Regex(_LLAMA3_SPLIT), behavior="isolated"),
                                           tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return byte_level


def _byte_level_backend(model):
    """Byte-level BPE from a GGUF's vocabulary and merges, as transformers' GGUF converter builds it."""
    tk = _tokenizers()
    meta = model.metadata
    tokens, types = meta.get("tokenizer.ggml.tokens"), meta.get("tokenizer.ggml.token_type") or []
    merges = meta.get("tokenizer.ggml.merges")
    if not tokens or merges is None:
        raise WeightFileError(f"{model.path}: GGUF metadata lacks tokenizer.ggml.tokens or tokenizer.ggml.merges")
    spelling = bytes_to_unicode()
    foreign = set(_outside_byte_alphabet(tokens))  # usually none: the vocabulary is spelled in it
    spelled = list(tokens)
    for i in foreign:  # a token outside the byte alphabet is respelled from its UTF-8 bytes
        spelled[i] = "".join(spelling[b] for b in tokens[i].encode("utf-8"))
    vocab = dict(zip(spelled, range(len(tokens))))  # (a repeated spelling keeps its last id)
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    backend = tk.Tokenizer(tk.models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
    backend.pre_tokenizer = _pre_tokenizer(tk, meta.get("tokenizer.ggml.pre"))
    backend.decoder = tk.decoders.ByteLevel()
    control = [t for i, (t, k) in enumerate(zip(tokens, types)) if k == _CONTROL and i not in foreign]
    backend.add_special_tokens([tk.AddedToken(t, normalized=False, special=True) for t in control])
    user = [t for t, k in zip(tokens, types) if k == _USER_DEFINED and t in vocab]
    backend.add_tokens([tk.AddedToken(t, normalized=False, special=False) for t in user])
    return backend


def _sentencepiece_backend(model):
    """SentencePiece BPE (tokenizer.ggml.model "llama") as a `tokenizers` BPE with byte fallback.

    SentencePiece merges, at each step, the adjacent pair whose union is the best-ranked piece;
    a BPE whose merges are every split of every piece into two pieces, ordered by the union's
    rank, does the same. The rank is the piece's score, except in Gemma files, whose scores do not
    follow the merge order but whose file order does (as transformers' GGUF converter also finds).
    Gemma stores pieces of several spaces with real spaces; the model reads them as "▁"s. Spaces
    become "▁" before the BPE (and a leading "▁" is added when add_space_prefix says so); unknown
    characters fall back to their <0xNN> byte pieces.
    """
    tk = _tokenizers()
    meta = model.metadata
    tokens, types = meta.get("tokenizer.ggml.tokens"), meta.get("tokenizer.ggml.token_type") or []
    scores = meta.get("tokenizer.ggml.scores")
    if not tokens or (scores is None or len(scores) != len(tokens)):
        raise WeightFileError(f"{model.path}: GGUF metadata lacks tokenizer.ggml.tokens or their scores")
    gemma = str(meta.get("general.architecture", "")).startswith("gemma")
    spelled = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in tokens] if gemma else list(tokens)
    vocab = {}
    for i, piece in enumerate(spelled):
        vocab.setdefault(piece, i)
    order = range(len(spelled)) if gemma else sorted(range(len(spelled)), key=lambda i: -scores[i])
    merges = []
    for i in order:  # best-ranked piece first; within a piece, the longer left part first
        piece = spelled[i]
        merges.extend((piece[:k], piece[k:]) for k in range(len(piece) - 1, 0, -1)
                      if piece[:k] in vocab and piece[k:] in vocab)
    unknown = meta.get("tokenizer.ggml.unknown_token_id")
    backend = tk.Tokenizer(tk.models.BPE(vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True,
                                         unk_token=tokens[unknown] if unknown is not None else None))
    space = [tk.normalizers.Replace(" ", "\u2581")]
    if meta.get("tokenizer.ggml.add_space_prefix", not gemma):
        space.insert(0, tk.normalizers.Prepend("\u2581"))
    backend.normalizer = tk.normalizers.Sequence(space)
    decoders = [tk.decoders.Replace("\u2581", " "), tk.decoders.ByteFallback(), tk.decoders.Fuse()]
    if meta.get("tokenizer.ggml.add_space_prefix", not gemma):
        decoders.append(tk.decoders.Strip(" ", 1, 0))
    backend.decoder = tk.decoders.Sequence(decoders)
    control = [t for t, k in zip(tokens, types) if k == _CONTROL]
    backend.add_special_tokens([tk.AddedToken(t, normalized=False, special=True) for t in control])
    user = [t for t, k, piece in zip(tokens, types, spelled) if k == _USER_DEFINED and t == piece]
    backend.add_tokens([tk.AddedToken(t, normalized=False, special=False) for t in user])
    return backend


def _read_json(path: str) -> dict:
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise WeightFileError(f"{path}: not valid JSON ({e})") from None
    return value if isinstance(value, dict) else {}


_CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
           " + '<|im_end|>' + '\n'}}{% endfor %}"
           "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


# Gemma's turn format, for Gemma GGUFs that carry no template (the 270M base model's does not):
# roles user and model, a system message prefixed to the first user turn; <bos> comes from encode()
_GEMMA_TURNS = ("{% set ns = namespace(system='') %}{% for message in messages %}"
                "{% if message['role'] == 'system' %}{% set ns.system = message['content'] + '\n\n' %}"
                "{% else %}{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role'])"
                " + '\n' + (ns.system if loop.index0 <= 1 and message['role'] == 'user' else '')"
                " + message['content'] | trim }}{{ '<end_of_turn>\n' }}{% endif %}{% endfor %}"
                "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")


def _compile_template(template: str):
    """A jinja2 template in the environment transformers renders chat templates in."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def strftime_now(fmt):
        import datetime
        return datetime.datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None, **kw: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)
    return env.from_string(template)


def _render_chatml(template: str, messages, add_generation_prompt: bool) -> str:
    """ChatML without jinja2, with the default system prompt the template inserts (if it has one)."""
    if "<|im_start|>" not in template:
        raise UnsupportedError("this chat template needs jinja2 to render: pip install jinja2")
    default = re.search(r"<\|im_start\|>system\n(.*?)<\|im_end\|>", template, re.S)
    turns = [dict(m) for m in messages]
    if default and turns and turns[0].get("role") != "system":
        turns.insert(0, {"role": "system", "content": default.group(1)})
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in turns)
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")
