"""The order in which training reads blocks: a property of the data and the seed, not of how many processes read it.

As Megatron-LM's pretraining sampler does, one global order is consumed by a single count, the position: the blocks
consumed since the run began, over all ranks.

- The train split's order is the concatenation of one permutation per epoch (`GlobalOrder`): position p is block
  `epoch(p // N)[p % N]` (N blocks). An optimizer step trains the G positions [s·G, (s+1)·G) (G the global batch in
  blocks), so a step may straddle an epoch's end: its first blocks end one epoch, its last begin the next. No block
  is dropped or repeated, whatever G: this is what "the last partial global batch of an epoch" does.
- A step's positions are cut into micro-batches of B blocks, in order; micro-batch m goes to rank m mod W, so a step
  of G = B·W·A blocks gives each of the W ranks A micro-batches (`accumulation`). The blocks of a step, and their
  micro-batches, do not depend on W: 1, 2 or 4 ranks train the same steps.
- Each rank's loader reads only its own micro-batches (`train_loader`): a `DataLoader` whose batch sampler
  (`RankBatches`) yields their block indices and whose workers read those blocks by index (`prepared.BlockDataset`, with
  every teacher's data and loss cache at the same index). Workers do not change the order: the loader hands batches
  back in the sampler's order.
- What a checkpoint saves is the position alone; the epoch is `position // N`. Resuming from it continues exactly
  there, on any number of ranks, micro-batch or global batch: micro-batches are counted from the resumed position.
  The end of the run's budget mid-epoch leaves the position where the last step ended.
- The validation split is read in stored order, every block once per validation, its micro-batches dealt to ranks the
  same way (`val_loader`); its last micro-batch may be smaller.
"""

import functools
from typing import Iterator, Optional

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from litgpt_vocagnolm.data.prepared import VocAgnoData, block_tokens, collate_blocks, padded_window
from litgpt_vocagnolm.errors import InvalidArgument


class GlobalOrder:
    """The order of a split's `num_blocks` blocks, epoch after epoch.

    Shuffled, epoch e is `torch.randperm(num_blocks)` drawn from a generator seeded with a 32-bit number derived from
    `(seed, e)` by NumPy's `SeedSequence` (stable across versions and machines). Not shuffled, every epoch is the
    stored order. A permutation costs 8 bytes a block (7M blocks: 56 MB) and is made when first read.
    """

    def __init__(self, num_blocks: int, seed: int, shuffle: bool = True) -> None:
        if num_blocks < 1:
            raise InvalidArgument(f"The split holds {num_blocks} blocks: there is nothing to read.")
        if seed < 0:
            raise InvalidArgument(f"--data.seed must be at least 0, got {seed}.")
        self.num_blocks, self.seed, self.shuffle = num_blocks, seed, shuffle
        self.last: tuple[int, torch.Tensor] = (-1, torch.empty(0, dtype=torch.long))  # the epoch read last

    def epoch(self, epoch: int) -> torch.Tensor:
        """The blocks of `epoch` in the order it reads them: (num_blocks,) int64, a permutation of 0..num_blocks-1."""
        if self.last[0] != epoch:  # positions are read in increasing order: one epoch at a time is kept
            if self.shuffle:
                seed = int(np.random.SeedSequence([self.seed, epoch]).generate_state(1)[0])
                blocks = torch.randperm(self.num_blocks, generator=torch.Generator().manual_seed(seed))
            else:
                blocks = torch.arange(self.num_blocks)
            self.last = (epoch, blocks)
        return self.last[1]

    def blocks(self, start: int, stop: int) -> list[int]:
        """The blocks at positions [start, stop) (`stop - start` of them), crossing into the next epochs as needed."""
        found = []
        while start < stop:
            epoch, offset = divmod(start, self.num_blocks)
            count = min(stop - start, self.num_blocks - offset)  # up to the end of this epoch
            found += self.epoch(epoch)[offset : offset + count].tolist()
            start += count
        return found


class RankBatches(Sampler[list[int]]):
    """One rank's micro-batches: the block indices of each, in `order`, from position `start` on.

    Micro-batch j covers the positions [start + j·B, start + (j+1)·B) (B = `micro_batch_size`); this rank takes
    j = rank, rank + W, rank + 2W, ... (W = `world_size`). Endless without `stop` (the run's budget ends it); with
    `stop`, positions from `stop` on are not read and the last micro-batch holds fewer blocks if cut there.
    """

    def __init__(
        self,
        order: GlobalOrder,
        start: int,
        micro_batch_size: int,
        rank: int,
        world_size: int,
        stop: Optional[int] = None,
    ) -> None:
        if start < 0 or micro_batch_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"start {start}, micro_batch_size {micro_batch_size}, rank {rank} of {world_size}")
        self.order, self.start, self.stop = order, start, stop
        self.micro_batch_size, self.rank, self.world_size = micro_batch_size, rank, world_size

    def __iter__(self) -> Iterator[list[int]]:
        begin = self.start + self.rank * self.micro_batch_size
        while self.stop is None or begin < self.stop:
            end = begin + self.micro_batch_size
            yield self.order.blocks(begin, end if self.stop is None else min(end, self.stop))
            begin += self.world_size * self.micro_batch_size

    def __len__(self) -> int:
        if self.stop is None:
            raise TypeError("An endless RankBatches has no length.")
        micro_batches = -(-max(self.stop - self.start, 0) // self.micro_batch_size)
        return len(range(self.rank, micro_batches, self.world_size))


class Blocks(Dataset):
    """A split's blocks read by index (LitData's `StreamingDataset` is iterable; its own shuffle and per-rank split
    are not used): item i is block i, with every teacher's data and loss cache connected to `data`
    (`VocAgnoData.dataset`)."""

    def __init__(self, data: VocAgnoData, split: str) -> None:
        self.blocks = data.dataset(split)
        # From the manifest: in a process group, LitData's `len` is this rank's share.
        self.num_blocks = data.manifest["splits"][split]["blocks"]

    def __len__(self) -> int:
        return self.num_blocks

    def __getitem__(self, index: int) -> dict:
        return self.blocks[index]


def accumulation(global_batch_size: int, micro_batch_size: int, world_size: int) -> int:
    """Micro-batches per rank in one optimizer step: A = G / (B·W). Refuses a global batch G that is not a whole number
    of micro-batches of B blocks on each of the W ranks (a step would not be the G blocks its recipe says)."""
    per_round = micro_batch_size * world_size
    if global_batch_size < per_round or global_batch_size % per_round:
        raise InvalidArgument(
            f"--train.global_batch_size {global_batch_size} is not a multiple of --train.micro_batch_size"
            f" {micro_batch_size} x {world_size} processes ({per_round} blocks). Give a global batch that is, or"
            " another micro-batch."
        )
    return global_batch_size // per_round


def train_loader(data: VocAgnoData, position: int, rank: int, world_size: int) -> DataLoader:
    """This rank's micro-batches of the train split, endless, from `position` (the blocks consumed so far over all
    ranks) on: batches as `VocAgnoData` describes them, B = the connected batch size (the last micro-batch of an
    epoch is whole: it goes on into the next). `data` is connected (`VocAgnoData.connect`) and its files checked."""
    blocks = Blocks(data, "train")
    order = GlobalOrder(len(blocks), data.seed)
    return loader(data, blocks, RankBatches(order, position, data.batch_size, rank, world_size))


def val_loader(data: VocAgnoData, rank: int, world_size: int) -> DataLoader:
    """This rank's micro-batches of the validation split: the split in stored order, cut into micro-batches of the
    connected batch size (the last one smaller if the split is not a multiple), micro-batch m for rank m mod W.
    Together the ranks read every block once; a rank may have one micro-batch fewer than another."""
    blocks = Blocks(data, "val")
    order = GlobalOrder(len(blocks), data.seed, shuffle=False)
    return loader(data, blocks, RankBatches(order, 0, data.batch_size, rank, world_size, stop=len(blocks)))


def loader(data: VocAgnoData, blocks: Blocks, batches: RankBatches) -> DataLoader:
    """The loader of `batches`: `num_workers` worker processes (`data`'s) read their blocks, collated as `VocAgnoData`'s
    loaders are (`collate_blocks`, the run's padded windows), into pinned memory on CUDA."""
    collate = functools.partial(
        collate_blocks,
        block_tokens=block_tokens(data.manifest),
        num_chunks=data.num_chunks,
        windows=[padded_window(manifest, data.teacher_block_size) for manifest in data.manifests],
    )
    return DataLoader(
        blocks,
        batch_sampler=batches,
        num_workers=data.num_workers,
        collate_fn=collate,
        pin_memory=torch.cuda.is_available(),
    )
