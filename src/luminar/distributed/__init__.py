"""luminar.distributed: running luminar programs on several processes over MPI.

- comm.py            Communicator: MPI collectives on numpy arrays (deterministic sums, deadlines)
- collective.py      CollectiveGraph: a graph split into compiled segments at collectives
- data_parallel.py   DataParallel: TrainStep with the batch split by rank and gradients all-reduced
- tensor_parallel.py tensor-parallel Llama inference (heads and MLP columns split, vocabulary split)
- pipeline.py        pipeline-parallel Llama inference (layers in stages, micro-batches streamed)
- launch.py          `python -m luminar.distributed ...` under mpirun, and `luminar mpirun ...`

Everything here is outside luminar's core: the core knows nothing about processes.
"""
from .comm import Communicator, DistributedError
from .collective import CollectiveGraph, CollectiveProgram

__all__ = ["Communicator", "DistributedError", "CollectiveGraph", "CollectiveProgram"]
