"""The guidance methods, in one table: what each needs and its loss. Adding a method is one `GuidanceMethod` entry in
`METHODS`, its loss function and its test (README, "Adding a guidance method").

Everything else reads the table: `GuidanceArgs` (`--guidance.method` and its `--help`), the recipe's checks and its
teacher, `vocagnolm plan`, the demo. No other module lists method names.

A method's loss function takes the student's per-token loss and what the batch brought (`LossInputs`) and returns
each token's loss and weight (`MethodLoss`); `guided_loss` checks the inputs against the table, calls it, and returns
the weighted loss SUM and the weight SUM. The recipe adds both up over the micro-batches and ranks of one optimizer
step and divides once, so every trained token weighs the same (docs/design.md, "Teacher-guided loss"):

    loss = sum(w * ls) / max(sum(w), 1)
"""

import math
from dataclasses import dataclass
from typing import Callable, Literal, NamedTuple, get_args

import torch
from torch import Tensor

from litgpt_vocagnolm.distillation import kld_loss, paired_teacher_positions, uld_loss
from litgpt_vocagnolm.errors import InvalidArgument
from litgpt_vocagnolm.loss import (
    Aggregation,
    AllGather,
    Combine,
    Compare,
    Scope,
    Selection,
    TokenBytes,
    Unmapped,
    check_top_k,
    one_or_several,
    per_teacher,
    random_selection,
    selection_metrics,
    teacher_guided_selection,
    teacher_reference,
)


class LossInputs(NamedTuple):
    """What a batch brings besides the student's per-token loss; each method uses what its table entry says it needs.
    With several teachers, `teacher_loss` and `ranges` are lists, one per teacher."""

    teacher_loss: Tensor | list[Tensor] | None = None
    """(B, M) teacher per-token loss, NaN = unavailable."""
    ranges: Tensor | list[Tensor] | None = None
    """(B, T, 2) teacher tokens [a, e) of each student token, a == e unmapped."""
    logits: Tensor | None = None
    """(B, T, V) student logits, with their gradient (distillation)."""
    teacher_logits: Tensor | None = None
    """(B, M, Vt) teacher logits over its window (distillation)."""
    all_gather: AllGather | None = None
    """scope="global": stacks a tensor from every data-parallel rank (see `loss.select_top_k`)."""
    rank: int = 0
    """This process's index in the `all_gather` result."""
    generator: torch.Generator | None = None
    """Random draws, on the student loss's device."""
    vocab_size: int | None = None
    """The student tokenizer's vocabulary size: the ids a same-vocabulary comparison covers."""
    token_bytes: TokenBytes | None = None
    """`--guidance.compare byte`: the bytes each student and teacher token covers; None compares per token."""


class MethodLoss(NamedTuple):
    """A method's verdict on one micro-batch, all (B, T) but the metrics."""

    per_token: Tensor
    """float32, with gradient: the loss of each token (the student's cross-entropy, plus any distillation term)."""
    weights: Tensor
    """float32, no gradient: how much each token counts (0 where not valid)."""
    metrics: dict[str, Tensor]
    """Detached scalars on the device, no host sync."""


LossFunction = Callable[["GuidanceArgs", Tensor, Tensor, LossInputs], MethodLoss]


@dataclass(frozen=True)
class GuidanceMethod:
    """One guidance method: what it needs from the teacher and the data, and its loss."""

    name: str
    description: str
    """One line for `--help`."""
    loss: LossFunction
    """(args, ls (B, T), valid (B, T), inputs) -> MethodLoss."""
    teacher_loss: bool = False
    """Needs the teacher's per-token loss (the teacher runs on every batch, or its cache is read)."""
    teacher_logits: bool = False
    """Needs the teacher's full logits: the teacher runs online (a cache holds only losses)."""
    same_vocabulary: bool = False
    """Compares student and teacher token by token: every student token must have the same id in the teacher's."""
    alignment: Literal["token", "chunk"] | None = None
    """The alignment ranges it needs: token-level, chunk-level (`--guidance.num_chunks`), or none."""
    selects: bool = False
    """Trains a top-k share of the mapped tokens (uses top_k, aggregation, unmapped, scope)."""
    several_teachers: bool = False
    """Several teachers can guide it (`--data.other_teachers`), combined by `--guidance.combine`."""

    @property
    def needs_teacher(self) -> bool:
        """A teacher (or its cache) must be given."""
        return self.teacher_loss or self.teacher_logits

    @property
    def needs_prepared_data(self) -> bool:
        """Trains on `vocagnolm prepare`'s data (teacher windows, alignment), not on plain LitGPT data."""
        return self.needs_teacher or self.alignment is not None


def cross_entropy_only(args: "GuidanceArgs", ls: Tensor, valid: Tensor, inputs: LossInputs) -> MethodLoss:
    """Every valid token, weight 1: naive continual pretraining."""
    return MethodLoss(ls, valid.float(), {})


def top_k_by_excess(args: "GuidanceArgs", ls: Tensor, valid: Tensor, inputs: LossInputs) -> MethodLoss:
    """The top-k mapped tokens by excess loss over the teachers' reference (`loss.teacher_guided_selection`)."""
    selection = teacher_guided_selection(ls.detach(), inputs.teacher_loss, inputs.ranges, valid, top_k=args.top_k,
                                         aggregation=args.aggregation, unmapped=args.unmapped, scope=args.scope,
                                         all_gather=inputs.all_gather, rank=inputs.rank, combine=args.combine,
                                         token_bytes=inputs.token_bytes)  # fmt: skip
    return selection_loss(ls, valid, selection, inputs)


def paired_top_k_by_excess(args: "GuidanceArgs", ls: Tensor, valid: Tensor, inputs: LossInputs) -> MethodLoss:
    """`top_k_by_excess` with token i paired with teacher token i unless ranges are given (one vocabulary)."""
    if inputs.ranges is None:
        teacher_loss = inputs.teacher_loss
        if isinstance(teacher_loss, list) or teacher_loss.shape != ls.shape:
            shape = [tuple(t.shape) for t in teacher_loss] if isinstance(teacher_loss, list) else tuple(teacher_loss.shape)
            raise ValueError(
                f"guidance.method={args.method!r} pairs token i with teacher token i: teacher_loss must be"
                f" {tuple(ls.shape)}, got {shape} (pass ranges, or use vocagnolm for different tokenizers)"
            )
        position = torch.arange(ls.shape[1], device=ls.device)
        inputs = inputs._replace(ranges=torch.stack([position, position + 1], dim=-1).expand(*ls.shape, 2))
    return top_k_by_excess(args, ls, valid, inputs)


@torch.no_grad()
def random_tokens(args: "GuidanceArgs", ls: Tensor, valid: Tensor, inputs: LossInputs) -> MethodLoss:
    """As many mapped tokens as the top-k trains, drawn with `inputs.generator`: among the tokens with a teacher loss
    when one is given (reporting the excess it would have ranked by), else among those with a non-empty range."""
    ranges, teacher_loss = inputs.ranges, inputs.teacher_loss
    mapped = torch.stack([r[..., 1] > r[..., 0] for r in per_teacher(ranges)]).any(0)  # by any teacher
    reference, excess, best = None, None, None
    if teacher_loss is not None:  # what the teachers would have ranked by, for the metrics
        reference, mapped, best = teacher_reference(teacher_loss, ranges, args.aggregation, args.combine)
        excess = ls.float() - reference
    selection = random_selection(valid, mapped, args.top_k, args.unmapped, inputs.generator, scope=args.scope,
                                 all_gather=inputs.all_gather, rank=inputs.rank)  # fmt: skip
    return selection_loss(ls, valid, selection._replace(reference=reference, excess=excess, best=best), inputs)


def selection_loss(ls: Tensor, valid: Tensor, selection: Selection, inputs: LossInputs) -> MethodLoss:
    num_teachers = max(len(x) if isinstance(x, list) else 1 for x in (inputs.teacher_loss, inputs.ranges))
    metrics = selection_metrics(selection, valid.sum().clamp(min=1), num_teachers)
    return MethodLoss(ls, selection.weights, metrics)


def kld_distillation(args: "GuidanceArgs", ls: Tensor, valid: Tensor, inputs: LossInputs) -> MethodLoss:
    """Cross-entropy plus `distill_weight` x forward KL to the paired teacher distribution over the student's tokens."""
    if inputs.vocab_size is None:
        raise ValueError(f"guidance.method={args.method!r} needs vocab_size, the student tokenizer's vocabulary size")
    pair_index = paired_teacher_positions(inputs.ranges)
    teacher_logits = inputs.teacher_logits
    # The paired teacher distribution, position by position, over the student's tokens.
    index = pair_index.clamp(min=0)[..., None].expand(-1, -1, teacher_logits.shape[-1])
    paired = torch.gather(teacher_logits, 1, index)  # (B, T, Vt)
    distill = kld_loss(inputs.logits, paired, valid & (pair_index >= 0), inputs.vocab_size, args.temperature)
    return distillation_loss(args, ls, valid, distill)


def uld_distillation(args: "GuidanceArgs", ls: Tensor, valid: Tensor, inputs: LossInputs) -> MethodLoss:
    """Cross-entropy plus `distill_weight` x ULD (sorted-probability L1) to the paired teacher position."""
    distill = uld_loss(inputs.logits, inputs.teacher_logits, paired_teacher_positions(inputs.ranges), valid)
    return distillation_loss(args, ls, valid, distill)


def distillation_loss(args: "GuidanceArgs", ls: Tensor, valid: Tensor, distill: Tensor) -> MethodLoss:
    metrics = {"distill_loss": distill.detach().sum() / valid.sum().clamp(min=1)}
    return MethodLoss(ls + args.distill_weight * distill, valid.float(), metrics)


METHODS: dict[str, GuidanceMethod] = {
    method.name: method
    for method in (
        GuidanceMethod(
            "vocagnolm",
            "train the top-k mapped tokens by excess loss (student minus aligned teacher loss)",
            top_k_by_excess, teacher_loss=True, alignment="token", selects=True, several_teachers=True,
        ),
        GuidanceMethod("ce", "naive continual pretraining: every token", cross_entropy_only),
        GuidanceMethod(
            "rho1",
            "vocagnolm for a same-vocabulary teacher, token i paired with token i",
            paired_top_k_by_excess, teacher_loss=True, same_vocabulary=True, selects=True, several_teachers=True,
        ),
        GuidanceMethod(
            "kld",
            "CE + forward KL to the teacher's distribution over the student's vocabulary",
            kld_distillation, teacher_logits=True, same_vocabulary=True, alignment="token",
        ),
        GuidanceMethod(
            "uld",
            "CE + Universal Logit Distillation (sorted-probability L1, any vocabulary)",
            uld_distillation, teacher_logits=True, alignment="token",
        ),
        GuidanceMethod(
            "chunk",
            "vocagnolm through chunk-level alignment ranges",
            top_k_by_excess, teacher_loss=True, alignment="chunk", selects=True, several_teachers=True,
        ),
        GuidanceMethod(
            "random",
            "as many mapped tokens as vocagnolm trains, drawn uniformly (the control)",
            random_tokens, alignment="token", selects=True, several_teachers=True,
        ),
    )
}  # fmt: skip
Method = Literal[tuple(METHODS)]  # the choices of --guidance.method


def method_names(keep: Callable[[GuidanceMethod], bool], conjunction: str = "and") -> str:
    """The names of the methods `keep` accepts, for a message: "a, b and c"."""
    names = [m.name for m in METHODS.values() if keep(m)]
    return f" {conjunction} ".join(filter(None, [", ".join(names[:-1]), names[-1]]))


def method_help() -> str:
    """The table as `--help` prints it."""
    lines = [f"{m.name}: {m.description}" for m in METHODS.values()]
    lines.append(
        f"{method_names(lambda m: m.same_vocabulary)} need a teacher that has every student token with the same id (the same"
        " tokenizer, or an extension such as Llemma's of TinyLlama's)"
    )
    return "; ".join(lines)


@dataclass
class GuidanceArgs:
    """How the teacher guides the student (`--guidance.*`)."""

    method: Method = "vocagnolm"
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
    combine: Combine = "min"
    """With several teachers: how each student token's aggregated teacher losses become its reference, before the
    excess loss and the top-k. min: the teacher best at that token sets it; mean: the mean of the teachers that map
    it. A token is mapped if any teacher maps it."""
    compare: Compare = "token"
    """The scale teachers' losses are aggregated and compared on. token (the paper's): per teacher token, as they are,
    though one teacher may cut a student token's text into more, shorter tokens than another; byte: each teacher
    token's loss per UTF-8 byte of its text, the aggregate times the student token's bytes (the cost of its text at
    that teacher's rate). Needs each teacher's tokenizer (--teacher.checkpoint_dir, also beside --teacher.cache)"""

    def __post_init__(self) -> None:
        kinds = {"method": Method, "aggregation": Aggregation, "unmapped": Unmapped, "scope": Scope,
                 "combine": Combine, "compare": Compare}  # fmt: skip
        for name, kind in kinds.items():
            if getattr(self, name) not in get_args(kind):
                raise InvalidArgument(f"guidance.{name} must be one of {get_args(kind)}, got {getattr(self, name)!r}")
        if self.compare == "byte" and not self.spec.teacher_loss:
            raise InvalidArgument(
                f"guidance.compare=byte compares teachers' losses, and guidance.method={self.method!r} ranks by none:"
                f" use it with {method_names(lambda m: m.teacher_loss)}, or drop it."
            )
        check_top_k(self.top_k, what="guidance.top_k")
        if not self.temperature > 0:
            raise InvalidArgument(f"guidance.temperature must be > 0 (1.0: the plain softmax), got {self.temperature}")
        if not (math.isfinite(self.distill_weight) and self.distill_weight >= 0):
            raise InvalidArgument(f"guidance.distill_weight must be finite and >= 0, got {self.distill_weight}")
        if self.num_chunks < 1:
            raise InvalidArgument(f"guidance.num_chunks must be >= 1, got {self.num_chunks}")

    @property
    def spec(self) -> GuidanceMethod:
        """The method's entry in `METHODS`."""
        return METHODS[self.method]

    @property
    def num_chunks_if_chunked(self) -> int | None:
        """The chunk count the data loader replaces the ranges with, or None for token-level alignment."""
        return self.num_chunks if self.spec.alignment == "chunk" else None

    def check_tokenizers(self, same_vocabulary: bool) -> None:
        """Refuses a same-vocabulary method unless every student token has the same id in the teacher's vocabulary."""
        if self.spec.same_vocabulary and not same_vocabulary:
            raise InvalidArgument(
                f"guidance.method={self.method!r} needs a teacher with the student's vocabulary (every student token"
                " with the same id in the teacher's; more teacher tokens are fine, as Llemma's 32,016 hold"
                f" TinyLlama's 32,000), but these tokenizers differ. Use --guidance.method"
                f" {method_names(lambda m: m.needs_teacher and not m.same_vocabulary, 'or')} for a"
                " teacher with another vocabulary. With --teacher.cache alone the relation is the one `vocagnolm"
                " prepare` recorded: pass --teacher.checkpoint_dir to derive it from the teacher's tokenizer."
            )

    def check_several_teachers(self, num_teachers: int, fix: str) -> None:
        """Refuses several teachers for a method that takes one."""
        if num_teachers > 1 and not self.spec.several_teachers:
            several = method_names(lambda m: m.several_teachers)
            raise InvalidArgument(
                f"guidance.method={self.method!r} takes one teacher; several teachers guide {several}. {fix}"
            )


# `--help` prints the table: jsonargparse reads a field's help from the class docstring's Args section.
GuidanceArgs.__doc__ += f"\n\nArgs:\n    method: {method_help()}\n"


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
    token_bytes: TokenBytes | None = None,
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
        teacher_loss: (B, M) teacher per-token loss, NaN = unavailable, for a method whose entry needs it; random
            takes it optionally (without it a token is mapped when its range is non-empty). A list: one (B, M_k) per
            teacher; several are combined by `args.combine` (see `loss.teacher_reference`).
        ranges: (B, T, 2) teacher tokens [a, e) of each student token, for a method whose entry names an alignment
            (chunk: chunk-alignment ranges; kld and uld: pairing); rho1 defaults to 1:1 (token i -> [i, i + 1)).
            Several teachers: a list, one per teacher, as `teacher_loss`.
        logits: (B, T, V) student logits, with their gradient, for a method that needs the teacher's logits.
        teacher_logits: (B, M, Vt) teacher logits over its window.
        all_gather, rank: scope="global" (see `loss.select_top_k`).
        generator: random's generator, on `ls`'s device.
        vocab_size: kld: the student tokenizer's vocabulary size; ids below it are compared (see `kld_loss`).
        token_bytes: the bytes of the student's targets and of each teacher's window tokens, which
            `args.compare == "byte"` needs (`TokenBytes.look_up`); ignored when comparing per token.

    Returns: loss_sum (float32 scalar, with gradient), weight_sum (float32 scalar, no gradient), metrics (detached
        float32 scalars, no host sync): student_loss (mean CE over valid tokens), trained_fraction (weight sum /
        valid), and for the selecting methods mapped_fraction (of valid), selected_fraction (of valid mapped), plus,
        with a teacher loss, teacher_loss (mean over valid mapped), excess_selected and excess_unselected (mean excess
        of valid mapped tokens) and, with several teachers, reference_share_k for each teacher k (the share of the
        selected tokens where teacher k has the lowest aggregated loss: under `min`, where it set the reference);
        for the distillation methods distill_loss.
    """
    method = args.spec
    if args.compare == "byte" and token_bytes is None:
        raise ValueError("guidance.compare='byte' needs token_bytes: the bytes of each student and teacher token")
    inputs = LossInputs(one_or_several(teacher_loss), one_or_several(ranges), logits, teacher_logits, all_gather, rank,
                        generator, vocab_size, token_bytes if args.compare == "byte" else None)  # fmt: skip
    num_teachers = max(len(x) if isinstance(x, list) else 1 for x in (inputs.teacher_loss, inputs.ranges))
    args.check_several_teachers(num_teachers, fix="Pass one teacher's losses and ranges.")
    if method.teacher_loss and inputs.teacher_loss is None:
        raise ValueError(f"guidance.method={method.name!r} needs teacher_loss (B, M)")
    if method.alignment and inputs.ranges is None:
        raise ValueError(f"guidance.method={method.name!r} needs ranges (B, T, 2) from the alignment")
    if method.teacher_logits and (logits is None or teacher_logits is None):
        raise ValueError(f"guidance.method={method.name!r} needs the student's logits and the teacher's")

    n_valid = valid.sum().clamp(min=1)
    per_token, weights, method_metrics = method.loss(args, ls, valid, inputs)
    metrics = {"student_loss": ls.detach().sum() / n_valid, **method_metrics}
    weight_sum = weights.sum()
    metrics["trained_fraction"] = weight_sum / n_valid
    metrics = {name: value.detach().float() for name, value in metrics.items()}
    return (weights * per_token).sum(), weight_sum, metrics
