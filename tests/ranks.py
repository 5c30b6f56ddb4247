"""The ranks of a CPU job that a test starts: `start(worker, args, processes)` runs `worker(rank, *args)` in `processes`
processes, each told its node and local rank as a cluster tells a task (MASTER_ADDR, MASTER_PORT, NODE_RANK,
LOCAL_RANK), so that the recipe's Fabric joins them over gloo as it joins a cluster's tasks, and starts none itself.

They are forked from the test's process: a spawned one imports torch, Lightning and LitGPT again, 6-8 s of a busy
2-core machine each, which was most of a multi-process test's time; a forked one starts with them imported. What the
ranks run and compute is the same. Each rank runs on one thread, as PyTorch's forked loader workers do: GNU OpenMP
can't run a parallel region in a child forked after its parent ran one on several threads. Where this process has
initialised CUDA, which a fork can't inherit, they are spawned.
"""

import os
import socket
from typing import Callable

import torch
import torch.multiprocessing as mp


def start(worker: Callable, args: tuple, processes: int, devices: int | None = None) -> None:
    """`worker(rank, *args)` in `processes` processes, `devices` a node (default: all on one node), rank r as local
    rank r % devices of node r // devices; returns when all have ended, raises the first one's error."""
    method = "spawn" if torch.cuda.is_initialized() else "fork"
    ranks = (worker, free_port(), devices or processes, args)
    mp.start_processes(run_rank, args=ranks, nprocs=processes, join=True, start_method=method)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_rank(rank: int, worker: Callable, port: int, devices: int, args: tuple) -> None:
    torch.set_num_threads(1)
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NODE_RANK=str(rank // devices), LOCAL_RANK=str(rank % devices)
    )
    worker(rank, *args)
