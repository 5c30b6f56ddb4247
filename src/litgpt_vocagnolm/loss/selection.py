"""Teacher Guided Loss (Shin et al., ICML 2025; docs/design.md, "Teacher-guided loss"): which student tokens train.

Each student token's reference is its teachers' aggregated loss over its range of teacher tokens; the tokens whose
loss exceeds it most are selected. `teacher_guided_weights` is the contract; `methods` builds the guidance methods on
these pieces (and on `distillation`).

Pure functions: tensors in, tensors out. Nothing here knows about Fabric or process groups; the one cross-rank
ranking (`scope="global"`, `select_top_k` over a whole optimizer step) takes an `all_gather` callable, as torchtitan
passes `global_valid_tokens`, and hands each micro-batch its verdict (`chosen`).
Selection runs under `no_grad`: weights carry no gradient, only the student's per-token loss does.
"""

import hashlib
import math
from dataclasses import dataclass
from typing import Callable, Literal, NamedTuple, Sequence, get_args

import torch
import torch.nn.functional as F
from torch import Tensor

from litgpt_vocagnolm.errors import InvalidArgument

Aggregation = Literal["max", "mean"]
Unmapped = Literal["include", "exclude"]
Scope = Literal["batch", "sequence", "global"]
Combine = Literal["min", "mean"]  # how several teachers' aggregated losses make a reference
Compare = Literal["token", "byte"]  # the scale teachers' losses are compared on: per teacher token, or per byte
AllGather = Callable[[Tensor], Tensor]


class TokenBytes(NamedTuple):
    """The UTF-8 bytes of text each token of a batch covers (`lexical.token_byte_lengths`): what puts teachers that
    cut the same text into longer or shorter tokens on one scale (`teacher_reference`)."""

    student: Tensor
    """(B, T) of each student target token; 0 for special tokens and padding."""
    teachers: list[Tensor]
    """(B, M_k) of each teacher's window tokens, one per teacher."""

    @classmethod
    def look_up(cls, tables: Sequence[Tensor], targets: Tensor, teacher_ids: Sequence[Tensor]) -> "TokenBytes":
        """From per-id tables, (V,) each: the student's, then one per teacher. targets (B, T), -100 on padding;
        teacher_ids (B, M_k) per teacher, padded with 0."""
        student_table, *teacher_tables = tables
        student = torch.where(targets >= 0, student_table[targets.clamp(min=0)], 0)
        return cls(student, [table[ids] for table, ids in zip(teacher_tables, teacher_ids, strict=True)])


def check_top_k(top_k: float, what: str = "top_k") -> None:
    """The one range check of `top_k`, where it enters (`GuidanceArgs`, `SelectionArgs`): 1 selects all the mapped
    tokens; 0, none of them, would train the unmapped tokens alone (or nothing), so it is refused."""
    if not 0 < top_k <= 1:
        raise InvalidArgument(f"{what} must be in (0, 1]: above 0, at most 1 (the paper uses 0.4), got {top_k}")


@torch.no_grad()
def aggregate_teacher_loss(lt: Tensor, ranges: Tensor, aggregation: Aggregation = "max") -> tuple[Tensor, Tensor]:
    """The teacher loss of each student token: max (or mean) over its range of teacher tokens.

    Cost does not depend on range length: a mean is a difference of float64 prefix sums; a max is the larger of two
    overlapping power-of-two windows from a sparse table (log2(M) + 1 rows of window maxima). O(B M log M + B T),
    no loop over tokens, exact for any range.

    Args:
        lt: (B, M) teacher per-token loss, NaN where unavailable (the first token of a teacher window, padding).
        ranges: (B, T, 2) integer; student token i maps to teacher tokens [a, e) of its row, 0 <= a <= e <= M,
            a == e for an unmapped token.
        aggregation: "max" or "mean" of the non-NaN values in the range.

    Returns: `agg` (B, T) float32, 0 where unmapped, and `mapped` (B, T) bool: the range holds a non-NaN value.
    """
    if aggregation not in get_args(Aggregation):
        raise ValueError(f"aggregation must be one of {get_args(Aggregation)}, got {aggregation!r}")
    if lt.dim() != 2 or ranges.dim() != 3 or ranges.shape[-1] != 2 or ranges.shape[0] != lt.shape[0]:
        raise ValueError(f"lt must be (B, M) and ranges (B, T, 2), got {tuple(lt.shape)} and {tuple(ranges.shape)}")
    (B, M), T = lt.shape, ranges.shape[1]
    start, end = ranges.long().unbind(-1)  # (B, T) each
    # Checked on the device: a host sync here would stall every micro-batch.
    torch._assert_async(
        ((start >= 0) & (start <= end) & (end <= M)).all(),
        f"ranges must satisfy 0 <= a <= e <= M={M} (a == e: unmapped); fix the alignment that built them",
    )
    if M == 0:
        return torch.zeros(B, T, device=lt.device), torch.zeros(B, T, dtype=torch.bool, device=lt.device)
    available = ~torch.isnan(lt)
    counts = F.pad(available.long().cumsum(-1), (1, 0))  # (B, M + 1): counts[:, j] = available in [0, j)
    mapped = counts.gather(1, end) > counts.gather(1, start)
    if aggregation == "mean":
        # float64: a float32 difference of prefix sums would lose ~1e-3 at M = 2048
        sums = F.pad(torch.where(available, lt.double(), 0.0).cumsum(-1), (1, 0))  # (B, M + 1)
        count = (counts.gather(1, end) - counts.gather(1, start)).clamp(min=1)
        agg = ((sums.gather(1, end) - sums.gather(1, start)) / count).float()
    else:
        table = [torch.where(available, lt.float(), -math.inf)]  # table[k][b, j] = max lt[b, j : j + 2**k]
        while 2 ** len(table) <= M:
            width, previous = 2 ** (len(table) - 1), table[-1]
            table.append(torch.maximum(previous, F.pad(previous[:, width:], (0, width), value=-math.inf)))
        levels = torch.stack(table)  # (log2(M) + 1, B, M)
        length = (end - start).clamp(min=1)
        level = torch.frexp(length.float()).exponent.long() - 1  # floor(log2(length)), exact below 2**24
        row = torch.arange(B, device=lt.device)[:, None]
        left = levels[level, row, start.clamp(max=M - 1)]
        right = levels[level, row, (end - 2**level).clamp(min=0)]
        agg = torch.maximum(left, right)
    return torch.where(mapped, agg, 0.0), mapped


@torch.no_grad()
def teacher_reference(
    lts: Sequence[Tensor],
    ranges: Sequence[Tensor],
    aggregation: Aggregation = "max",
    combine: Combine = "min",
    token_bytes: TokenBytes | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Each student token's reference loss, from one teacher or several (docs/design.md, "Teacher-guided loss", step 1).

    Each teacher's losses are aggregated over the token's range in that teacher's own window (`aggregate_teacher_loss`);
    then `min` takes the lowest aggregate among the teachers that map the token (the teacher best at it sets the
    reference), `mean` their mean. A token is mapped if any teacher maps it. With one teacher: its aggregate, exactly.

    Per byte (`token_bytes` given): each teacher token's loss is first divided by the bytes of its text (a token of no
    text is unavailable), so the aggregates are nats per byte, on one scale whether a teacher cuts the text into long
    tokens or short ones; the combined aggregate is then multiplied by the student token's bytes: the cost of the
    student token's text at that rate, on the scale of the student's own loss. With the student's tokenizer as the one
    teacher's, this is the per-token reference again.

    Args:
        lts: (B, M_k) teacher per-token loss for each teacher k (NaN where unavailable); the teachers' windows may
            differ in length.
        ranges: (B, T, 2) for each teacher, into its window (a == e: unmapped).
        aggregation: "max" or "mean" over a range.
        combine: "min" or "mean" across teachers.
        token_bytes: compare per byte (see above): the bytes of the student's targets (B, T) and of each teacher's
            window tokens (B, M_k); None compares the teachers' losses per token, as they are.

    Returns: `reference` (B, T) float32, 0 where unmapped; `mapped` (B, T) bool; `best` (B, T) long, the teacher with
        the lowest aggregate on the token (the first of equals; per byte with `token_bytes`), -1 where unmapped.
    """
    if not lts or len(lts) != len(ranges):
        raise ValueError(f"one ranges tensor per teacher loss: got {len(lts)} losses and {len(ranges)} ranges")
    if combine not in get_args(Combine):
        raise ValueError(f"combine must be one of {get_args(Combine)}, got {combine!r}")
    if token_bytes is not None:
        if len(token_bytes.teachers) != len(lts):
            raise ValueError(f"token_bytes has {len(token_bytes.teachers)} teachers' bytes for {len(lts)} teachers")
        lts = [
            torch.where(size > 0, loss.float() / size.clamp(min=1), math.nan)  # nats per byte of each token
            for loss, size in zip(lts, token_bytes.teachers)
        ]
    aggregates, maps = zip(*(aggregate_teacher_loss(loss, r, aggregation) for loss, r in zip(lts, ranges)))
    each, mapped_by = torch.stack(aggregates), torch.stack(maps)  # (K, B, T) each
    mapped = mapped_by.any(0)  # (B, T)
    lowest, best = torch.where(mapped_by, each, math.inf).min(0)  # (B, T) each
    if combine == "min":
        reference = lowest
    else:
        reference = torch.where(mapped_by, each, 0.0).sum(0) / mapped_by.sum(0).clamp(min=1)
    if token_bytes is not None:  # nats per byte -> nats for the student token's text
        reference = reference * token_bytes.student
    return torch.where(mapped, reference, 0.0), mapped, torch.where(mapped, best, -1)


@torch.no_grad()
def select_top_k(
    scores: Tensor,
    candidate: Tensor,
    top_k: float,
    *,
    scope: Scope = "batch",
    all_gather: AllGather | None = None,
    rank: int = 0,
) -> Tensor:
    """The `ceil(top_k * n)` candidates with the largest score among the n candidates of each scope.

    Ties go to the earlier token in the data: by (b, t) in a batch, t in a sequence, and across ranks in the order of
    the step's micro-batches (micro-batch k of rank r is the step's (k·W + r)-th: `order.RankBatches`), so that one
    process and W processes rank a step's tokens alike.

    Args:
        scores: (B, T) float; for "global" also (A, B, T): this rank's A micro-batches of an optimizer step, in the
            order it trains them.
        candidate: bool, the shape of `scores`: tokens that may be selected.
        top_k: fraction in (0, 1].
        scope: "batch" (the whole tensor), "sequence" (each row) or "global" (every rank's tensor: the step).
        all_gather: for "global": stacks a tensor from every data-parallel rank along a new leading dim
            (`fabric.all_gather`; with one process it may return its input unchanged). All ranks need equal shapes.
        rank: this process's index in the `all_gather` result (`fabric.global_rank`).

    Returns: bool, the shape of `scores`.
    """
    if scope == "sequence":
        return _top_k_rows(scores, candidate, top_k)
    if scope == "batch":
        return _top_k_rows(scores.reshape(1, -1), candidate.reshape(1, -1), top_k).view_as(candidate)
    if scope != "global":
        raise ValueError(f"scope must be one of {get_args(Scope)}, got {scope!r}")
    if all_gather is None:
        raise ValueError("scope='global' needs all_gather (e.g. fabric.all_gather) and this process's rank")
    local = torch.stack([scores.float(), candidate.float()])  # (2, [A,] B, T): one collective instead of two
    gathered = all_gather(local)
    if gathered.dim() == local.dim():  # one process: fabric.all_gather adds no leading dim
        gathered = gathered[None]
    if gathered.shape[1:] != local.shape or not 0 <= rank < gathered.shape[0]:
        raise ValueError(
            f"all_gather gave {tuple(gathered.shape)} for local {tuple(local.shape)} at rank {rank}: every rank"
            " needs micro-batches of the same shape, and rank must index the gathered dim"
        )
    world = gathered.shape[0]
    steps = gathered.view(world, 2, -1, *scores.shape[-2:]).transpose(0, 2)  # (A, 2, W, B, T): the step's order
    selected = _top_k_rows(steps[:, 0].reshape(1, -1), steps[:, 1].reshape(1, -1).bool(), top_k)
    return selected.view(-1, world, *scores.shape[-2:])[:, rank].view_as(candidate)


def _top_k_rows(scores: Tensor, candidate: Tensor, top_k: float) -> Tensor:
    # scores, candidate (R, N) -> (R, N) bool: ceil(top_k * n_r) per row, without a host sync.
    n = candidate.sum(-1, keepdim=True)  # (R, 1)
    # 0.07 * 100 is 7.000000000000001 in floating point; the tolerance makes it 7 (top_k has < 9 decimals).
    k = torch.ceil(n.double() * top_k - 1e-9)
    # Candidates strictly above non-candidates, so a -inf excess still outranks a non-candidate.
    keys = torch.where(candidate, scores.float().nan_to_num(), -math.inf)
    order = torch.sort(keys, dim=-1, descending=True, stable=True).indices  # stable: ties by position
    position = torch.arange(scores.shape[-1], device=scores.device).expand_as(order)
    ranking = torch.empty_like(order).scatter_(-1, order, position)
    return candidate & (ranking < k)


class Selection(NamedTuple):
    """The tokens a selecting method trains, and what it saw; all (B, T), no gradient."""

    weights: Tensor
    """float32 in {0, 1}: 1 selected, 0 mapped-unselected, 1 valid unmapped if included, 0 invalid."""
    mapped: Tensor
    """bool: valid tokens with a reference (the candidates of the top-k)."""
    selected: Tensor
    """bool: the candidates the top-k chose."""
    reference: Tensor | None
    """float32: the aggregated teacher loss of mapped tokens, 0 elsewhere; None for `random`."""
    excess: Tensor | None
    """float32: `ls - reference`, the score the top-k ranks; None for `random`."""
    best: Tensor | None = None
    """long: the teacher with the lowest aggregated loss on each mapped token, -1 elsewhere (see `teacher_reference`);
    None for `random` without teacher losses."""


def select(
    scores: Tensor,
    valid: Tensor,
    mapped: Tensor,
    *,
    top_k: float,
    unmapped: Unmapped = "include",
    scope: Scope = "batch",
    chosen: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """The top-k of the valid mapped tokens by `scores`, and the weights that follow (docs/design.md,
    "Teacher-guided loss", steps 3-4). Scope "global" ranks a whole optimizer step's tokens, over its micro-batches and
    ranks (`select_top_k` with them all, before any trains: `micro_batch.step_choice`): `chosen` is that verdict, which
    replaces a ranking of this micro-batch.

    scores (B, T) float; valid, mapped, chosen (B, T) bool. Returns (weights (B, T) float32, candidates, selected)
    where candidates = valid & mapped.
    """
    if unmapped not in get_args(Unmapped):
        raise ValueError(f"unmapped must be one of {get_args(Unmapped)}, got {unmapped!r}")
    candidate = valid & mapped
    if scope == "global":
        if chosen is None:
            raise ValueError(
                "scope='global' ranks a whole optimizer step: pass its verdict as `chosen` (`select_top_k` over the"
                " step's micro-batches with all_gather, as micro_batch.step_choice does)"
            )
        selected = chosen & candidate
    else:
        selected = select_top_k(scores, candidate, top_k, scope=scope)
    keep = selected | (valid & ~mapped) if unmapped == "include" else selected
    return keep.float(), candidate, selected


@dataclass(frozen=True)
class SelectionArgs:
    """How the top-k chooses the tokens a selecting method trains (`methods.GuidanceArgs.selection` for a run)."""

    top_k: float = 0.4
    """Fraction of the valid mapped tokens selected: exactly ceil(top_k * n_mapped) per scope."""
    aggregation: Aggregation = "max"
    """"max" or "mean" of the teacher losses in a range."""
    unmapped: Unmapped = "include"
    """"include" trains valid unmapped tokens (weight 1), "exclude" does not."""
    scope: Scope = "batch"
    """Where the top-k is ranked (`select_top_k`)."""
    combine: Combine = "min"
    """Several teachers: "min" or "mean" of their aggregated losses is the reference (`teacher_reference`)."""

    def __post_init__(self) -> None:
        check_top_k(self.top_k)


@torch.no_grad()
def teacher_guided_selection(
    ls: Tensor,
    lts: Sequence[Tensor],
    ranges: Sequence[Tensor],
    valid: Tensor,
    args: SelectionArgs = SelectionArgs(),
    *,
    token_bytes: TokenBytes | None = None,
    chosen: Tensor | None = None,
) -> Selection:
    """VocAgnoLM's selection: the top-k valid mapped tokens by excess loss `ls - agg(lt[range])`, and what it computed
    on the way (for metrics). `teacher_guided_weights` documents the arguments."""
    reference, mapped, best = teacher_reference(lts, ranges, args.aggregation, args.combine, token_bytes)
    excess = ls.float() - reference
    weights, candidate, selected = select(
        excess,
        valid,
        mapped,
        top_k=args.top_k,
        unmapped=args.unmapped,
        scope=args.scope,
        chosen=chosen,
    )
    return Selection(weights, candidate, selected, reference, excess, best)


def teacher_guided_weights(
    ls: Tensor,
    lts: Sequence[Tensor],
    ranges: Sequence[Tensor],
    valid: Tensor,
    args: SelectionArgs = SelectionArgs(),
    *,
    token_bytes: TokenBytes | None = None,
    chosen: Tensor | None = None,
) -> Tensor:
    """VocAgnoLM's token weights: the top-k valid mapped tokens by excess loss `ls - agg(lt[range])`.

    Args:
        ls: (B, T) student per-token loss (its gradient is not used).
        lts: (B, M_k) teacher per-token loss for each teacher k, NaN where unavailable: `[lt]` for one teacher.
        ranges: (B, T, 2) teacher tokens [a, e) of each student token, a == e unmapped: one per teacher, into its own
            window.
        valid: (B, T) bool, False for padding.
        args: top_k, aggregation, unmapped, scope and combine (see `SelectionArgs`).
        token_bytes: compare the teachers' losses per byte, not per token (`teacher_reference`).
        chosen: (B, T) bool, scope "global": the verdict of the top-k over the whole optimizer step (`select`).

    Returns: (B, T) float32 weights in {0, 1}, no gradient.
    """
    return teacher_guided_selection(ls, lts, ranges, valid, args, token_bytes=token_bytes, chosen=chosen).weights


def position_draws(seed: int, positions: Tensor, length: int) -> Tensor:
    """`random`'s draws: (B, T) float32 uniform in [0, 1), each a function of the run's seed, its row's position in the
    data order (`positions` (B,) int64: the blocks trained before that row, over all ranks) and its token's index
    alone, so the same on any number of processes, micro-batch size, resume or device: a counter-based generator
    (a hash of the three, as Philox hashes its counter). 24 bits each, exact in float32; ties fall to the earlier
    token (`select_top_k`).

    The hash is murmur3's 32-bit finaliser on int64 tensors, each 32-bit product split in two 16-bit halves so that
    nothing overflows int64."""
    key = hashlib.sha256(str(seed).encode()).digest()
    salt = [int.from_bytes(key[i : i + 4], "little") for i in (0, 4)]
    count = positions.long()[:, None] * length + torch.arange(length, device=positions.device)  # (B, T)
    mixed = _fmix32((count & MASK32) ^ salt[0])
    mixed = _fmix32(mixed ^ (count >> 32) ^ salt[1])
    return (mixed >> 8).float() / (1 << 24)


MASK32 = 0xFFFFFFFF


def _mul32(x: Tensor, c: int) -> Tensor:
    """x * c mod 2**32 for x in [0, 2**32) (int64), without an int64 overflow: partial products stay below 2**49."""
    low, high = x * (c & 0xFFFF), ((x * (c >> 16)) & 0xFFFF) << 16
    return (low + high) & MASK32


def _fmix32(x: Tensor) -> Tensor:
    """murmur3's finaliser: a bijection of [0, 2**32) whose every output bit depends on every input bit."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


@torch.no_grad()
def random_selection(
    valid: Tensor,
    mapped: Tensor,
    top_k: float,
    unmapped: Unmapped,
    draws: Tensor,
    *,
    scope: Scope = "batch",
    chosen: Tensor | None = None,
) -> Selection:
    """The control: as many valid mapped tokens as `teacher_guided_weights` selects, the top-k by `draws` (B, T)
    (`position_draws`): uniformly. valid, mapped (B, T) bool; `chosen`: the step's verdict under scope "global"
    (`select`)."""
    weights, candidate, selected = select(
        draws, valid, mapped, top_k=top_k, unmapped=unmapped, scope=scope, chosen=chosen
    )
    return Selection(weights, candidate, selected, None, None)


@torch.no_grad()
def selection_metrics(selection: Selection, n_valid: Tensor, num_teachers: int = 1) -> dict[str, Tensor]:
    """Shares of mapped and selected tokens, and (with a teacher) the mean reference and excess losses of the selected
    and unselected candidates and, with several teachers, each one's share of the selected tokens where it has the
    lowest aggregated loss (`reference_share_k`): scalars on the device, no host sync. A figure over no token (a share
    of no mapped token, a mean over no selected one) is NaN: nothing, which the step's mean leaves out
    (`distributed.mean_over_ranks`), not a 0 that would drag it down."""
    candidate, selected = selection.mapped, selection.selected
    n_candidate, n_selected = candidate.sum(), selected.sum()
    metrics = {"mapped_fraction": n_candidate / n_valid, "selected_fraction": n_selected / n_candidate}
    if selection.excess is not None:
        unselected = candidate & ~selected
        excess = selection.excess
        metrics["teacher_loss"] = torch.where(candidate, selection.reference, 0.0).sum() / n_candidate
        metrics["excess_selected"] = torch.where(selected, excess, 0.0).sum() / n_selected
        metrics["excess_unselected"] = torch.where(unselected, excess, 0.0).sum() / unselected.sum()
    if selection.best is not None and num_teachers > 1:
        for k in range(num_teachers):
            metrics[f"reference_share_{k}"] = (selected & (selection.best == k)).sum() / n_selected
    return metrics


def bits_per_byte(total_nats: float, total_bytes: int) -> float:
    """Bits per UTF-8 byte of text from the summed negative log-likelihood (nats) of the tokens that encode it:
    comparable across tokenizers."""
    if total_bytes <= 0:
        raise ValueError(f"bits per byte needs a positive number of bytes, got {total_bytes}")
    return total_nats / (math.log(2) * total_bytes)
