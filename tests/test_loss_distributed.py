"""scope="global" across 2 CPU processes (gloo) equals one process ranking the concatenated batch."""

import math
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from test_loss import guided_loss_of_logits, one_teacher_weights

from litgpt_vocagnolm.loss.methods import GuidanceArgs
from litgpt_vocagnolm.loss.selection import aggregate_teacher_loss, random_selection, selection_generator

WORLD = 2
SETTINGS = [(top_k, aggregation) for top_k in (0.1, 0.4, 1.0) for aggregation in ("max", "mean")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shard(rank: int) -> dict[str, torch.Tensor]:
    """One rank's micro-batch. Losses on a grid of quarters; the first half of each row is the same on both ranks
    (ties across ranks), the second half is higher on rank 1 (the global top-k differs from each rank's own)."""
    g = torch.Generator().manual_seed(rank)
    shared = torch.Generator().manual_seed(100)
    B, T, M, V = 2, 24, 30, 40
    ls = torch.randint(0, 40, (B, T), generator=shared) / 4
    ls[:, T // 2 :] = torch.randint(0, 40, (B, T - T // 2), generator=g) / 4 + 20 * rank
    lt = torch.randint(0, 40, (B, M), generator=shared) / 4
    lt[torch.rand(B, M, generator=g) < 0.1] = float("nan")
    start = torch.randint(0, M + 1, (B, T), generator=shared)
    end = torch.minimum(start + torch.randint(0, 4, (B, T), generator=shared), torch.tensor(M))
    targets = torch.randint(0, V, (B, T), generator=g)
    targets[rank, -3:] = -100
    return {
        "ls": ls,
        "lt": lt,
        "ranges": torch.stack([start, end], -1),
        "valid": targets != -100,
        "logits": torch.randn(B, T, V, generator=g),
        "targets": targets,
    }


def all_gather(x: torch.Tensor) -> torch.Tensor:
    # what fabric.all_gather does: stack every rank's tensor along a new leading dim
    gathered = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, x.contiguous())
    return torch.stack(gathered)


def worker(rank: int, port: int, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        x = shard(rank)
        results = {}
        for top_k, aggregation in SETTINGS:
            options = dict(top_k=top_k, aggregation=aggregation, scope="global", all_gather=all_gather, rank=rank)
            results[f"weights {top_k} {aggregation}"] = one_teacher_weights(
                x["ls"], x["lt"], x["ranges"], x["valid"], unmapped="exclude", **options
            )
            args = GuidanceArgs(top_k=top_k, aggregation=aggregation, scope="global")
            loss_sum, weight_sum, _ = guided_loss_of_logits(
                args,
                x["logits"],
                x["targets"],
                teacher_loss=x["lt"],
                ranges=x["ranges"],
                all_gather=all_gather,
                rank=rank,
            )
            results[f"loss {top_k} {aggregation}"] = torch.stack([loss_sum, weight_sum])
        args = GuidanceArgs(method="random", unmapped="exclude", scope="global")
        generator = torch.Generator().manual_seed(rank)
        _, weight_sum, _ = guided_loss_of_logits(
            args,
            x["logits"],
            x["targets"],
            teacher_loss=x["lt"],
            ranges=x["ranges"],
            all_gather=all_gather,
            rank=rank,
            generator=generator,
        )
        results["random weight sum"] = weight_sum
        torch.save(results, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_global_scope_across_two_processes_equals_the_concatenated_batch(tmp_path):
    mp.spawn(worker, args=(free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    per_rank = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(WORLD)]
    whole = {name: torch.cat([shard(rank)[name] for rank in range(WORLD)]) for name in shard(0)}
    for top_k, aggregation in SETTINGS:
        expected = one_teacher_weights(
            whole["ls"],
            whole["lt"],
            whole["ranges"],
            whole["valid"],
            top_k=top_k,
            aggregation=aggregation,
            unmapped="exclude",
            scope="batch",
        )
        got = torch.cat([results[f"weights {top_k} {aggregation}"] for results in per_rank])
        assert torch.equal(got, expected)
        candidates = (whole["valid"] & aggregate_teacher_loss(whole["lt"], whole["ranges"])[1]).sum().item()
        assert got.sum() == math.ceil(top_k * candidates)
        # each rank alone would select a different set: the cross-rank ranking matters
        if top_k < 1:
            alone = torch.cat(
                [
                    one_teacher_weights(
                        *(shard(rank)[name] for name in ("ls", "lt", "ranges", "valid")),
                        top_k=top_k,
                        aggregation=aggregation,
                        unmapped="exclude",
                    )
                    for rank in range(WORLD)
                ]
            )
            assert not torch.equal(alone, expected)

        args = GuidanceArgs(top_k=top_k, aggregation=aggregation, scope="batch")
        loss_sum, weight_sum, _ = guided_loss_of_logits(
            args, whole["logits"], whole["targets"], teacher_loss=whole["lt"], ranges=whole["ranges"]
        )
        got_loss, got_weight = sum(results[f"loss {top_k} {aggregation}"] for results in per_rank)
        assert got_weight == weight_sum and torch.allclose(got_loss, loss_sum)

    mapped = aggregate_teacher_loss(whole["lt"], whole["ranges"])[1]
    candidates = ((whole["targets"] != -100) & mapped).sum().item()
    assert sum(results["random weight sum"] for results in per_rank) == math.ceil(0.4 * candidates)


def random_worker(rank: int, port: int, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        x = shard(0)  # the same micro-batch on both ranks: only the generator can make their draws differ
        valid, mapped = x["targets"] != -100, aggregate_teacher_loss(x["lt"], x["ranges"])[1]
        results = {}
        for scope in ("batch", "global"):
            for iter_num in (1, 2):
                cross_rank = dict(all_gather=all_gather, rank=rank)
                generator = selection_generator(7, rank, iter_num, torch.device("cpu"))
                selected = random_selection(
                    valid, mapped, 0.4, "include", generator, scope=scope, **cross_rank
                ).selected
                counts = []
                for method in ("random", "vocagnolm"):
                    generator = selection_generator(7, rank, iter_num, torch.device("cpu"))
                    _, weight_sum, _ = guided_loss_of_logits(
                        GuidanceArgs(method=method, scope=scope),
                        x["logits"],
                        x["targets"],
                        teacher_loss=x["lt"],
                        ranges=x["ranges"],
                        generator=generator,
                        **cross_rank,
                    )
                    counts.append(weight_sum)
                results[scope, iter_num] = (selected, *counts)
        torch.save(results, f"{out_dir}/random-rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_random_draws_differ_across_ranks_and_steps_and_select_as_many_as_vocagnolm(tmp_path):
    """`recipe.fit` seeds `random`'s generator per rank and step: two ranks holding the same micro-batch select
    different tokens, each step others, a rerun (a resume) the same ones, and as many as vocagnolm."""
    mp.spawn(random_worker, args=(free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    per_rank = [torch.load(tmp_path / f"random-rank{rank}.pt") for rank in range(WORLD)]
    x = shard(0)
    valid, mapped = x["targets"] != -100, aggregate_teacher_loss(x["lt"], x["ranges"])[1]
    for scope in ("batch", "global"):
        for iter_num in (1, 2):
            (selected_0, random_0, vocagnolm_0), (selected_1, random_1, vocagnolm_1) = (
                results[scope, iter_num] for results in per_rank
            )
            assert not torch.equal(selected_0, selected_1)
            assert not torch.equal(selected_0, per_rank[0][scope, 3 - iter_num][0])
            if scope == "batch":  # ceil(0.4 * mapped) on each rank, and a rerun draws the same
                assert random_0 == vocagnolm_0 == math.ceil(0.4 * (valid & mapped).sum()) + (valid & ~mapped).sum()
                assert random_1 == vocagnolm_1
                generator = selection_generator(7, 1, iter_num, torch.device("cpu"))
                assert torch.equal(random_selection(valid, mapped, 0.4, "include", generator).selected, selected_1)
            assert random_0 + random_1 == vocagnolm_0 + vocagnolm_1
