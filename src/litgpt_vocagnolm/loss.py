"""Teacher Guided Loss (Shin et al., ICML 2025, §3.2 of DESIGN.md) and the paper's baselines.

Pure functions: tensors in, tensors out. Nothing here knows about Fabric or process groups; the one cross-rank
quantity (`scope="global"`) arrives as an `all_gather` callable, as torchtitan passes `global_valid_tokens`.

`guided_loss` returns a weighted loss SUM and a weight SUM. The recipe adds both up over the micro-batches and ranks of
one optimizer step and divides once, so every trained token weighs the same:

    loss = sum(w * ls) / max(sum(w), 1)

Selection runs under `no_grad`: weights carry no gradient, only the student's per-token loss does.
"""

import math
from dataclasses import dataclass
from typing import Callable, Literal, NamedTuple, Sequence, get_args

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

Method = Literal["vocagnolm", "ce", "rho1", "kld", "uld", "chunk", "random"]
Aggregation = Literal["max", "mean"]
Unmapped = Literal["include", "exclude"]
Scope = Literal["batch", "sequence", "global"]
Teachers = Literal["min", "mean"]
AllGather = Callable[[Tensor], Tensor]
IGNORE_INDEX = -100  # a target with nothing to predict (padding), as in F.cross_entropy


@dataclass
class GuidanceArgs:
    """How the teacher guides the student (`--guidance.*`)."""

    method: Method = "vocagnolm"
    """vocagnolm: train the top-k mapped tokens by excess loss (student minus aligned teacher loss);
    ce: naive continual pretraining; rho1: vocagnolm for a same-vocabulary teacher, token i paired with token i;
    kld: CE + forward KL to the teacher's distribution over the student's vocabulary; rho1 and kld need a teacher
    that has every student token with the same id (the same tokenizer, or an extension such as Llemma's of
    TinyLlama's); uld: CE + Universal Logit Distillation
    (sorted-probability L1, any vocabulary); chunk: vocagnolm through chunk-level alignment ranges;
    random: as many mapped tokens as vocagnolm trains, drawn uniformly (the control)"""
    top_k: float = 0.4
    """Fraction of the mapped tokens trained, in (0, 1]: ceil(top_k * mapped) per scope (paper: 0.4)"""
    aggregation: Aggregation = "max"
    """How the losses of the teacher tokens mapped to one student token are combined (paper: max)"""
    unmapped: Unmapped = "include"
    """Whether student tokens with no teacher token (special tokens) are trained (paper: include)"""
    scope: Scope = "batch"
    """Where the top-k is ranked: the micro-batch, each sequence, or the micro-batches of all data-parallel ranks"""
    temperature: float = 1.0
    """kld: softmax temperature of both distributions; the KL term is scaled by temperature**2"""
    distill_weight: float = 1.0
    """kld, uld: weight of the distillation term added to each token's cross-entropy"""
    num_chunks: int = 8
    """chunk: number of chunks of equal token count both sequences are cut into (chunk alignment)"""
    teachers: Teachers = "min"
    """With several teachers (vocagnolm, chunk, random, rho1): how each student token's aggregated teacher losses
    become its reference, before the excess loss and the top-k. min: the teacher best at that token sets it; mean:
    the mean of the teachers that map it. A token is mapped if any teacher maps it."""

    def __post_init__(self) -> None:
        kinds = {"method": Method, "aggregation": Aggregation, "unmapped": Unmapped, "scope": Scope, "teachers": Teachers}
        for name, kind in kinds.items():
            if getattr(self, name) not in get_args(kind):
                raise ValueError(f"guidance.{name} must be one of {get_args(kind)}, got {getattr(self, name)!r}")
        if not 0 < self.top_k <= 1:
            raise ValueError(f"guidance.top_k must be in (0, 1] (the paper uses 0.4), got {self.top_k}")
        if not self.temperature > 0:
            raise ValueError(f"guidance.temperature must be > 0 (1.0: the plain softmax), got {self.temperature}")
        if not (math.isfinite(self.distill_weight) and self.distill_weight >= 0):
            raise ValueError(f"guidance.distill_weight must be finite and >= 0, got {self.distill_weight}")
        if self.num_chunks < 1:
            raise ValueError(f"guidance.num_chunks must be >= 1, got {self.num_chunks}")

    @property
    def needs_teacher_loss(self) -> bool:
        """The teacher's per-token loss (B, M) is needed: the teacher runs forward on every batch."""
        return self.method in ("vocagnolm", "rho1", "chunk")

    @property
    def needs_teacher_logits(self) -> bool:
        """The teacher's full logits are needed (distillation baselines)."""
        return self.method in ("kld", "uld")

    @property
    def same_vocab_only(self) -> bool:
        """The method compares student and teacher token by token over one vocabulary."""
        return self.method in ("rho1", "kld")

    def check_tokenizers(self, same_vocabulary: bool) -> None:
        """Refuses a same-vocabulary method unless every student token has the same id in the teacher's vocabulary."""
        if self.same_vocab_only and not same_vocabulary:
            raise ValueError(
                f"guidance.method={self.method!r} needs a teacher with the student's vocabulary (every student token"
                " with the same id in the teacher's; more teacher tokens are fine, as Llemma's 32,016 hold"
                " TinyLlama's 32,000), but these tokenizers differ. Use --guidance.method vocagnolm (or uld) for a"
                " teacher with another vocabulary. With --teacher.cache alone the relation is the one `vocagnolm"
                " prepare` recorded: pass --teacher.checkpoint_dir to derive it from the teacher's tokenizer."
            )


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Per-row cross-entropy in float32, `chunk_size` rows at a time; backward recomputes each chunk's softmax.

    Autograd keeps only the logits (which exist anyway) and the targets: at B=1, T=2048, V=32000 the float32
    log-probabilities that `F.cross_entropy` would keep for a bf16 input are 262 MB more.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, ignore: Tensor, chunk_size: int) -> Tensor:
        # logits (N, V), targets (N,) in [0, V), ignore (N,) bool
        loss = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        for start in range(0, logits.shape[0], chunk_size):
            rows = slice(start, start + chunk_size)
            log_probs = torch.log_softmax(logits[rows].float(), dim=-1)  # (chunk, V), freed each iteration
            loss[rows] = -log_probs.gather(1, targets[rows, None]).squeeze(1)
        ctx.save_for_backward(logits, targets, ignore)
        ctx.chunk_size = chunk_size
        return loss.masked_fill_(ignore, 0.0)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None, None]:
        logits, targets, ignore = ctx.saved_tensors
        grad = grad.float().masked_fill(ignore, 0.0)[:, None]  # (N, 1)
        grad_logits = torch.empty_like(logits)
        for start in range(0, logits.shape[0], ctx.chunk_size):
            rows = slice(start, start + ctx.chunk_size)
            # d CE / d logits = softmax - one_hot(target)
            chunk = torch.softmax(logits[rows].float(), dim=-1).mul_(grad[rows])
            chunk.scatter_add_(1, targets[rows, None], -grad[rows])
            grad_logits[rows] = chunk
        return grad_logits, None, None, None


def per_token_cross_entropy(
    logits: Tensor, targets: Tensor, ignore_index: int = -100, chunk_size: int = 128
) -> Tensor:
    """Cross-entropy of each target token.

    Like `litgpt.utils.chunked_cross_entropy`, computed `chunk_size` rows at a time, but unreduced and always in
    float32 whatever the logits' dtype, without ever holding a float32 copy of all logits (not even for backward).

    Args:
        logits: (B, T, V), any float dtype; pass contiguous logits (a slice such as `logits[:, :-1]` is copied whole).
        targets: (B, T) token ids, `ignore_index` where there is nothing to predict (padding).
        ignore_index: target value whose loss is 0.
        chunk_size: rows of (V,) logits upcast at once.

    Returns: (B, T) float32, 0 where `targets == ignore_index`.
    """
    if logits.dim() != 3 or logits.shape[:2] != targets.shape:
        raise ValueError(f"logits must be (B, T, V), targets (B, T); got {tuple(logits.shape)}, {tuple(targets.shape)}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    ignore = targets == ignore_index
    flat_targets = targets.masked_fill(ignore, 0).reshape(-1)
    flat_logits = logits.reshape(-1, logits.shape[-1])  # (B * T, V): a view of contiguous logits; a sliced input is copied
    loss = _ChunkedCrossEntropy.apply(flat_logits, flat_targets, ignore.reshape(-1), chunk_size)
    return loss.view(targets.shape)


TILE_ELEMENTS = 1 << 26  # logits computed at once by `linear_cross_entropy`: ~0.7 GB of transients at float32


class _LinearCrossEntropy(torch.autograd.Function):
    """Per-row cross-entropy of `hidden @ weight.T`, `tile_rows` rows of logits at a time, forward and backward.

    Forward keeps only the inputs and one log-sum-exp per row; backward recomputes each tile's logits (one more
    matrix product of the head) and turns them into gradients in place. Under autocast the products run in the autocast
    dtype, as `F.linear` would run them; the log-sum-exp and the softmax are float32.
    """

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, targets: Tensor, tile_rows: int) -> Tensor:
        # hidden (N, D), weight (V, D), targets (N,) in [0, V) or IGNORE_INDEX
        device = hidden.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
        ignore = targets == IGNORE_INDEX
        targets = targets.masked_fill(ignore, 0)
        with torch.autocast(device, enabled=False):
            w = weight.to(dtype)  # a copy only under autocast, as F.linear makes one
            lse = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)  # (N,)
            target_logit = torch.empty_like(lse)  # (N,)
            for start in range(0, hidden.shape[0], tile_rows):
                rows = slice(start, start + tile_rows)
                logits = (hidden[rows].to(dtype) @ w.T).float()  # (tile, V), freed each iteration
                target_logit[rows] = logits.gather(1, targets[rows, None]).squeeze(1)
                # log-sum-exp in place: torch.logsumexp would allocate another (tile, V) float32 tensor
                top = logits.amax(dim=-1, keepdim=True)  # (tile, 1)
                lse[rows] = logits.sub_(top).exp_().sum(dim=-1).log_().add_(top.squeeze(1))
        ctx.save_for_backward(hidden, weight, targets, ignore, lse)
        ctx.dtype, ctx.tile_rows = dtype, tile_rows
        return (lse - target_logit).masked_fill_(ignore, 0.0)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None, None]:
        hidden, weight, targets, ignore, lse = ctx.saved_tensors
        dtype, tile_rows = ctx.dtype, ctx.tile_rows
        grad = grad.float().masked_fill(ignore, 0.0)  # (N,)
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = None  # (V, D) in the weight's dtype: float32 under mixed precision, summed over the tiles
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(dtype)
            for start in range(0, hidden.shape[0], tile_rows):
                rows = slice(start, start + tile_rows)
                h = hidden[rows].to(dtype)  # (tile, D)
                # d CE / d logits = softmax - one_hot(target), scaled by each row's upstream gradient
                g = (h @ w.T).float().sub_(lse[rows, None]).exp_()  # (tile, V) softmax
                g.scatter_add_(1, targets[rows, None], torch.full_like(lse[rows, None], -1.0))
                g = g.mul_(grad[rows, None]).to(dtype)
                if ctx.needs_input_grad[0]:
                    grad_hidden[rows] = g @ w
                if ctx.needs_input_grad[1]:
                    if grad_weight is None:  # the first tile's product becomes the sum: no zero-filled buffer
                        grad_weight = (g.T @ h).to(weight.dtype)
                    elif grad_weight.dtype == dtype:
                        grad_weight.addmm_(g.T, h)
                    else:  # a float32 sum of bf16 products, cast inside the kernel: no (V, D) float32 copy
                        grad_weight.add_(g.T @ h)
        return grad_hidden, grad_weight, None, None


def linear_cross_entropy(
    hidden: Tensor, weight: Tensor, targets: Tensor, tile_rows: int | None = None
) -> Tensor:
    """Cross-entropy of each target under the logits `hidden @ weight.T`, never holding all the logits.

    A language model's head and its loss in one: the (B, T, V) logits, and their float32 copy, never exist whole,
    forward or backward; at most `tile_rows` rows of them do (by default ~2**26 logits, 441 rows of a 152k vocabulary,
    2,097 of a 32k one). Gradients flow to `hidden` and `weight`. No host sync.

    Both maintained fused kernels were considered: cut-cross-entropy's per-token mode calls `nonzero()` on every call
    (a host sync per micro-batch), and Liger's `.item()`s the target count and, unreduced, recomputes the forward in
    backward as this does; neither fits a step that must not stop the GPU.

    Args:
        hidden: (B, T, D) the model's final hidden states (after the last norm).
        weight: (V, D) the head; no bias.
        targets: (B, T) token ids in [0, V), or -100 where there is nothing to predict.
        tile_rows: rows of logits computed at once.

    Returns: (B, T) float32, 0 where `targets == -100`.
    """
    if hidden.shape[:-1] != targets.shape or weight.dim() != 2 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"hidden must be (B, T, D), weight (V, D), targets (B, T); got {tuple(hidden.shape)}, "
            f"{tuple(weight.shape)}, {tuple(targets.shape)}"
        )
    tile_rows = tile_rows or max(1, TILE_ELEMENTS // weight.shape[0])
    flat = hidden.reshape(-1, hidden.shape[-1])  # (B * T, D)
    return _LinearCrossEntropy.apply(flat, weight, targets.reshape(-1), tile_rows).view(targets.shape)


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


def per_teacher(values: Tensor | Sequence[Tensor]) -> list[Tensor]:
    """One tensor per teacher: a bare tensor is the one teacher's."""
    return [values] if isinstance(values, Tensor) else list(values)


def one_or_several(values: Tensor | Sequence[Tensor] | None) -> Tensor | list[Tensor] | None:
    """A tensor for one teacher (a list of one included), a list for several, None for none."""
    if values is None:
        return None
    values = per_teacher(values)
    return values[0] if len(values) == 1 else values


@torch.no_grad()
def teacher_reference(
    lt: Tensor | Sequence[Tensor],
    ranges: Tensor | Sequence[Tensor],
    aggregation: Aggregation = "max",
    teachers: Teachers = "min",
) -> tuple[Tensor, Tensor, Tensor]:
    """Each student token's reference loss, from one teacher or several (DESIGN.md §3.2, step 1).

    Each teacher's losses are aggregated over the token's range in that teacher's own window (`aggregate_teacher_loss`);
    then `min` takes the lowest aggregate among the teachers that map the token (the teacher best at it sets the
    reference), `mean` their mean. A token is mapped if any teacher maps it. With one teacher: its aggregate, exactly.

    Args:
        lt: (B, M_k) teacher per-token loss for each teacher k (NaN where unavailable), or one (B, M) tensor; the
            teachers' windows may differ in length.
        ranges: (B, T, 2) for each teacher, into its window (a == e: unmapped), or one tensor.
        aggregation: "max" or "mean" over a range.
        teachers: "min" or "mean" across teachers.

    Returns: `reference` (B, T) float32, 0 where unmapped; `mapped` (B, T) bool; `best` (B, T) long, the teacher with
        the lowest aggregate on the token (the first of equals), -1 where unmapped.
    """
    lts, rangess = per_teacher(lt), per_teacher(ranges)
    if not lts or len(lts) != len(rangess):
        raise ValueError(f"one ranges tensor per teacher loss: got {len(lts)} losses and {len(rangess)} ranges")
    if teachers not in get_args(Teachers):
        raise ValueError(f"teachers must be one of {get_args(Teachers)}, got {teachers!r}")
    aggregates, maps = zip(*(aggregate_teacher_loss(loss, r, aggregation) for loss, r in zip(lts, rangess)))
    each, mapped_by = torch.stack(aggregates), torch.stack(maps)  # (K, B, T) each
    mapped = mapped_by.any(0)  # (B, T)
    lowest, best = torch.where(mapped_by, each, math.inf).min(0)  # (B, T) each
    if teachers == "min":
        reference = lowest
    else:
        reference = torch.where(mapped_by, each, 0.0).sum(0) / mapped_by.sum(0).clamp(min=1)
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

    Ties go to the earlier token: by (b, t) in a batch, t in a sequence, (rank, b, t) across ranks.

    Args:
        scores: (B, T) float.
        candidate: (B, T) bool: tokens that may be selected.
        top_k: fraction in [0, 1].
        scope: "batch" (the whole tensor), "sequence" (each row) or "global" (every rank's tensor).
        all_gather: for "global": stacks a tensor from every data-parallel rank along a new leading dim
            (`fabric.all_gather`; with one process it may return its input unchanged). All ranks need equal shapes.
        rank: this process's index in the `all_gather` result (`fabric.global_rank`).

    Returns: (B, T) bool.
    """
    if not 0 <= top_k <= 1:
        raise ValueError(f"top_k must be in [0, 1], got {top_k}")
    if scope == "sequence":
        return _top_k_rows(scores, candidate, top_k)
    if scope == "batch":
        return _top_k_rows(scores.reshape(1, -1), candidate.reshape(1, -1), top_k).view_as(candidate)
    if scope != "global":
        raise ValueError(f"scope must be one of {get_args(Scope)}, got {scope!r}")
    if all_gather is None:
        raise ValueError("scope='global' needs all_gather (e.g. fabric.all_gather) and this process's rank")
    local = torch.stack([scores.float(), candidate.float()])  # (2, B, T): one collective instead of two
    gathered = all_gather(local)
    if gathered.dim() == local.dim():  # one process: fabric.all_gather adds no leading dim
        gathered = gathered[None]
    if gathered.shape[1:] != local.shape or not 0 <= rank < gathered.shape[0]:
        raise ValueError(
            f"all_gather gave {tuple(gathered.shape)} for local {tuple(local.shape)} at rank {rank}: every rank"
            " needs micro-batches of the same shape, and rank must index the gathered dim"
        )
    world = gathered.shape[0]
    selected = _top_k_rows(gathered[:, 0].reshape(1, -1), gathered[:, 1].reshape(1, -1).bool(), top_k)
    return selected.view(world, *scores.shape)[rank]


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
    all_gather: AllGather | None = None,
    rank: int = 0,
) -> tuple[Tensor, Tensor, Tensor]:
    """The top-k of the valid mapped tokens by `scores`, and the weights that follow (DESIGN.md §3.2, steps 3-4).

    scores (B, T) float; valid, mapped (B, T) bool. Returns (weights (B, T) float32, candidates, selected) where
    candidates = valid & mapped.
    """
    if unmapped not in get_args(Unmapped):
        raise ValueError(f"unmapped must be one of {get_args(Unmapped)}, got {unmapped!r}")
    candidate = valid & mapped
    selected = select_top_k(scores, candidate, top_k, scope=scope, all_gather=all_gather, rank=rank)
    keep = selected | (valid & ~mapped) if unmapped == "include" else selected
    return keep.float(), candidate, selected


@torch.no_grad()
def teacher_guided_selection(
    ls: Tensor,
    lt: Tensor | Sequence[Tensor],
    ranges: Tensor | Sequence[Tensor],
    valid: Tensor,
    *,
    top_k: float = 0.4,
    aggregation: Aggregation = "max",
    unmapped: Unmapped = "include",
    scope: Scope = "batch",
    all_gather: AllGather | None = None,
    rank: int = 0,
    teachers: Teachers = "min",
) -> Selection:
    """`teacher_guided_weights` with what it computed on the way (for metrics); same arguments."""
    reference, mapped, best = teacher_reference(lt, ranges, aggregation, teachers)
    excess = ls.float() - reference
    weights, candidate, selected = select(excess, valid, mapped, top_k=top_k, unmapped=unmapped, scope=scope,
                                          all_gather=all_gather, rank=rank)  # fmt: skip
    return Selection(weights, candidate, selected, reference, excess, best)


def teacher_guided_weights(
    ls: Tensor,
    lt: Tensor | Sequence[Tensor],
    ranges: Tensor | Sequence[Tensor],
    valid: Tensor,
    *,
    top_k: float = 0.4,
    aggregation: Aggregation = "max",
    unmapped: Unmapped = "include",
    scope: Scope = "batch",
    all_gather: AllGather | None = None,
    rank: int = 0,
    teachers: Teachers = "min",
) -> Tensor:
    """VocAgnoLM's token weights: the top-k valid mapped tokens by excess loss `ls - agg(lt[range])`.

    Args:
        ls: (B, T) student per-token loss (its gradient is not used).
        lt: (B, M) teacher per-token loss, NaN where unavailable; with several teachers, one (B, M_k) per teacher.
        ranges: (B, T, 2) teacher tokens [a, e) of each student token, a == e unmapped; with several teachers, one
            per teacher, into its own window.
        valid: (B, T) bool, False for padding.
        top_k: fraction of the valid mapped tokens selected: exactly ceil(top_k * n_mapped) per scope.
        aggregation: "max" or "mean" of the teacher losses in a range.
        unmapped: "include" trains valid unmapped tokens (weight 1), "exclude" does not.
        scope: where the top-k is ranked; see `select_top_k` (with `all_gather` and `rank` for "global").
        teachers: several teachers: "min" or "mean" of their aggregated losses is the reference (`teacher_reference`).

    Returns: (B, T) float32 weights in {0, 1}, no gradient.
    """
    return teacher_guided_selection(ls, lt, ranges, valid, top_k=top_k, aggregation=aggregation, unmapped=unmapped,
                                    scope=scope, all_gather=all_gather, rank=rank, teachers=teachers).weights  # fmt: skip


def selection_generator(seed: int, rank: int, iter_num: int, device: torch.device) -> torch.Generator:
    """`random`'s generator for one micro-batch, seeded by (seed, rank, iteration): each rank draws its own scores,
    and a resumed run draws the same ones again without saving any state."""
    state = np.random.SeedSequence([seed, rank, iter_num]).generate_state(1, np.uint64)[0]  # the three, hashed
    return torch.Generator(device=device).manual_seed(int(state))


@torch.no_grad()
def random_selection(
    valid: Tensor,
    mapped: Tensor,
    top_k: float,
    unmapped: Unmapped,
    generator: torch.Generator | None = None,
    *,
    scope: Scope = "batch",
    all_gather: AllGather | None = None,
    rank: int = 0,
) -> Selection:
    """The control: as many valid mapped tokens as `teacher_guided_weights` selects, drawn uniformly.

    valid, mapped (B, T) bool; `generator` on their device. With scope="global" every rank draws its own scores
    and the gathered scores decide, so the global count is exact as well.
    """
    scores = torch.rand(valid.shape, generator=generator, device=valid.device)
    weights, candidate, selected = select(scores, valid, mapped, top_k=top_k, unmapped=unmapped, scope=scope,
                                          all_gather=all_gather, rank=rank)  # fmt: skip
    return Selection(weights, candidate, selected, None, None)


def paired_teacher_positions(ranges: Tensor) -> Tensor:
    """The teacher position whose prediction meets each student target, for logit distillation across tokenizers.

    The teacher's prediction of the first teacher token of a target's range (made at the position before it) and the
    student's prediction of the target both continue the same characters. ranges (B, T, 2) -> (B, T) long, -1 where
    unpaired (unmapped, or the range starts the teacher window).
    """
    start, end = ranges.unbind(-1)  # (B, T) each
    return torch.where((end > start) & (start > 0), start - 1, -1)


def kld_loss(
    student_logits: Tensor,
    teacher_logits: Tensor,
    valid: Tensor,
    vocab_size: int,
    temperature: float = 1.0,
    chunk_size: int = 128,
) -> Tensor:
    """Forward KL(teacher || student) of each position's next-token distributions over the student's vocabulary.

    Every student token has the same id in the teacher's vocabulary (ids [0, vocab_size)); the teacher's other columns
    (tokens the student lacks, such as Llemma's 16 infill tokens after TinyLlama's 32,000, and padding rows) are
    dropped and its distribution renormalised over the student's tokens. The student's distribution is its softmax
    over all its rows, as its cross-entropy sees it, so mass on its padding rows (which the teacher gives 0) counts.
    Both are softened by `temperature` and the result scaled by temperature**2 (Hinton et al., 2015), so the
    gradient's size does not change with the temperature. Computed in float32, `chunk_size` rows at a time; autograd
    keeps the student's float32 log-probabilities (B * T * Vs * 4 bytes), a cost only this baseline pays.

    Args:
        student_logits: (B, T, Vs), Vs >= vocab_size.
        teacher_logits: (B, T, Vt), Vt >= vocab_size; no gradient flows into it.
        valid: (B, T) bool.
        vocab_size: the student tokenizer's vocabulary size (with added tokens).

    Returns: (B, T) float32, 0 where not valid.
    """
    (B, T, Vs), Vt = student_logits.shape, teacher_logits.shape[-1]
    if teacher_logits.shape[:2] != (B, T) or valid.shape != (B, T) or not 0 < vocab_size <= min(Vs, Vt):
        raise ValueError(
            f"kld needs student logits (B, T, Vs), teacher logits (B, T, Vt) and valid (B, T) with vocab_size <="
            f" min(Vs, Vt), got {tuple(student_logits.shape)}, {tuple(teacher_logits.shape)}, {tuple(valid.shape)},"
            f" vocab_size {vocab_size}: the teacher's vocabulary must hold the student's"
        )
    student = student_logits.reshape(B * T, Vs)
    teacher = teacher_logits.detach().reshape(B * T, Vt)
    chunks = []
    for start in range(0, B * T, chunk_size):
        rows = slice(start, start + chunk_size)
        log_q = torch.log_softmax(student[rows].float() / temperature, dim=-1)[:, :vocab_size]
        log_p = torch.log_softmax(teacher[rows, :vocab_size].float() / temperature, dim=-1)
        chunks.append(F.kl_div(log_q, log_p, reduction="none", log_target=True).sum(-1))
    kl = torch.cat(chunks).view(B, T) * temperature**2
    return torch.where(valid, kl, 0.0)


def uld_loss(
    student_logits: Tensor, teacher_logits: Tensor, pair_index: Tensor, valid: Tensor, chunk_size: int = 128
) -> Tensor:
    """Universal Logit Distillation (Boizard et al., 2024): L1 distance between sorted probability vectors.

    Both probability vectors are sorted in decreasing order and the shorter is zero-padded to the larger vocabulary.
    Only the top `min(Vs, Vt)` entries are sorted (`topk`); the larger vocabulary's tail enters as its summed mass.
    Student position i is paired with teacher position `pair_index[b, i]`, taken from the alignment (e.g. the last
    teacher token of i's range), never by index. Sorting a 152k teacher vocabulary per token is this baseline's cost.

    Args:
        student_logits: (B, T, Vs).
        teacher_logits: (B, M, Vt), no gradient flows into it.
        pair_index: (B, T) long into the teacher positions of the row, -1 = unpaired.
        valid: (B, T) bool.

    Returns: (B, T) float32, 0 where not valid or unpaired.
    """
    (B, T, Vs), (Bt, M, Vt) = student_logits.shape, teacher_logits.shape
    if B != Bt or pair_index.shape != (B, T) or valid.shape != (B, T):
        raise ValueError(
            f"uld needs student logits (B, T, Vs), teacher logits (B, M, Vt), pair_index and valid (B, T), got"
            f" {tuple(student_logits.shape)}, {tuple(teacher_logits.shape)}, {tuple(pair_index.shape)},"
            f" {tuple(valid.shape)}"
        )
    paired = valid & (pair_index >= 0)
    torch._assert_async((pair_index < M).all(), f"pair_index must be < M={M} (or -1: unpaired)")
    student = student_logits.reshape(B * T, Vs)
    teacher = teacher_logits.detach().reshape(B * M, Vt)
    teacher_row = (pair_index.clamp(min=0) + torch.arange(B, device=pair_index.device)[:, None] * M).reshape(-1)
    width = min(Vs, Vt)
    chunks = []
    for start in range(0, B * T, chunk_size):
        rows = slice(start, start + chunk_size)
        q = torch.softmax(student[rows].float(), dim=-1)
        with torch.no_grad():
            p = torch.softmax(teacher[teacher_row[rows]].float(), dim=-1)
            p_top = p.topk(width, dim=-1, sorted=True).values
        q_top = q.topk(width, dim=-1, sorted=True).values
        distance = (q_top - p_top).abs().sum(-1)
        # The zero-padded entries of the smaller vocabulary meet the larger one's tail: |0 - x| = x.
        if Vs > width:
            distance = distance + (1.0 - q_top.sum(-1)).clamp(min=0)
        elif Vt > width:
            distance = distance + (1.0 - p_top.sum(-1)).clamp(min=0)
        chunks.append(distance)
    return torch.where(paired, torch.cat(chunks).view(B, T), 0.0)


def guided_loss(
    args: GuidanceArgs,
    ls: Tensor,
    valid: Tensor,
    *,
    teacher_loss: Tensor | list[Tensor] | None = None,
    ranges: Tensor | list[Tensor] | None = None,
    logits: Tensor | None = None,
    teacher_logits: Tensor | None = None,
    all_gather: AllGather | None = None,
    rank: int = 0,
    generator: torch.Generator | None = None,
    vocab_size: int | None = None,
) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """One micro-batch's loss for `args.method`: (weighted loss SUM, weight SUM, metrics).

    Divide the summed losses by the summed weights of all micro-batches and ranks of an optimizer step, once.
    kld and uld add `distill_weight * distillation` to each valid token's cross-entropy with the same weight 1, so
    their loss is mean CE + distill_weight * distillation summed over valid tokens / valid tokens (unpaired tokens add
    0 to the sum, 1 to the count).

    Args:
        args: the method and its options.
        ls: (B, T) float32 student per-token cross-entropy, with its gradient; 0 where not valid.
        valid: (B, T) bool, False where there is no target (padding).
        teacher_loss: (B, M) teacher per-token loss, NaN = unavailable; vocagnolm, rho1, chunk; random (optional:
            without it a token is mapped when its range is non-empty). A list: one (B, M_k) per teacher; several
            (not kld, uld) are combined by `args.teachers` (see `teacher_reference`).
        ranges: (B, T, 2) teacher tokens [a, e) of each student token; vocagnolm, chunk (chunk-alignment ranges),
            random, kld and uld (pairing); rho1 defaults to 1:1 (token i -> [i, i + 1)). Several teachers: a list, one
            per teacher, as `teacher_loss`.
        logits: kld, uld: (B, T, V) student logits, with their gradient.
        teacher_logits: kld, uld: (B, M, Vt) teacher logits over its window.
        all_gather, rank: scope="global" (see `select_top_k`).
        generator: random's generator, on `ls`'s device.
        vocab_size: kld: the student tokenizer's vocabulary size; ids below it are compared (see `kld_loss`).

    Returns: loss_sum (float32 scalar, with gradient), weight_sum (float32 scalar, no gradient), metrics (detached
        float32 scalars, no host sync): student_loss (mean CE over valid tokens), trained_fraction (weight sum /
        valid), and for the selecting methods mapped_fraction (of valid), selected_fraction (of valid mapped), plus,
        with a teacher loss, teacher_loss (mean over valid mapped), excess_selected and excess_unselected (mean excess
        of valid mapped tokens) and, with several teachers, reference_share_k for each teacher k (the share of the
        selected tokens where teacher k has the lowest aggregated loss: under `min`, where it set the reference);
        for kld/uld distill_loss.
    """
    method = args.method
    teacher_loss, ranges = one_or_several(teacher_loss), one_or_several(ranges)
    num_teachers = max(len(x) if isinstance(x, list) else 1 for x in (teacher_loss, ranges))
    several = num_teachers > 1
    if several and method not in ("vocagnolm", "rho1", "chunk", "random"):
        raise ValueError(f"guidance.method={method!r} takes one teacher; several guide vocagnolm, rho1, chunk, random")
    if method in ("vocagnolm", "rho1", "chunk") and teacher_loss is None:
        raise ValueError(f"guidance.method={method!r} needs teacher_loss (B, M)")
    if method in ("vocagnolm", "chunk", "random", "kld", "uld") and ranges is None:
        raise ValueError(f"guidance.method={method!r} needs ranges (B, T, 2) from the alignment")
    if method in ("kld", "uld") and (logits is None or teacher_logits is None):
        raise ValueError(f"guidance.method={method!r} needs the student's logits and the teacher's")
    if method == "kld" and vocab_size is None:
        raise ValueError("guidance.method='kld' needs vocab_size, the student tokenizer's vocabulary size")
    if method == "rho1" and ranges is None:
        if several or teacher_loss.shape != ls.shape:
            raise ValueError(
                f"guidance.method='rho1' pairs token i with teacher token i: teacher_loss must be"
                f" {tuple(ls.shape)}, got {tuple(teacher_loss.shape)} (pass ranges, or use vocagnolm for"
                " different tokenizers)"
            )
        position = torch.arange(ls.shape[1], device=ls.device)
        ranges = torch.stack([position, position + 1], dim=-1).expand(*ls.shape, 2)

    n_valid = valid.sum().clamp(min=1)
    metrics = {"student_loss": ls.detach().sum() / n_valid}
    per_token = ls
    if method in ("ce", "kld", "uld"):
        weights = valid.float()
        if method != "ce":
            pair_index = paired_teacher_positions(ranges)
            if method == "kld":  # the paired teacher distribution, position by position, over the student's tokens
                index = pair_index.clamp(min=0)[..., None].expand(-1, -1, teacher_logits.shape[-1])
                paired = torch.gather(teacher_logits, 1, index)  # (B, T, Vt)
                distill = kld_loss(logits, paired, valid & (pair_index >= 0), vocab_size, args.temperature)
            else:
                distill = uld_loss(logits, teacher_logits, pair_index, valid)
            per_token = ls + args.distill_weight * distill
            metrics["distill_loss"] = distill.detach().sum() / n_valid
    else:
        selection = method_selection(args, ls.detach(), valid, teacher_loss, ranges, all_gather=all_gather, rank=rank,
                                     generator=generator)  # fmt: skip
        weights = selection.weights
        metrics.update(selection_metrics(selection, n_valid, num_teachers))

    weight_sum = weights.sum()
    metrics["trained_fraction"] = weight_sum / n_valid
    metrics = {name: value.detach().float() for name, value in metrics.items()}
    return (weights * per_token).sum(), weight_sum, metrics


@torch.no_grad()
def method_selection(
    args: GuidanceArgs,
    ls: Tensor,
    valid: Tensor,
    teacher_loss: Tensor | None,
    ranges: Tensor,
    *,
    all_gather: AllGather | None = None,
    rank: int = 0,
    generator: torch.Generator | None = None,
) -> Selection:
    """The tokens a selecting method (vocagnolm, rho1, chunk, random) trains; arguments as in `guided_loss`.

    random draws among the tokens with a teacher loss when `teacher_loss` is given (and reports the excess it would
    have ranked by), else among those with a non-empty range.
    """
    cross_rank = dict(scope=args.scope, all_gather=all_gather, rank=rank)
    if args.method != "random":
        return teacher_guided_selection(ls, teacher_loss, ranges, valid, top_k=args.top_k, aggregation=args.aggregation,
                                        unmapped=args.unmapped, teachers=args.teachers, **cross_rank)  # fmt: skip
    mapped = torch.stack([r[..., 1] > r[..., 0] for r in per_teacher(ranges)]).any(0)  # by any teacher
    reference, excess, best = None, None, None
    if teacher_loss is not None:  # what the teachers would have ranked by, for the metrics
        reference, mapped, best = teacher_reference(teacher_loss, ranges, args.aggregation, args.teachers)
        excess = ls.float() - reference
    selection = random_selection(valid, mapped, args.top_k, args.unmapped, generator, **cross_rank)
    return selection._replace(reference=reference, excess=excess, best=best)


@torch.no_grad()
def selection_metrics(selection: Selection, n_valid: Tensor, num_teachers: int = 1) -> dict[str, Tensor]:
    """Shares of mapped and selected tokens, and (with a teacher) the mean reference and excess losses of the selected
    and unselected candidates and, with several teachers, each one's share of the selected tokens where it has the
    lowest aggregated loss (`reference_share_k`): scalars on the device, no host sync."""
    candidate, selected = selection.mapped, selection.selected
    n_candidate, n_selected = candidate.sum(), selected.sum()
    metrics = {"mapped_fraction": n_candidate / n_valid, "selected_fraction": n_selected / n_candidate.clamp(min=1)}
    if selection.excess is not None:
        unselected = candidate & ~selected
        excess = selection.excess
        metrics["teacher_loss"] = torch.where(candidate, selection.reference, 0.0).sum() / n_candidate.clamp(min=1)
        metrics["excess_selected"] = torch.where(selected, excess, 0.0).sum() / n_selected.clamp(min=1)
        metrics["excess_unselected"] = torch.where(unselected, excess, 0.0).sum() / unselected.sum().clamp(min=1)
    if selection.best is not None and num_teachers > 1:
        for k in range(num_teachers):
            metrics[f"reference_share_{k}"] = (selected & (selection.best == k)).sum() / n_selected.clamp(min=1)
    return metrics


def bits_per_byte(total_nats: float, total_bytes: int) -> float:
    """Bits per UTF-8 byte of text from the summed negative log-likelihood (nats) of the tokens that encode it:
    comparable across tokenizers."""
    if total_bytes <= 0:
        raise ValueError(f"bits per byte needs a positive number of bytes, got {total_bytes}")
    return total_nats / (math.log(2) * total_bytes)
