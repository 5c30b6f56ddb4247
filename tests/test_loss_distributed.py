"""scope="global" across 2 CPU processes (gloo) equals one process ranking the concatenated batch."""

import math

import ranks
import torch
import torch.distributed as dist
from ranks import free_port  # noqa: F401 (tests/test_recipe.py imports it from here)
from test_loss import guided_loss_of_logits, one_teacher_weights, step_verdict

from litgpt_vocagnolm.loss.methods import GuidanceArgs
from litgpt_vocagnolm.loss.selection import aggregate_teacher_loss, position_draws, random_selection, select_top_k

WORLD = 2
SETTINGS = [(top_k, aggregation) for top_k in (0.1, 0.4, 1.0) for aggregation in ("max", "mean")]


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


def step_micro_batch(m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The m-th micro-batch of an optimizer step: scores on a grid of halves (many ties) and candidates, (2, 8)."""
    g = torch.Generator().manual_seed(1000 + m)
    return torch.randint(0, 6, (2, 8), generator=g) / 2, torch.rand(2, 8, generator=g) < 0.8


def all_gather(x: torch.Tensor) -> torch.Tensor:
    # what fabric.all_gather does: stack every rank's tensor along a new leading dim
    gathered = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, x.contiguous())
    return torch.stack(gathered)


def worker(rank: int, out_dir: str) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)  # at MASTER_ADDR:MASTER_PORT (`ranks.start`)
    try:
        x = shard(rank)
        results = {}
        for top_k, aggregation in SETTINGS:
            inputs = (x["ls"], x["lt"], x["ranges"], x["valid"])
            chosen = step_verdict(*inputs, top_k=top_k, aggregation=aggregation, all_gather=all_gather, rank=rank)
            results[f"weights {top_k} {aggregation}"] = one_teacher_weights(
                *inputs, top_k=top_k, aggregation=aggregation, unmapped="exclude", scope="global", chosen=chosen
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
        B = len(x["targets"])
        _, weight_sum, _ = guided_loss_of_logits(
            args,
            x["logits"],
            x["targets"],
            teacher_loss=x["lt"],
            ranges=x["ranges"],
            positions=rank * B + torch.arange(B),  # the rows' places: rank 0's first, then rank 1's
            all_gather=all_gather,
            rank=rank,
        )
        results["random weight sum"] = weight_sum
        mine = [step_micro_batch(k * WORLD + rank) for k in range(2)]  # micro-batch k of rank r: the step's k·W + r
        results["step"] = select_top_k(
            torch.stack([scores for scores, _ in mine]),
            torch.stack([candidate for _, candidate in mine]),
            0.3,
            scope="global",
            all_gather=all_gather,
            rank=rank,
        )
        torch.save(results, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_global_scope_across_two_processes_equals_the_concatenated_batch(tmp_path):
    ranks.start(worker, (str(tmp_path),), WORLD)
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

    # A step of 4 micro-batches, 2 on each rank: ranked as one process ranks them all in the step's order, ties to
    # the earlier micro-batch in that order.
    step = [step_micro_batch(m) for m in range(2 * WORLD)]
    expected = select_top_k(torch.cat([s for s, _ in step]), torch.cat([c for _, c in step]), 0.3)
    got = torch.stack([per_rank[m % WORLD]["step"][m // WORLD] for m in range(2 * WORLD)])
    assert torch.equal(got.reshape(-1, 8), expected)


def random_worker(rank: int, out_dir: str) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)  # at MASTER_ADDR:MASTER_PORT (`ranks.start`)
    try:
        x = shard(0)  # the same micro-batch on both ranks, at the places in the data order each is given
        valid, mapped = x["targets"] != -100, aggregate_teacher_loss(x["lt"], x["ranges"])[1]
        B, T = valid.shape
        results = {}
        for scope in ("batch", "global"):
            for places in ("same", "apart"):
                positions = torch.arange(B) + (rank * B if places == "apart" else 0)
                draws = position_draws(7, positions, T)
                chosen = None
                if scope == "global":  # the step's top-k over both ranks' draws
                    chosen = select_top_k(draws, valid & mapped, 0.4, scope="global", all_gather=all_gather, rank=rank)
                selected = random_selection(valid, mapped, 0.4, "include", draws, scope=scope, chosen=chosen).selected
                counts = []
                for method in ("random", "vocagnolm"):
                    _, weight_sum, _ = guided_loss_of_logits(
                        GuidanceArgs(method=method, scope=scope),
                        x["logits"],
                        x["targets"],
                        teacher_loss=x["lt"],
                        ranges=x["ranges"],
                        positions=positions,
                        seed=7,
                        all_gather=all_gather,
                        rank=rank,
                    )
                    counts.append(weight_sum)
                results[scope, places] = (selected, *counts)
        torch.save(results, f"{out_dir}/random-rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_random_draws_follow_the_place_in_the_data_and_select_as_many_as_vocagnolm(tmp_path):
    """`random` draws from the seed and each row's place in the data order, not from the rank: two ranks holding the
    same rows at the same places select the same tokens, at other places other tokens; a rerun (a resume) selects
    the same again; under scope "global" two ranks select what one process selects over their rows in order, and
    as many as vocagnolm."""
    ranks.start(random_worker, (str(tmp_path),), WORLD)
    per_rank = [torch.load(tmp_path / f"random-rank{rank}.pt") for rank in range(WORLD)]
    x = shard(0)
    valid, mapped = x["targets"] != -100, aggregate_teacher_loss(x["lt"], x["ranges"])[1]
    B, T = valid.shape
    for scope in ("batch", "global"):
        (same_0, *_), (same_1, *_) = (results[scope, "same"] for results in per_rank)
        (apart_0, random_0, vocagnolm_0), (apart_1, random_1, vocagnolm_1) = (
            results[scope, "apart"] for results in per_rank
        )
        assert not torch.equal(apart_0, apart_1)
        assert random_0 + random_1 == vocagnolm_0 + vocagnolm_1
        if scope == "batch":  # ceil(0.4 * mapped) on each rank, at each rank's own places
            assert torch.equal(same_0, same_1)
            assert random_0 == vocagnolm_0 == math.ceil(0.4 * (valid & mapped).sum()) + (valid & ~mapped).sum()
            assert random_1 == vocagnolm_1
            again = random_selection(valid, mapped, 0.4, "include", position_draws(7, B + torch.arange(B), T))
            assert torch.equal(again.selected, apart_1)
        else:  # one process ranking both ranks' rows, in the step's order
            both = random_selection(
                torch.cat([valid, valid]),
                torch.cat([mapped, mapped]),
                0.4,
                "include",
                position_draws(7, torch.arange(2 * B), T),
            )
            assert torch.equal(torch.cat([apart_0, apart_1]), both.selected)
