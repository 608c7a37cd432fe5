"""luminar.distributed overheads on this machine: communication time and bytes per step, and
throughput of N ranks against one process; writes bench/dist.json (bench/DIST.md explains it).

    .venv/bin/python bench/dist.py            # 2 ranks (about two minutes)
    .venv/bin/python bench/dist.py --quick    # fewer rounds, prints only

The parent starts `mpirun -n 2 python bench/dist.py --rank OUT` (1 OpenMP thread per rank) and
the ranks measure themselves. Each round times every contender once, interleaved, so a burst of
load from other tenants hits them alike; medians over rounds. The one-process peer runs inside
the same job, on rank 0, while the other rank sleeps in a barrier (its wait polls with a
back-off of up to 1 ms, so it leaves the CPU to rank 0): same binaries, same moment.

Cases:
- all-reduce of 4 KiB .. 4 MiB float32: luminar's Communicator (all-to-all, sum in rank order,
  all-gather: deterministic) against mpi4py's own Allreduce (Open MPI's choice of algorithm);
- data-parallel training step of an MLP (512 -> 1024 -> 1024 -> 10, batch 256, AdamW): one
  process on the whole batch vs DataParallel on 2 ranks; communication time and bytes per step;
- tensor-parallel Llama decode (random config: 4 layers, hidden 512, 8 / 4 heads, MLP 1536,
  vocab 8192): tokens/s of one process (llama.LlamaModel) vs 2 ranks, all-reduce time per token;
- pipeline-parallel prefill of 8 sequences of 32 tokens as micro-batches, 2 stages vs one process.

The machine has 2 cores: two ranks can at best halve a step, and every figure here is about what
distribution costs (messages, copies, synchronization), not about scaling.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))
sys.path.insert(0, HERE)


# -- on the ranks --------------------------------------------------------------------------------
def _rounds(comm, contenders: dict, rounds: int) -> dict:
    """Time each contender once per round, interleaved; {name: median seconds}. A contender is
    (fn, ranks): ranks "all" run it together, "root" only rank 0 (the others wait in a barrier)."""
    seconds = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, (fn, who) in contenders.items():
            comm.barrier()
            started = time.perf_counter()
            if who == "all" or comm.rank == 0:
                fn()
            elapsed = time.perf_counter() - started
            comm.barrier()
            seconds[name].append(elapsed)
    return {name: statistics.median(v) for name, v in seconds.items()}


def _all_reduce_case(comm, rounds: int) -> list[dict]:
    from mpi4py import MPI
    rows = []
    for size in (1 << 10, 1 << 14, 1 << 16, 1 << 18, 1 << 20):  # floats: 4 KiB .. 4 MiB
        a = np.random.default_rng(comm.rank).standard_normal(size).astype(np.float32)
        out = np.empty_like(a)
        comm.stats.reset()
        times = _rounds(comm, {"luminar": (lambda: comm.all_reduce(a), "all"),
                               "mpi4py": (lambda: comm._comm.Allreduce(a, out, MPI.SUM), "all")}, rounds)
        sent = comm.stats.bytes_sent["all_reduce"] // comm.stats.calls["all_reduce"]
        rows.append({"bytes": a.nbytes, "luminar_ms": times["luminar"] * 1e3, "mpi4py_ms": times["mpi4py"] * 1e3,
                     "sent_bytes_per_rank": sent})
    return rows


def _mlp(batch_dim="n"):
    import luminar as lm
    g = lm.Graph()
    x, y = g.tensor("x", (batch_dim, 512)), g.tensor("y", (batch_dim, 10))
    shapes = {"w1": (512, 1024), "b1": (1024,), "w2": (1024, 1024), "b2": (1024,), "w3": (1024, 10), "b3": (10,)}
    params = {k: g.tensor(k, s) for k, s in shapes.items()}
    h = (x @ params["w1"] + params["b1"]).relu()
    h = (h @ params["w2"] + params["b2"]).relu()
    loss = lm.mse_loss(h @ params["w3"] + params["b3"], y)
    rng = np.random.default_rng(0)
    init = {k: (rng.standard_normal(s) * (0.03 if len(s) == 2 else 0)).astype(np.float32) for k, s in shapes.items()}
    return loss, params, init


def _data_parallel_case(comm, rounds: int) -> dict:
    from luminar.distributed.data_parallel import DataParallel
    from luminar.optim import AdamW, TrainStep
    rng = np.random.default_rng(1)
    batch = {"x": rng.standard_normal((256, 512)).astype(np.float32),
             "y": rng.standard_normal((256, 10)).astype(np.float32)}
    loss, params, init = _mlp()
    parallel = DataParallel(loss, params, AdamW(lr=1e-3), init, comm=comm)
    single = None
    if comm.rank == 0:
        loss, params, init = _mlp()
        single = TrainStep(loss, params, AdamW(lr=1e-3), init)
    for _ in range(2):  # warm up (first calls page in the arenas)
        parallel.step(batch)
        if single is not None:
            single.step(batch)
    comm.stats.reset()
    times = _rounds(comm, {"one process": (lambda: single.step(batch), "root"),
                           "2 ranks": (lambda: parallel.step(batch), "all")}, rounds)
    calls = comm.stats.calls.get("all_reduce", 1) / rounds
    return {"one_process_ms": times["one process"] * 1e3, "ranks_ms": times["2 ranks"] * 1e3,
            "all_reduce_ms_per_step": comm.stats.seconds["all_reduce"] / rounds * 1e3,
            "all_reduce_calls_per_step": calls, "gradient_bytes": sum(4 * int(np.prod(p.shape)) for p in params.values()),
            "sent_bytes_per_step": comm.stats.bytes_sent["all_reduce"] / rounds,
            "samples_per_s_one": 256 / times["one process"], "samples_per_s_ranks": 256 / times["2 ranks"]}


def _llama_directory(comm) -> str:
    """A random Llama checkpoint written by rank 0 (transformers' save_pretrained), path shared."""
    path = None
    if comm.rank == 0:
        import torch
        import transformers
        config = transformers.LlamaConfig(hidden_size=512, intermediate_size=1536, num_attention_heads=8,
                                          num_key_value_heads=4, num_hidden_layers=4, vocab_size=8192,
                                          max_position_embeddings=1024, tie_word_embeddings=False)
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(config).eval()
        path = tempfile.mkdtemp(prefix="luminar-dist-bench-")
        model.save_pretrained(path)
    return comm.broadcast_object(path, 0, "the model directory")


def _tensor_parallel_case(comm, directory: str, rounds: int, tokens: int = 16) -> dict:
    from luminar.distributed.tensor_parallel import TensorParallelLlama
    from luminar.models import load
    parallel = TensorParallelLlama(directory, comm)
    single = load(directory) if comm.rank == 0 else None
    prompt = list(range(1, 17))
    state = {}

    def decode_parallel():
        state["parallel"] = parallel.generate_greedy(prompt, tokens)

    def decode_single():
        cache = single.new_cache(len(prompt) + tokens)
        logits, out = single.forward(prompt, cache), []
        for _ in range(tokens):
            out.append(int(np.argmax(logits[-1])))
            logits = single.forward(out[-1:], cache)
        state["single"] = out

    decode_parallel()
    if single is not None:
        decode_single()
    comm.stats.reset()
    times = _rounds(comm, {"one process": (decode_single, "root"), "2 ranks": (decode_parallel, "all")}, rounds)
    same = comm.broadcast_object(state.get("single") == state["parallel"] if comm.rank == 0 else None)
    steps = tokens  # forward passes per generation: the prompt, then each new token but the last
    stats = comm.stats
    return {"tokens": tokens, "one_process_ms": times["one process"] * 1e3, "ranks_ms": times["2 ranks"] * 1e3,
            "tokens_per_s_one": tokens / times["one process"], "tokens_per_s_ranks": tokens / times["2 ranks"],
            "comm_ms_per_forward": stats.total_seconds() / rounds / steps * 1e3,
            "comm_calls_per_forward": sum(stats.calls.values()) / rounds / steps,
            "sent_bytes_per_forward": stats.total_bytes() / rounds / steps,
            "resident_weight_bytes_rank0": parallel.resident_weight_bytes, "same_tokens": same}


def _pipeline_case(comm, directory: str, rounds: int) -> dict:
    from luminar.distributed.pipeline import PipelineLlama
    from luminar.models import load
    parallel = PipelineLlama(directory, comm)
    single = load(directory) if comm.rank == 0 else None
    rng = np.random.default_rng(2)
    sequences = [rng.integers(0, 8192, 32).tolist() for _ in range(8)]
    times = _rounds(comm, {"one process": (lambda: [single.logits(np.array(s, np.int32)) for s in sequences], "root"),
                           "2 stages": (lambda: parallel.logits_many(sequences), "all")}, rounds)
    tokens = sum(map(len, sequences))
    return {"micro_batches": len(sequences), "tokens": tokens, "one_process_ms": times["one process"] * 1e3,
            "stages_ms": times["2 stages"] * 1e3, "tokens_per_s_one": tokens / times["one process"],
            "tokens_per_s_stages": tokens / times["2 stages"]}


def rank_main(out_path: str, rounds: int) -> int:
    from luminar.distributed import Communicator
    comm = Communicator.world(timeout=300)
    results = {"ranks": comm.size, "all_reduce": _all_reduce_case(comm, rounds * 3)}
    results["data_parallel"] = _data_parallel_case(comm, rounds)
    directory = _llama_directory(comm)
    results["tensor_parallel"] = _tensor_parallel_case(comm, directory, rounds)
    results["pipeline"] = _pipeline_case(comm, directory, max(3, rounds // 2))
    if comm.rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1)
    return 0


# -- the parent ----------------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", metavar="OUT", help=argparse.SUPPRESS)  # set when run by mpirun
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--quick", action="store_true", help="3 rounds, print only")
    args = parser.parse_args()
    rounds = 3 if args.quick else args.rounds
    if args.rank:
        from luminar.distributed.launch import as_rank
        return as_rank(lambda comm: rank_main(args.rank, rounds))
    from machine import cpu_model, git_revision, wait_for_idle
    from luminar.distributed.launch import mpirun_command, mpirun_env
    idle = wait_for_idle(30)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "dist.json")
        command = mpirun_command(2, [sys.executable, os.path.abspath(__file__), "--rank", out, "--rounds", str(rounds)])
        subprocess.run(command, env=mpirun_env(1), check=True, timeout=1800)
        with open(out) as f:
            results = json.load(f)
    results["machine"] = {"cpu": cpu_model(), "cores": os.cpu_count(), "git": git_revision(),
                          "idle_before": idle, "load_average": os.getloadavg(), "rounds": rounds,
                          "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    print(json.dumps(results, indent=1))
    if not args.quick:
        with open(os.path.join(HERE, "dist.json"), "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
