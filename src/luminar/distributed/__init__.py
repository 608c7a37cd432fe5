"""luminar.distributed: running luminar programs on several processes over MPI.

- comm.py            Communicator: MPI collectives on numpy arrays (deterministic sums, deadlines)
- collective.py      CollectiveGraph: a graph split into compiled segments at collectives
- data_parallel.py   DataParallel: TrainStep with the batch split by rank and gradients all-reduced
- tensor_parallel.py tensor-parallel Llama inference (heads and MLP columns split, vocabulary split)
- pipeline.py        pipeline-parallel Llama inference (layers in stages, micro-batches streamed)
- pipeline_train.py  PipelineStage: GPipe training, one stage per rank
- launch.py          starting ranks under mpirun with deadlines; ending the job on an error
- __main__.py        `mpirun -n N python -m luminar.distributed generate ...`: what each rank runs
- commands.py        `luminar parallel --ranks N ...`: starts that under mpirun

Everything here is outside luminar's core: the core knows nothing about processes.
"""
from .comm import Communicator, DistributedError
from .collective import CollectiveGraph, CollectiveProgram

__all__ = ["Communicator", "DistributedError", "CollectiveGraph", "CollectiveProgram"]
