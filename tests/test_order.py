"""The global data order (order.py): every block once per epoch, the same steps on any number of ranks, resumable from
one count of blocks on another number of ranks, micro-batch or global batch; and the real loader keeps that order with
any number of workers."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from litgpt_vocagnolm.data.order import GlobalOrder, RankBatches, accumulation, train_loader, val_loader
from litgpt_vocagnolm.data.prepared import VocAgnoData, iter_blocks
from litgpt_vocagnolm.errors import InvalidArgument


def train_steps(order: GlobalOrder, start: int, shape: tuple[int, int, int], steps: int) -> list[list[list[int]]]:
    """`steps` optimizer steps from position `start` as W ranks read them (`shape` = (B, W, A)): each step's A·W
    micro-batches in the order they cut its blocks, micro-batch k taken from rank k mod W's sampler."""
    micro_batch_size, world_size, accumulation = shape
    ranks = [iter(RankBatches(order, start, micro_batch_size, rank, world_size)) for rank in range(world_size)]
    return [[next(ranks[k % world_size]) for k in range(accumulation * world_size)] for _ in range(steps)]


def flat(steps: list[list[list[int]]]) -> list[int]:
    return [block for step in steps for micro_batch in step for block in micro_batch]


shapes = st.tuples(st.integers(1, 5), st.sampled_from([1, 2, 3, 4]), st.integers(1, 3))  # (B, W, A)


@settings(max_examples=60, deadline=None)
@given(num_blocks=st.integers(1, 60), before=shapes, after=shapes, cut=st.integers(0, 8), seed=st.integers(0, 2**40))
def test_every_block_once_per_epoch_across_a_resume_on_another_shape(num_blocks, before, after, cut, seed):
    """Train `cut` steps of one (B, W, A), resume from the blocks consumed with another, train past two epochs: the
    blocks read, position after position, are epoch 0's permutation, then epoch 1's, each block once in each."""
    order = GlobalOrder(num_blocks, seed)
    first = train_steps(order, 0, before, cut)
    position = cut * before[0] * before[1] * before[2]  # what a checkpoint saves
    steps = max(0, -(-(2 * num_blocks - position) // (after[0] * after[1] * after[2])))  # past the end of epoch 1
    resumed = train_steps(GlobalOrder(num_blocks, seed), position, after, steps)
    read = flat(first) + flat(resumed)
    assert len(flat(first)) == position
    for epoch in range(2):
        blocks = read[epoch * num_blocks : (epoch + 1) * num_blocks]
        assert sorted(blocks) == list(range(num_blocks))
        assert blocks == order.epoch(epoch).tolist()


@settings(max_examples=60, deadline=None)
@given(
    num_blocks=st.integers(1, 40),
    micro_batch_size=st.integers(1, 4),
    per_step=st.sampled_from([4, 8]),
    world_sizes=st.tuples(st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4])),
    cut=st.integers(0, 6),
)
def test_a_resume_on_another_number_of_ranks_trains_the_same_micro_batches(
    num_blocks, micro_batch_size, per_step, world_sizes, cut
):
    """With the same global batch, a run on W ranks resumed at a step boundary on W' ranks trains the uninterrupted
    run's steps: the same micro-batches, in the same order."""
    before, after = ((micro_batch_size, w, per_step // w) for w in world_sizes)
    uninterrupted = train_steps(GlobalOrder(num_blocks, 5), 0, before, cut + 6)
    position = cut * micro_batch_size * per_step
    resumed = train_steps(GlobalOrder(num_blocks, 5), position, after, 6)
    assert train_steps(GlobalOrder(num_blocks, 5), 0, before, cut) == uninterrupted[:cut]
    assert resumed == uninterrupted[cut:]


def test_one_two_and_four_ranks_train_the_same_steps():
    steps = {w: train_steps(GlobalOrder(50, 0), 0, (3, w, 8 // w), 7) for w in (1, 2, 4)}
    assert steps[1] == steps[2] == steps[4]
    # 7 steps of 24 blocks: the fourth step straddles the end of epoch 0 (50 blocks), the seventh that of epoch 1.
    expected = torch.cat([GlobalOrder(50, 0).epoch(e) for e in range(4)])[: 7 * 24].view(7, 8, 3).tolist()
    assert steps[1] == expected


def test_epochs_differ_and_are_reproducible_from_the_seed():
    order = GlobalOrder(1000, 42)
    epochs = [order.epoch(e).tolist() for e in range(3)]
    assert [GlobalOrder(1000, 42).epoch(e).tolist() for e in (2, 0, 1)] == [epochs[2], epochs[0], epochs[1]]
    assert len({tuple(e) for e in epochs}) == 3
    assert GlobalOrder(1000, 43).epoch(0).tolist() != epochs[0]
    # As documented: torch.randperm seeded with NumPy's SeedSequence of (seed, epoch).
    seed = int(np.random.SeedSequence([42, 1]).generate_state(1)[0])
    assert epochs[1] == torch.randperm(1000, generator=torch.Generator().manual_seed(seed)).tolist()
    assert GlobalOrder(5, 42, shuffle=False).blocks(3, 12) == [3, 4, 0, 1, 2, 3, 4, 0, 1]


def test_validation_reads_every_block_once_dealt_by_micro_batch():
    order = GlobalOrder(10, 42, shuffle=False)
    ranks = [RankBatches(order, 0, 3, rank, 2, stop=10) for rank in range(2)]
    assert [list(r) for r in ranks] == [[[0, 1, 2], [6, 7, 8]], [[3, 4, 5], [9]]]
    assert [len(r) for r in ranks] == [2, 2]
    assert [len(RankBatches(order, 0, 3, rank, 3, stop=10)) for rank in range(3)] == [2, 1, 1]


def test_a_global_batch_must_be_whole_micro_batches_on_every_rank():
    assert accumulation(1024, 4, 32) == 8
    for global_batch_size in (10, 2):
        with pytest.raises(InvalidArgument, match="--train.global_batch_size .* not a multiple of"):
            accumulation(global_batch_size, 1, 4)


@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_the_loader_reads_the_order_with_any_number_of_workers(tinyllama_mistral_data, num_workers):
    """Rank 1 of 2 from a position just before the end of epoch 0, and its validation share: the batches hold the
    blocks the order names, in its order, read back independently with `iter_blocks`."""
    data = VocAgnoData(tinyllama_mistral_data, num_workers=num_workers, seed=3)
    data.connect(batch_size=3, max_seq_length=64)
    stored = {
        split: [block["student_ids"] for block in iter_blocks(tinyllama_mistral_data, split)]
        for split in ("train", "val")
    }
    num_blocks = len(stored["train"])
    position = num_blocks - 5
    order = GlobalOrder(num_blocks, 3)
    batches = iter(train_loader(data, position, rank=1, world_size=2))
    for k in range(4):  # its first micro-batch, positions N - 2 to N, straddles the epoch's end
        begin = position + (2 * k + 1) * 3
        expected = np.stack([stored["train"][i] for i in order.blocks(begin, begin + 3)])
        assert torch.equal(next(batches).input_ids, torch.from_numpy(expected[:, :-1]))
    val = [batch.input_ids for batch in val_loader(data, rank=0, world_size=2)]
    expected = [np.stack(stored["val"][i : i + 3]) for i in range(0, len(stored["val"]), 6)]
    assert [tuple(b.shape) for b in val] == [(len(e), 64) for e in expected]
    assert all(torch.equal(b, torch.from_numpy(e[:, :-1])) for b, e in zip(val, expected))
