"""`VocAgnoData` that records the train blocks each process reads (importable by the subprocesses through PYTHONPATH).

Process r appends each block index it reads, one per line, to `trace/train-rank<r>.txt`, in the order it reads them
(loader workers: none). A test rebuilds the optimizer steps from the ranks' files (`trained`).
"""

from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import Dataset

from litgpt_vocagnolm.data.prepared import BlockDataset, VocAgnoData


class TracedBlocks(Dataset):
    """`blocks`, writing the index of every item read to `file`."""

    def __init__(self, blocks: BlockDataset, file: Path) -> None:
        self.blocks, self.file = blocks, file

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, index: int) -> dict:
        with open(self.file, "a") as f:
            f.write(f"{index}\n")
        return self.blocks[index]


@dataclass
class TracedData(VocAgnoData):
    trace: Path = Path("trace")
    """Where each process writes the train blocks it reads."""

    def dataset(self, split: str, shuffle: bool = False) -> Dataset:
        if split != "train":
            return super().dataset(split, shuffle)
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        Path(self.trace).mkdir(parents=True, exist_ok=True)
        return TracedBlocks(super().dataset(split, shuffle), Path(self.trace) / f"train-rank{rank}.txt")


def trained(trace: Path, world_size: int, accumulation: int) -> list[list[int]]:
    """The blocks of each optimizer step, in the order of the step's micro-batches (of one block each): micro-batch
    m of a step is the (m // W)-th that rank m mod W read in that step."""
    reads = [
        [int(line) for line in (trace / f"train-rank{rank}.txt").read_text().split()] for rank in range(world_size)
    ]
    steps = len(reads[0]) // accumulation
    assert all(len(rank) == steps * accumulation for rank in reads), [len(rank) for rank in reads]
    return [
        [reads[m % world_size][step * accumulation + m // world_size] for m in range(accumulation * world_size)]
        for step in range(steps)
    ]
