"""A map-style `VocAgnoData` for the multi-process tests (importable by the subprocesses through PYTHONPATH).

Fabric gives a map-style loader a DistributedSampler without shuffling: rank r takes blocks r, r + W, r + 2W, ...
So two processes with one micro-batch each and one process with two accumulated micro-batches see exactly the same
blocks in every optimizer step, which lets a test compare their loss curves.
"""

import functools
from dataclasses import dataclass

from torch.utils.data import DataLoader

from litgpt_vocagnolm.data import VocAgnoData, block_tokens, collate_blocks, open_split


@dataclass
class BlockList(VocAgnoData):
    def train_dataloader(self) -> DataLoader:
        # By index: iterating a StreamingDataset inside a process group yields only this rank's share.
        dataset = open_split(self.path, "train", self.manifest)
        items = [dataset[i] for i in range(self.manifest["splits"]["train"]["blocks"])]
        collate = functools.partial(collate_blocks, block_tokens=block_tokens(self.manifest), num_chunks=self.num_chunks)
        return DataLoader(items, batch_size=self.batch_size, shuffle=False, collate_fn=collate)
