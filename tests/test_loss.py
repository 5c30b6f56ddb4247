"""Teacher Guided Loss and the baselines against brute-force references written in plain Python."""

import hashlib
import math
import struct
from fractions import Fraction

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from litgpt_vocagnolm.errors import InvalidArgument
from litgpt_vocagnolm.loss.cross_entropy import per_token_cross_entropy
from litgpt_vocagnolm.loss.distillation import kld_loss, paired_teacher_positions, uld_loss
from litgpt_vocagnolm.loss.methods import METHODS, GuidanceArgs, GuidedLoss, LossInputs
from litgpt_vocagnolm.loss.selection import (
    SelectionArgs,
    aggregate_teacher_loss,
    position_draws,
    random_selection,
    select_top_k,
    teacher_guided_weights,
)

NAN = float("nan")


def one_teacher_weights(ls, lt, ranges, valid, *, chosen=None, **options):
    """`teacher_guided_weights` for one teacher: its loss and ranges, each a list of one."""
    args = SelectionArgs(**options)
    return teacher_guided_weights(ls, [lt], [ranges], valid, args, chosen=chosen)


def step_verdict(ls, lt, ranges, valid, *, top_k, aggregation, all_gather, rank):
    """Scope "global" as the recipe ranks a step of one micro-batch per rank: each rank's excess loss and candidates,
    the top-k over every rank's (`select_top_k`), this rank's share of the verdict."""
    reference, mapped = aggregate_teacher_loss(lt, ranges, aggregation)
    excess, candidate = ls - reference, valid & mapped
    return select_top_k(excess, candidate, top_k, scope="global", all_gather=all_gather, rank=rank)


def f32(x: float) -> float:
    """x rounded to float32, in plain Python."""
    return struct.unpack("f", struct.pack("f", x))[0]


def reference_aggregate(lt: list, ranges: list, aggregation: str) -> tuple[list, list]:
    agg, mapped = [], []
    for row_lt, row_ranges in zip(lt, ranges):
        agg.append([]), mapped.append([])
        for a, e in row_ranges:
            values = [v for v in row_lt[a:e] if not math.isnan(v)]
            mapped[-1].append(bool(values))
            if not values:
                agg[-1].append(0.0)
            elif aggregation == "max":
                agg[-1].append(max(values))
            else:
                agg[-1].append(math.fsum(values) / len(values))
    return agg, mapped


def reference_weights(ls, lt, ranges, valid, top_k, aggregation, unmapped, scope) -> list:
    """docs/design.md, "Teacher-guided loss", in plain Python; ties go to the earlier (b, i). "global" here is the
    whole list (a batch)."""
    agg, mapped = reference_aggregate(lt, ranges, aggregation)
    B, T = len(ls), len(ls[0])
    weights = [[0.0] * T for _ in range(B)]
    groups = (
        [[(b, i) for b in range(B) for i in range(T)]]
        if scope != "sequence"
        else [[(b, i) for i in range(T)] for b in range(B)]
    )
    for group in groups:
        candidates = [(b, i) for b, i in group if valid[b][i] and mapped[b][i]]
        # float32 arithmetic as the implementation does it: the difference of two float32 is exact in float64
        excess = {(b, i): f32(ls[b][i] - f32(agg[b][i])) for b, i in candidates}
        ranked = sorted(candidates, key=lambda bi: (-excess[bi], bi))
        k = math.ceil(Fraction(str(top_k)) * len(candidates))
        for b, i in ranked[:k]:
            weights[b][i] = 1.0
    for b in range(B):
        for i in range(T):
            if valid[b][i] and not mapped[b][i] and unmapped == "include":
                weights[b][i] = 1.0
    return weights


@st.composite
def guidance_inputs(draw):
    """Losses on a grid of quarters (ties are common, float sums exact), NaN teacher losses, empty/short/long ranges."""
    B, T, M = draw(st.integers(1, 3)), draw(st.integers(1, 10)), draw(st.integers(0, 14))
    quarters = st.integers(0, 40).map(lambda q: q / 4)
    ls = [[draw(quarters) for _ in range(T)] for _ in range(B)]
    nan_rate = draw(st.sampled_from([0.0, 0.3, 1.0]))
    lt = [[NAN if draw(st.floats(0, 1)) < nan_rate else draw(quarters) for _ in range(M)] for _ in range(B)]
    ranges = []
    for _ in range(B):
        row = []
        for _ in range(T):
            a = draw(st.integers(0, M))
            kind = draw(st.sampled_from(["empty", "short", "long"]))
            e = a if kind == "empty" else min(M, a + draw(st.integers(1, 2))) if kind == "short" else M
            row.append((a, e))
        ranges.append(row)
    valid = [[draw(st.booleans()) or draw(st.booleans()) for _ in range(T)] for _ in range(B)]
    return ls, lt, ranges, valid


def as_tensors(ls, lt, ranges, valid):
    B, T = len(ls), len(ls[0])
    return (
        torch.tensor(ls, dtype=torch.float32),
        torch.tensor(lt, dtype=torch.float32).view(B, -1),
        torch.tensor(ranges, dtype=torch.long).view(B, T, 2),
        torch.tensor(valid),
    )


@settings(max_examples=150, deadline=None)
@given(
    inputs=guidance_inputs(),
    top_k=st.sampled_from([0.05, 0.1, 0.14, 0.25, 0.28, 0.3, 0.4, 0.5, 0.7, 0.9, 1.0]),
    aggregation=st.sampled_from(["max", "mean"]),
    unmapped=st.sampled_from(["include", "exclude"]),
    scope=st.sampled_from(["batch", "sequence"]),
)
def test_teacher_guided_weights_matches_reference(inputs, top_k, aggregation, unmapped, scope):
    ls, lt, ranges, valid = inputs
    options = dict(top_k=top_k, aggregation=aggregation, unmapped=unmapped, scope=scope)
    weights = one_teacher_weights(*as_tensors(ls, lt, ranges, valid), **options)
    assert weights.dtype == torch.float32
    assert weights.tolist() == reference_weights(ls, lt, ranges, valid, **options)
    agg, mapped = aggregate_teacher_loss(*as_tensors(ls, lt, ranges, valid)[1:3], aggregation)
    expected_agg, expected_mapped = reference_aggregate(lt, ranges, aggregation)
    assert mapped.tolist() == expected_mapped
    assert agg.tolist() == [[f32(v) for v in row] for row in expected_agg]


@settings(max_examples=60, deadline=None)
@given(
    inputs=guidance_inputs(),
    world=st.integers(1, 3),
    top_k=st.sampled_from([0.1, 0.4, 0.7, 1.0]),
    aggregation=st.sampled_from(["max", "mean"]),
)
def test_global_scope_ranks_the_concatenated_batch(inputs, world, top_k, aggregation):
    """Each "rank" holds one shard; a fake all_gather stacks them. Together they equal one batch of all shards."""
    ls, lt, ranges, valid = inputs
    shards = [as_tensors(ls, lt, ranges, valid) for _ in range(world)]
    shards = [(s[0] + rank, *s[1:]) for rank, s in enumerate(shards)]  # other ranks, other losses
    options = dict(top_k=top_k, aggregation=aggregation, unmapped="exclude")
    # What all_gather returns on every rank: each rank's (excess, candidate), stacked in rank order.
    locals_ = []
    for shard in shards:
        agg, mapped = aggregate_teacher_loss(shard[1], shard[2], aggregation)
        locals_.append(torch.stack([shard[0] - agg, (shard[3] & mapped).float()]))
    stacked = torch.stack(locals_)
    per_rank = []
    for rank, shard in enumerate(shards):
        chosen = step_verdict(*shard, top_k=top_k, aggregation=aggregation, all_gather=lambda x: stacked, rank=rank)
        per_rank.append(one_teacher_weights(*shard, scope="global", chosen=chosen, **options))
    whole = [torch.cat(parts) for parts in zip(*shards)]
    expected = one_teacher_weights(*whole, scope="batch", **options)
    assert torch.equal(torch.cat(per_rank), expected)


def test_global_scope_with_one_process_is_batch_scope():
    # fabric.all_gather returns its input unchanged when there is one process
    ls, lt, ranges, valid = random_inputs(B=2, T=50, M=60, seed=1)
    verdict = dict(top_k=0.4, aggregation="max", all_gather=lambda x: x)
    chosen = step_verdict(ls, lt, ranges, valid, rank=0, **verdict)
    one = one_teacher_weights(ls, lt, ranges, valid, scope="global", chosen=chosen)
    assert torch.equal(one, one_teacher_weights(ls, lt, ranges, valid, scope="batch"))
    with pytest.raises(ValueError, match="needs all_gather"):
        step_verdict(ls, lt, ranges, valid, rank=0, **(verdict | {"all_gather": None}))
    with pytest.raises(ValueError, match="same shape"):
        step_verdict(ls, lt, ranges, valid, rank=1, **verdict)
    with pytest.raises(ValueError, match="pass its verdict as `chosen`"):
        one_teacher_weights(ls, lt, ranges, valid, scope="global")


def random_inputs(B, T, M, seed, nan_rate=0.1, max_len=4):
    g = torch.Generator().manual_seed(seed)
    ls = torch.rand(B, T, generator=g) * 8
    lt = (torch.rand(B, M, generator=g) * 8).masked_fill(torch.rand(B, M, generator=g) < nan_rate, NAN)
    start = torch.randint(0, M + 1, (B, T), generator=g)
    end = torch.minimum(start + torch.randint(0, max_len + 1, (B, T), generator=g), torch.tensor(M))
    valid = torch.rand(B, T, generator=g) < 0.9
    return ls, lt, torch.stack([start, end], -1), valid


@pytest.mark.parametrize("aggregation", ["max", "mean"])
def test_aggregate_teacher_loss_long_ranges(aggregation):
    """Ranges up to the whole teacher row (any length, not only powers of two) with continuous values."""
    ls, lt, ranges, valid = random_inputs(B=2, T=200, M=300, seed=0, nan_rate=0.2, max_len=300)
    ranges[0, :5] = torch.tensor([[0, 300], [0, 0], [300, 300], [299, 300], [1, 257]])
    lt[1, :40] = NAN
    ranges[1, 0] = torch.tensor([3, 37])  # only NaN inside: unmapped
    agg, mapped = aggregate_teacher_loss(lt, ranges, aggregation)
    expected_agg, expected_mapped = reference_aggregate(lt.tolist(), ranges.tolist(), aggregation)
    assert mapped.tolist() == expected_mapped
    assert not mapped[1, 0] and not mapped[0, 1] and not mapped[0, 2]
    assert torch.allclose(agg, torch.tensor(expected_agg), rtol=1e-6, atol=0)
    assert (ranges[..., 1] - ranges[..., 0]).max() == 300


def test_aggregate_teacher_loss_rejects_ranges_outside_the_row():
    lt = torch.rand(1, 5)
    for bad in ([0, 6], [3, 2], [-1, 2]):
        with pytest.raises(RuntimeError, match="0 <= a <= e <= M=5"):
            aggregate_teacher_loss(lt, torch.tensor([[bad]]))
    with pytest.raises(ValueError, match="aggregation"):
        aggregate_teacher_loss(lt, torch.tensor([[[0, 1]]]), "median")


@pytest.mark.parametrize(
    ("top_k", "n", "expected"),
    [
        (0.7, 10, 7),
        (0.07, 100, 7),
        (0.14, 50, 7),
        (0.55, 100, 55),  # top_k * n is x.000000000000001 in floats
        (0.4, 5, 2),
        (0.4, 6, 3),
        (0.001, 3, 1),
        (1.0, 9, 9),
        (0.0, 9, 0),
    ],
)
def test_selected_count_is_ceil_top_k_times_mapped(top_k, n, expected):
    scores = torch.randn(1, n + 4)
    candidate = torch.tensor([[True] * n + [False] * 4])
    selected = select_top_k(scores, candidate, top_k)
    assert selected.sum() == expected
    assert not selected[0, n:].any()


def test_ties_go_to_the_earlier_token():
    scores = torch.zeros(2, 5)
    candidate = torch.ones(2, 5, dtype=torch.bool)
    assert select_top_k(scores, candidate, 0.3).tolist() == [[True, True, True, False, False], [False] * 5]
    assert select_top_k(scores, candidate, 0.4, scope="sequence").tolist() == [[True, True, False, False, False]] * 2
    # a candidate with -inf excess (an infinite teacher loss) still outranks a non-candidate
    scores[0, 0] = -math.inf
    assert select_top_k(scores, torch.tensor([[True] + [False] * 4] * 2), 1.0)[0, 0]


def make_batch(B=2, T=16, V=50, M=20, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, V, generator=g).to(dtype).requires_grad_()
    targets = torch.randint(0, V, (B, T), generator=g)
    targets[:, -2:] = -100
    _, lt, ranges, _ = random_inputs(B, T, M, seed)
    return logits, targets, lt, ranges


@pytest.mark.parametrize("ignore_index", [-100, 0])
@pytest.mark.parametrize("chunk_size", [1, 5, 128])
def test_per_token_cross_entropy_matches_torch(ignore_index, chunk_size):
    logits, targets, _, _ = make_batch()
    targets[targets == -100] = ignore_index
    targets[0, :3] = ignore_index
    loss = per_token_cross_entropy(logits, targets, ignore_index=ignore_index, chunk_size=chunk_size)
    expected = F.cross_entropy(logits.double().transpose(1, 2), targets, ignore_index=ignore_index, reduction="none")
    assert loss.dtype == torch.float32 and loss.shape == targets.shape
    assert torch.allclose(loss.double(), expected, atol=1e-5)
    assert (loss[targets == ignore_index] == 0).all()
    upstream = torch.randn(targets.shape)
    (grad,) = torch.autograd.grad((loss * upstream).sum(), logits)
    (expected_grad,) = torch.autograd.grad((expected * upstream).sum(), logits)
    assert torch.allclose(grad, expected_grad.float(), atol=1e-6)


def test_per_token_cross_entropy_bf16_is_float32_and_keeps_no_float32_logits():
    logits, targets, _, _ = make_batch(B=2, T=64, V=1000, dtype=torch.bfloat16)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        loss = per_token_cross_entropy(logits, targets, chunk_size=16)
    assert loss.dtype == torch.float32
    expected = F.cross_entropy(logits.double().transpose(1, 2), targets, reduction="none")
    assert torch.allclose(loss.double(), expected, atol=1e-5)  # float32 math on the bf16 values
    assert sum(t.numel() * t.element_size() for t in saved) < 1.1 * logits.numel() * logits.element_size()
    (grad,) = torch.autograd.grad(loss.sum(), logits)
    assert grad.dtype == torch.bfloat16
    (expected_grad,) = torch.autograd.grad(expected.sum(), logits)
    assert torch.allclose(grad.double(), expected_grad.double(), atol=4e-3)


def test_per_token_cross_entropy_rejects_bad_shapes():
    with pytest.raises(ValueError, match=r"logits must be \(B, T, V\)"):
        per_token_cross_entropy(torch.randn(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))


def guided_loss_of_logits(
    args,
    logits,
    targets,
    teacher_loss=None,
    ranges=None,
    teacher_logits=None,
    positions=None,
    all_gather=None,
    rank=0,
    **run,
):
    """`GuidedLoss` as `micro_batch.forward_and_loss` calls it, for one teacher (its loss and ranges, each a list
    of one): the student's per-token cross-entropy first; `positions` (B,) default to the rows' indices. Under scope
    "global" a step of one micro-batch per rank, its verdict from `GuidedLoss.ranking` and the top-k over every rank's
    (`all_gather`, `rank`), as `micro_batch.step_choice` ranks it. `run`: the other arguments of `GuidedLoss`."""
    ls = per_token_cross_entropy(logits, targets)
    teacher_losses = None if teacher_loss is None else [teacher_loss]
    positions = torch.arange(len(targets)) if positions is None else positions
    inputs = LossInputs(
        teacher_losses, None if ranges is None else [ranges], logits, teacher_logits, positions=positions
    )
    guided, valid = GuidedLoss(args, **run), targets != -100
    if args.scope == "global":
        scores, candidates = guided.ranking(ls.detach(), valid, inputs)
        chosen = select_top_k(scores, candidates, args.top_k, scope="global", all_gather=all_gather, rank=rank)
        inputs = inputs._replace(chosen=chosen)
    return guided(ls, valid, inputs)


def random_weights(valid, mapped, top_k, unmapped, draws, **kwargs):
    return random_selection(valid, mapped, top_k, unmapped, draws, **kwargs).weights


def reference_loss(weights, logits, targets):
    ce = F.cross_entropy(logits.double().transpose(1, 2), targets, reduction="none")
    return (weights.double() * ce).sum()


@pytest.mark.parametrize("method", ["vocagnolm", "chunk", "rho1", "random", "ce"])
def test_guided_loss_is_the_weighted_ce_sum_and_gradients_reach_only_the_student(method):
    logits, targets, lt, ranges = make_batch(M=16)
    lt.requires_grad_()
    args = GuidanceArgs(method=method, top_k=0.3)
    loss_sum, weight_sum, metrics = guided_loss_of_logits(args, logits, targets, teacher_loss=lt, ranges=ranges)
    valid = targets != -100
    if method == "ce":
        weights = valid.float()
    elif method == "random":
        mapped = aggregate_teacher_loss(lt, ranges)[1]
        draws = position_draws(0, torch.arange(len(targets)), targets.shape[1])
        weights = random_weights(valid, mapped, 0.3, "include", draws)
    else:
        ls = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
        weights = one_teacher_weights(ls, lt, ranges, valid, top_k=0.3)
    assert weight_sum == weights.sum() and not weight_sum.requires_grad
    expected = reference_loss(weights, logits, targets)
    assert torch.allclose(loss_sum.double(), expected, atol=1e-4)
    (loss_sum / weight_sum.clamp(min=1)).backward()
    assert lt.grad is None
    (expected_grad,) = torch.autograd.grad(expected / weights.sum(), logits)
    assert torch.allclose(logits.grad.double(), expected_grad.double(), atol=1e-6)
    assert all(not m.requires_grad and m.shape == () and torch.isfinite(m) for m in metrics.values())


def test_guided_loss_metrics():
    logits, targets, lt, ranges = make_batch(B=3, T=40, M=45)
    loss_sum, weight_sum, metrics = guided_loss_of_logits(
        GuidanceArgs(), logits, targets, teacher_loss=lt, ranges=ranges
    )
    valid = targets != -100
    ls = F.cross_entropy(logits.detach().transpose(1, 2), targets, reduction="none")
    agg, mapped = aggregate_teacher_loss(lt, ranges)
    candidate = valid & mapped
    selected = candidate & (one_teacher_weights(ls, lt, ranges, valid) > 0)
    excess = ls - agg
    expected = {
        "student_loss": ls[valid].mean(),
        "mapped_fraction": candidate.sum() / valid.sum(),
        "selected_fraction": selected.sum() / candidate.sum(),
        "teacher_loss": agg[candidate].mean(),
        "excess_selected": excess[selected].mean(),
        "excess_unselected": excess[candidate & ~selected].mean(),
        "trained_fraction": weight_sum / valid.sum(),
    }
    assert metrics.keys() == expected.keys()
    for name, value in expected.items():
        assert torch.allclose(metrics[name], value.float(), atol=1e-5), name
    assert math.ceil(0.4 * candidate.sum().item()) == selected.sum()
    assert metrics["excess_selected"] > metrics["excess_unselected"]


@pytest.mark.parametrize("method", ["vocagnolm", "random", "ce"])
@pytest.mark.parametrize("unmapped", ["include", "exclude"])
@pytest.mark.parametrize("case", ["no valid", "no mapped", "all NaN teacher", "no teacher tokens"])
def test_guided_loss_without_mapped_or_valid_tokens_is_finite(method, unmapped, case):
    logits, targets, lt, ranges = make_batch()
    if case == "no valid":
        targets[:] = -100
    elif case == "no mapped":
        ranges[..., 1] = ranges[..., 0]
    elif case == "all NaN teacher":
        lt[:] = NAN
    else:
        lt, ranges = lt[:, :0], torch.zeros_like(ranges)
    args = GuidanceArgs(method=method, unmapped=unmapped)
    loss_sum, weight_sum, metrics = guided_loss_of_logits(args, logits, targets, teacher_loss=lt, ranges=ranges)
    loss = loss_sum / weight_sum.clamp(min=1)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logits.grad).all()
    # The loss is finite; a figure over no token is nothing (NaN, left out of the logged mean), never a made-up 0.
    over_none = {"selected_fraction", "teacher_loss", "excess_selected", "excess_unselected"}  # no mapped token
    if case == "no valid":
        over_none |= set(metrics)
    assert all(torch.isfinite(m) for name, m in metrics.items() if name not in over_none)
    assert all(metrics[name].isnan() for name in over_none & set(metrics))
    valid = targets != -100
    if method == "ce" or unmapped == "include":
        assert weight_sum == valid.sum()
    else:
        assert weight_sum == 0 and loss == 0
    if method != "ce":
        assert case == "no valid" or metrics["mapped_fraction"] == 0


def test_bf16_inputs():
    logits, targets, lt, ranges = make_batch(dtype=torch.bfloat16)
    loss_sum, weight_sum, _ = guided_loss_of_logits(
        GuidanceArgs(), logits, targets, teacher_loss=lt.bfloat16(), ranges=ranges
    )
    assert loss_sum.dtype == torch.float32 and torch.isfinite(loss_sum)
    loss_sum.backward()
    assert logits.grad.dtype == torch.bfloat16 and torch.isfinite(logits.grad.float()).all()
    upcast = logits.detach().float().requires_grad_()
    expected, expected_weight, _ = guided_loss_of_logits(
        GuidanceArgs(), upcast, targets, teacher_loss=lt.bfloat16().float(), ranges=ranges
    )
    assert weight_sum == expected_weight and torch.allclose(loss_sum, expected)


def test_vocagnolm_equals_rho1_with_one_to_one_ranges():
    logits, targets, lt, _ = make_batch(B=2, T=30, M=30)
    lt[:, 0] = NAN  # the first token of a teacher window has no loss
    one_to_one = torch.stack([torch.arange(30), torch.arange(1, 31)], -1).expand(2, 30, 2)
    for aggregation in ("max", "mean"):
        ours = guided_loss_of_logits(
            GuidanceArgs(aggregation=aggregation), logits, targets, teacher_loss=lt, ranges=one_to_one
        )
        rho1 = guided_loss_of_logits(
            GuidanceArgs(method="rho1", aggregation=aggregation), logits, targets, teacher_loss=lt
        )
        assert torch.equal(ours[0], rho1[0]) and torch.equal(ours[1], rho1[1])
        assert ours[2].keys() == rho1[2].keys()
    with pytest.raises(ValueError, match="pairs token i with teacher token i"):
        guided_loss_of_logits(GuidanceArgs(method="rho1"), logits, targets, teacher_loss=lt[:, :20])


def test_random_weights_are_the_right_count_uniformly_drawn():
    g = torch.Generator().manual_seed(0)
    valid = torch.rand(4, 50, generator=g) < 0.9
    mapped = torch.rand(4, 50, generator=g) < 0.7
    candidate = valid & mapped
    counts = torch.zeros(4, 50)
    for step in range(400):  # the same 4 rows at 400 places of the data order
        weights = random_weights(valid, mapped, 0.4, "exclude", position_draws(7, 4 * step + torch.arange(4), 50))
        assert weights.sum() == math.ceil(0.4 * candidate.sum().item())
        assert not weights[~candidate].any()
        counts += weights
    frequency = counts[candidate] / 400
    assert (frequency - 0.4).abs().max() < 0.12  # binomial(400, 0.4): 5 standard deviations ~ 0.12
    draws = position_draws(7, torch.arange(4), 50)
    included = random_weights(valid, mapped, 0.4, "include", draws)
    assert torch.equal(included[valid & ~mapped], torch.ones((valid & ~mapped).sum()))
    per_row = random_weights(valid, mapped, 0.4, "exclude", draws, scope="sequence")
    assert per_row.sum(-1).tolist() == [math.ceil(0.4 * n) for n in candidate.sum(-1).tolist()]


def test_random_draws_are_a_function_of_the_seed_and_the_place_in_the_data_alone():
    """Each draw depends on (seed, the row's position in the data order, the token's index) and nothing else: the
    same rows drawn in any grouping (one batch, one row at a time, another micro-batch size, another process) give
    the same numbers; another seed or place others. They are uniform 24-bit numbers in [0, 1), without correlation
    between neighbouring tokens or rows, and the hash matches a plain-Python murmur3 finaliser."""
    positions = torch.arange(1000, 1064)
    whole = position_draws(3, positions, 128)  # (64, 128)
    assert torch.equal(torch.cat([position_draws(3, positions[i : i + 1], 128) for i in range(64)]), whole)
    assert torch.equal(position_draws(3, positions.flip(0), 128), whole.flip(0))
    assert not torch.equal(position_draws(4, positions, 128), whole)
    assert not torch.equal(position_draws(3, positions + 64, 128), whole)
    assert whole.dtype == torch.float32 and 0 <= whole.min() and whole.max() < 1
    assert torch.equal(whole * 2**24, (whole * 2**24).round())  # 24-bit grid: exact in float32
    many = position_draws(0, torch.arange(4096), 256).flatten()  # 1M draws
    assert abs(many.mean().item() - 0.5) < 2e-3 and abs(many.var().item() - 1 / 12) < 2e-3
    histogram = torch.histc(many, bins=16, min=0, max=1)
    assert ((histogram - many.numel() / 16).abs() / (many.numel() / 16) ** 0.5).max() < 5  # 5 sigma per bin
    grid = position_draws(0, torch.arange(1024), 256)
    for a, b in ((grid[:, 1:], grid[:, :-1]), (grid[1:], grid[:-1])):
        assert abs(torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1].item()) < 0.01

    def fmix32(x: int) -> int:
        x ^= x >> 16
        x = (x * 0x85EBCA6B) & 0xFFFFFFFF
        x ^= x >> 13
        x = (x * 0xC2B2AE35) & 0xFFFFFFFF
        return x ^ (x >> 16)

    key = hashlib.sha256(b"3").digest()
    salt = [int.from_bytes(key[i : i + 4], "little") for i in (0, 4)]
    count = (1 << 40) * 128 + 5  # a position past 32 bits
    expected = fmix32(fmix32((count & 0xFFFFFFFF) ^ salt[0]) ^ (count >> 32) ^ salt[1]) >> 8
    assert position_draws(3, torch.tensor([1 << 40]), 128)[0, 5].item() * 2**24 == expected


def reference_kl(student: list[float], teacher: list[float], vocab_size: int, temperature: float) -> float:
    """KL(p || q) over ids [0, vocab_size): p the teacher's softmax over those ids alone (its other columns dropped,
    renormalised), q the student's softmax over all its columns."""
    p_norm = math.fsum(math.exp(t / temperature) for t in teacher[:vocab_size])
    q_norm = math.fsum(math.exp(s / temperature) for s in student)
    kl = 0.0
    for s, t in zip(student[:vocab_size], teacher[:vocab_size]):
        p, q = math.exp(t / temperature) / p_norm, math.exp(s / temperature) / q_norm
        kl += p * math.log(p / q)
    return kl * temperature**2


@pytest.mark.parametrize("temperature", [1.0, 2.0])
@pytest.mark.parametrize(("Vs", "Vt", "vocab_size"), [(40, 40, 40), (32, 48, 32), (40, 48, 32)])
def test_kld_loss_compares_over_the_student_vocabulary(temperature, Vs, Vt, vocab_size):
    """Equal vocabularies; a teacher with more tokens (Llemma's 32,016 over TinyLlama's 32,000); and a student head
    padded beyond its tokenizer as well."""
    student, targets, _, _ = make_batch(B=2, T=9, V=Vs)
    teacher = torch.randn(2, 9, Vt, requires_grad=True)
    valid = targets != -100
    kl = kld_loss(student, teacher, valid, vocab_size, temperature, chunk_size=4)
    for b in range(2):
        for i in range(9):
            expected = reference_kl(student[b, i].tolist(), teacher[b, i].tolist(), vocab_size, temperature)
            assert kl[b, i].item() == pytest.approx(expected if valid[b, i] else 0.0, abs=1e-5)
    kl.sum().backward()
    assert teacher.grad is None and student.grad is not None
    # The teacher's extra columns do not count: the same logits over the student's tokens give KL 0.
    same = torch.cat([student.detach()[..., :vocab_size], torch.randn(2, 9, Vt - vocab_size)], -1)
    if Vs == vocab_size:
        assert torch.allclose(kld_loss(student, same, valid, vocab_size), torch.zeros(2, 9), atol=1e-5)
    with pytest.raises(ValueError, match="the teacher's vocabulary must hold the student's"):
        kld_loss(student, teacher[..., : vocab_size - 1], valid, vocab_size)


def reference_uld(student_row: torch.Tensor, teacher_row: torch.Tensor) -> float:
    q = sorted(torch.softmax(student_row.double(), -1).tolist(), reverse=True)
    p = sorted(torch.softmax(teacher_row.double(), -1).tolist(), reverse=True)
    size = max(len(p), len(q))
    q, p = q + [0.0] * (size - len(q)), p + [0.0] * (size - len(p))
    return sum(abs(a - b) for a, b in zip(q, p))


@pytest.mark.parametrize(("Vs", "Vt"), [(30, 70), (70, 30), (40, 40)])
def test_uld_loss_matches_reference(Vs, Vt):
    student, targets, _, _ = make_batch(B=2, T=7, V=Vs)
    teacher = torch.randn(2, 5, Vt) * 3
    pair_index = torch.randint(-1, 5, (2, 7))
    valid = targets != -100
    loss = uld_loss(student, teacher, pair_index, valid, chunk_size=3)
    for b in range(2):
        for i in range(7):
            j = pair_index[b, i].item()
            expected = reference_uld(student[b, i], teacher[b, j]) if valid[b, i] and j >= 0 else 0.0
            assert loss[b, i].item() == pytest.approx(expected, abs=2e-6)
    loss.sum().backward()
    assert torch.isfinite(student.grad).all() and student.grad.abs().sum() > 0


@pytest.mark.parametrize("method", ["kld", "uld"])
def test_guided_loss_adds_the_distillation_term_to_every_valid_token(method):
    logits, targets, _, ranges = make_batch(B=2, T=8, V=32, M=10)
    valid = targets != -100
    teacher_logits = torch.randn(2, 10, 48 if method == "kld" else 64)  # kld: the student's 32 tokens and 16 more
    pair_index = paired_teacher_positions(ranges)
    assert (pair_index >= 0).any() and (pair_index == -1).any()
    if method == "kld":  # each student position against the teacher's paired position; unpaired: KL 0
        distill = torch.zeros(2, 8)
        for b, i in zip(*torch.nonzero(valid & (pair_index >= 0), as_tuple=True)):
            teacher_row = teacher_logits[b, pair_index[b, i]].tolist()
            distill[b, i] = reference_kl(logits[b, i].tolist(), teacher_row, 32, 1.5)
    else:
        distill = uld_loss(logits, teacher_logits, pair_index, valid)
    args = GuidanceArgs(method=method, temperature=1.5 if method == "kld" else 1.0, distill_weight=0.5)
    loss_sum, weight_sum, metrics = guided_loss_of_logits(
        args, logits, targets, teacher_logits=teacher_logits, ranges=ranges, vocab_size=32
    )
    ce = F.cross_entropy(logits.double().transpose(1, 2), targets, reduction="none")
    assert weight_sum == valid.sum()
    assert torch.allclose(loss_sum.double(), (ce + 0.5 * distill.double()).sum(), atol=1e-4)
    assert torch.allclose(metrics["distill_loss"], distill.sum() / valid.sum())


def test_paired_teacher_positions():
    ranges = torch.tensor([[[0, 2], [2, 3], [3, 3], [5, 7]]])  # starts the window, mapped, unmapped, mapped
    assert paired_teacher_positions(ranges).tolist() == [[-1, 1, -1, 4]]


def test_guided_loss_names_missing_inputs():
    logits, targets, lt, ranges = make_batch()
    for method, kwargs, message in [
        ("vocagnolm", dict(ranges=ranges), "needs teacher_loss"),
        ("chunk", dict(teacher_loss=lt), "needs ranges"),
        ("random", dict(), "needs ranges"),
        ("kld", dict(ranges=ranges), "needs teacher_logits"),
        ("uld", dict(teacher_logits=torch.randn(2, 20, 60)), "needs ranges"),
    ]:
        with pytest.raises(ValueError, match=message):
            guided_loss_of_logits(GuidanceArgs(method=method), logits, targets, **kwargs)


def test_guidance_args():
    assert GuidanceArgs().method == "vocagnolm" and GuidanceArgs().top_k == 0.4
    for kwargs, message in [
        (dict(top_k=-0.1), r"top_k must be in \(0, 1\]"),
        (dict(top_k=1.5), r"top_k must be in \(0, 1\]"),
        (dict(method="distill"), "method must be one of"),
        (dict(scope="node"), "scope must be one of"),
        (dict(temperature=0.0), "temperature must be > 0"),
        (dict(distill_weight=-1.0), "distill_weight"),
        (dict(num_chunks=0), "num_chunks"),
    ]:
        with pytest.raises(ValueError, match=message):
            GuidanceArgs(**kwargs)
    flags = {
        name: (
            method.teacher_loss,
            method.teacher_logits,
            method.same_vocabulary,
            method.alignment,
            method.selects,
            method.several_teachers,
        )
        for name, method in METHODS.items()
    }
    assert flags == {  # the paper's methods, as Table 1-2 describe them
        "vocagnolm": (True, False, False, "token", True, True),
        "ce": (False, False, False, None, False, False),
        "rho1": (True, False, True, None, True, True),
        "kld": (False, True, True, "token", False, False),
        "uld": (False, True, False, "token", False, False),
        "chunk": (True, False, False, "chunk", True, True),
        "random": (False, False, False, "token", True, True),
    }
    assert GuidanceArgs(method="chunk").num_chunks_if_chunked == 8 and GuidanceArgs().num_chunks_if_chunked is None
    GuidanceArgs(top_k=1.0)  # every mapped token: the edge of the range
    with pytest.raises(InvalidArgument, match=r"guidance.top_k must be in \(0, 1\]"):
        GuidanceArgs(top_k=0.0)  # would train no mapped token: only the unmapped ones, silently
    GuidanceArgs(method="uld").check_tokenizers(same_vocabulary=False)
    GuidanceArgs(method="kld").check_tokenizers(same_vocabulary=True)
    with pytest.raises(ValueError, match="needs a teacher with the student's vocabulary.*--guidance.method vocagnolm"):
        GuidanceArgs(method="kld").check_tokenizers(same_vocabulary=False)


def test_guidance_args_on_the_command_line():
    from jsonargparse import ArgumentParser, set_parsing_settings

    set_parsing_settings(docstring_parse_attribute_docstrings=True)
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(GuidanceArgs, "guidance")
    config = parser.parse_args(["--guidance.top_k", "0.2", "--guidance.scope", "sequence"])
    assert parser.instantiate_classes(config).guidance == GuidanceArgs(top_k=0.2, scope="sequence")
    help_text = " ".join(parser.format_help().split())
    assert "Fraction of the mapped tokens trained" in help_text
    for method in METHODS.values():  # --help reads the table
        assert f"{method.name}: {method.description}" in help_text
    with pytest.raises(Exception):
        parser.parse_args(["--guidance.aggregation", "median"])


def test_the_readme_example_of_a_new_method(monkeypatch):
    """docs/adding-a-method.md: the worked example's ranking and entry, as written there, against a loop."""
    from litgpt_vocagnolm.loss.methods import METHODS, GuidanceMethod, LossInputs, top_k_by_ranking

    def student_loss_ranking(guided: "GuidedLoss", ls, valid, inputs: LossInputs):
        """The student's own loss; every valid token is a candidate."""
        return ls.detach(), valid

    method = GuidanceMethod(
        "hardest", "the top-k tokens by the student's own loss, no teacher", top_k_by_ranking,
        ranking=student_loss_ranking,
    )  # fmt: skip
    assert not method.needs_prepared_data and method.selects  # plain LitGPT data will do
    ls = torch.tensor([[0.5, 3.0, 1.0, 2.0], [4.0, 0.1, 0.2, 9.0]])
    valid = torch.tensor([[True, True, True, True], [True, True, True, False]])
    monkeypatch.setitem(METHODS, "hardest", method)  # in the table, as the entry would be
    args = GuidanceArgs(top_k=0.5)
    args.method = "hardest"  # past the choices `--guidance.method` was built with at import
    per_token, weights, metrics = method.loss(GuidedLoss(args), ls, valid, LossInputs())
    ranked = sorted((-v, i) for i, (v, ok) in enumerate(zip(ls.flatten().tolist(), valid.flatten().tolist())) if ok)
    expected = torch.zeros(8)
    expected[[i for _, i in ranked[: math.ceil(0.5 * len(ranked))]]] = 1.0  # 4 of the 7 valid tokens
    assert torch.equal(weights.flatten(), expected) and per_token is ls
    assert metrics["selected_fraction"].item() == pytest.approx(4 / 7)
