"""Pipeline-parallel Llama inference: consecutive layers on consecutive ranks, micro-batches streamed.

    comm = Communicator.world()
    model = PipelineLlama("model_dir", comm)          # rank i is stage i
    all_logits = model.logits_many([ids_a, ids_b, ids_c])   # GPipe-style: the sequences stream through
    new_ids = model.generate_greedy(ids, 16)

Stage i holds layers [L_i, L_(i+1)) (an even split), the first stage also the embedding, the last
the final norm and lm_head: each rank's weights are its layers' (plus the tables at the ends).
Each stage is a CollectiveGraph that receives the hidden state from the stage before (send/recv),
runs its layers, and sends the result on. A sequence is a micro-batch: while stage 1 works on
micro-batch j, stage 0 already computes j + 1 (its send of j + 1 completes when stage 1 is ready
for it), so with N stages up to N micro-batches are in flight. The last stage's logits are
broadcast to every rank, so every rank returns the same arrays (and picks the same greedy token).
Each stage keeps the KV cache of its own layers only.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from ..errors import InputError, ShapeError
from ..models.llama import KVCache
from .collective import CollectiveGraph
from .comm import Communicator, _split_counts
from .tensor_parallel import Shard, ShardReader, _check_ids, build_layers, compile_model, greedy


class PipelineLlama:
    """A Llama-family checkpoint with its layers split into `comm.size` stages."""

    def __init__(self, directory, comm: Communicator | None = None, backend: str = "cpu",
                 progress: Callable[[str], None] | None = None, **compile_options):
        self.comm = comm or Communicator.world()
        reader = ShardReader(directory)
        self.config = c = reader.config
        stage, stages = self.comm.rank, self.comm.size
        if stages > c.num_hidden_layers:
            raise InputError(f"pipeline: {stages} stages for {c.num_hidden_layers} layers; use at most one rank per layer")
        self.comm.agree((c, stages), "the model and the number of stages")
        counts = _split_counts(c.num_hidden_layers, stages)
        first = sum(counts[:stage])
        self.layers = range(first, first + counts[stage])
        self.is_first, self.is_last = stage == 0, stage == stages - 1
        cg = CollectiveGraph(self.comm)
        weights = {}
        x = None if self.is_first else cg.recv(("s", c.hidden_size), source=stage - 1)
        out = build_layers(cg, Shard(c, 0, 1), reader, weights, set(), self.layers, x=x, embed=self.is_first,
                           head=self.is_last)
        if not self.is_last:
            cg.send(out, dest=stage + 1)
        (progress or (lambda message: None))(f"stage {stage}: layers {first}..{first + counts[stage] - 1}")
        self.program = compile_model(cg, reader, weights, backend, **compile_options)
        self.resident_weight_bytes = self.program.resident_bytes()
        self.local_config = dataclasses.replace(c, num_hidden_layers=len(self.layers), layer_types=None)

    def new_cache(self, capacity: int = 256) -> KVCache:
        """This stage's KV cache: its own layers only."""
        return KVCache(self.local_config, capacity)

    def _run(self, ids: np.ndarray, cache: KVCache, last_only: bool) -> np.ndarray | None:
        """This stage's part of one forward pass; the logits on the last stage, None elsewhere."""
        if cache.tokens + len(ids) > self.config.max_position_embeddings:
            raise ShapeError(f"sequence of {cache.tokens + len(ids)} tokens exceeds the model's context of "
                             f"{self.config.max_position_embeddings}")
        feed = {"tokens": ids} if self.is_first else {}
        out = self.program.run({**feed, **cache.inputs()}, dims={"r": 1 if last_only else len(ids)})
        cache.append(out, len(ids))
        return out.get("logits")

    def forward_many(self, sequences: Sequence[Sequence[int]], caches: Sequence[KVCache],
                     last_only: bool = True) -> list[np.ndarray]:
        """One forward pass of each sequence (a micro-batch) after what its cache holds; the
        micro-batches stream through the stages. Every rank passes the same sequences and gets
        the same logits."""
        if len(sequences) != len(caches):
            raise InputError(f"pipeline: {len(sequences)} sequences but {len(caches)} caches")
        ids = [_check_ids(s, self.config) for s in sequences]
        self.comm.agree([len(i) for i in ids], "the micro-batches' lengths")
        logits = [self._run(i, cache, last_only) for i, cache in zip(ids, caches)]
        last = self.comm.size - 1
        return [self.comm.broadcast(out, root=last, what="pipeline logits") for out in logits]

    def logits_many(self, sequences: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Logits (len, vocab) of every position of each sequence, from empty caches."""
        return self.forward_many(sequences, [self.new_cache(len(s)) for s in sequences], last_only=False)

    def logits(self, token_ids: Sequence[int]) -> np.ndarray:
        return self.logits_many([token_ids])[0]

    def generate_greedy(self, token_ids: Sequence[int], max_new_tokens: int, stop_ids=()) -> list[int]:
        """Greedy continuation of one sequence (every rank returns the same tokens)."""
        cache = self.new_cache(len(token_ids) + max_new_tokens)
        return greedy(lambda ids: self.forward_many([ids], [cache])[0], token_ids, max_new_tokens, stop_ids)
