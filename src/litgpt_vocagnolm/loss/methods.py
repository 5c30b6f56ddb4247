"""The guidance methods, in one table: what each needs and its loss. Adding a method is one `GuidanceMethod` entry in
`METHODS`, its loss function and its test (docs/adding-a-method.md).

Everything else reads the table: `GuidanceArgs` (`--guidance.method` and its `--help`), the recipe's checks and its
teacher, `vocagnolm plan`, the demo. No other module lists method names.

A method's entry names the inputs it needs (`LossInputs` fields); its loss function takes the run's `GuidedLoss`
(arguments, vocabulary size, byte tables, seed: bound once), the student's per-token loss and what the micro-batch
brought (with scope "global", the step's verdict `LossInputs.chosen`, ranked across ranks before any micro-batch
trains), and returns each token's loss and weight (`MethodLoss`). `GuidedLoss` checks the inputs against the table,
calls it, and returns the weighted loss SUM and the weight SUM. The recipe adds both up over the micro-batches and
ranks of one optimizer step and divides once, so every trained token weighs the same (docs/design.md, "Teacher-guided
loss"):

    loss = sum(w * ls) / max(sum(w), 1)
"""

import math
from dataclasses import dataclass
from typing import Callable, Literal, NamedTuple, Sequence, get_args

import torch
from torch import Tensor

from litgpt_vocagnolm.errors import InvalidArgument
from litgpt_vocagnolm.loss.distillation import kld_loss, paired_teacher_positions, uld_loss
from litgpt_vocagnolm.loss.selection import (
    Aggregation,
    Combine,
    Compare,
    Scope,
    Selection,
    SelectionArgs,
    TokenBytes,
    Unmapped,
    check_top_k,
    position_draws,
    random_selection,
    select,
    selection_metrics,
    teacher_guided_selection,
    teacher_reference,
)


class LossInputs(NamedTuple):
    """What one micro-batch brings besides the student's per-token loss (`micro_batch.loss_inputs` builds it from a
    batch);
    a method's table entry names the fields its loss needs (`GuidanceMethod.inputs`). Lists hold one tensor per
    teacher, in the order of the data (`prepared.Batch.teachers`)."""

    teacher_losses: list[Tensor] | None = None
    """(B, M_k) each teacher's per-token loss, NaN = unavailable."""
    ranges: list[Tensor] | None = None
    """(B, T, 2) teacher tokens [a, e) of each student token, into each teacher's window, a == e unmapped."""
    logits: Tensor | None = None
    """(B, T, V) student logits, with their gradient (distillation)."""
    teacher_logits: Tensor | None = None
    """(B, M, Vt) the teacher's logits over its window (distillation)."""
    token_bytes: TokenBytes | None = None
    """`--guidance.compare byte`: the bytes each student and teacher token covers (`GuidedLoss.token_bytes`)."""
    positions: Tensor | None = None
    """(B,) int64: each row's place in the data order, the blocks trained before it over all ranks (`order.py`):
    random's draws are a function of the run's seed and each token's place (`selection.position_draws`)."""
    chosen: Tensor | None = None
    """(B, T) bool, scope "global": the tokens the top-k over the whole optimizer step chose (`GuidedLoss.ranking`
    on each of its micro-batches, then `selection.select_top_k`), which a selecting method trains instead of ranking
    this micro-batch alone."""


class MethodLoss(NamedTuple):
    """A method's verdict on one micro-batch, all (B, T) but the metrics."""

    per_token: Tensor
    """float32, with gradient: the loss of each token (the student's cross-entropy, plus any distillation term)."""
    weights: Tensor
    """float32, no gradient: how much each token counts (0 where not valid)."""
    metrics: dict[str, Tensor]
    """Detached scalars on the device, no host sync."""


LossFunction = Callable[["GuidedLoss", Tensor, Tensor, LossInputs], MethodLoss]
RankingFunction = Callable[["GuidedLoss", Tensor, Tensor, LossInputs], tuple[Tensor, Tensor]]


@dataclass(frozen=True)
class GuidanceMethod:
    """One guidance method: what it needs from the teacher and the data, and its loss."""

    name: str
    description: str
    """One line for `--help`."""
    loss: LossFunction
    """(guided, ls (B, T), valid (B, T), inputs) -> MethodLoss; `guided` (a `GuidedLoss`) holds the run's arguments."""
    inputs: tuple[str, ...] = ()
    """The `LossInputs` fields its loss needs: `GuidedLoss` refuses a micro-batch without them, and the recipe
    produces them (teacher_losses: the teacher runs, or its cache is read; teacher_logits: the teacher runs online)."""
    same_vocabulary: bool = False
    """Compares student and teacher token by token: every student token must have the same id in the teacher's."""
    alignment: Literal["token", "chunk"] | None = None
    """The alignment ranges it needs: token-level, chunk-level (`--guidance.num_chunks`), or none."""
    ranking: RankingFunction | None = None
    """A method that trains a top-k share of the mapped tokens (uses top_k, aggregation, unmapped, scope): what it
    ranks them by, (guided, ls, valid, inputs) -> (scores (B, T), candidates (B, T) bool). Scope "global" ranks a
    whole optimizer step's tokens by it before any of them trains."""
    several_teachers: bool = False
    """Several teachers can guide it (`--data.other_teachers`), combined by `--guidance.combine`."""

    def __post_init__(self) -> None:
        if unknown := set(self.inputs) - set(LossInputs._fields):
            raise ValueError(f"method {self.name!r} names inputs that LossInputs lacks: {sorted(unknown)}")

    @property
    def selects(self) -> bool:
        """Trains a top-k share of the mapped tokens, ranked by `ranking`."""
        return self.ranking is not None

    @property
    def teacher_loss(self) -> bool:
        """Needs the teachers' per-token losses (the teacher runs on every batch, or its cache is read)."""
        return "teacher_losses" in self.inputs

    @property
    def teacher_logits(self) -> bool:
        """Needs the teacher's full logits: the teacher runs online (a cache holds only losses)."""
        return "teacher_logits" in self.inputs

    @property
    def needs_teacher(self) -> bool:
        """A teacher (or its cache) must be given."""
        return self.teacher_loss or self.teacher_logits

    @property
    def needs_prepared_data(self) -> bool:
        """Trains on `vocagnolm prepare`'s data (teacher windows, alignment), not on plain LitGPT data."""
        return self.needs_teacher or self.alignment is not None


def cross_entropy_only(guided: "GuidedLoss", ls: Tensor, valid: Tensor, inputs: LossInputs) -> MethodLoss:
    """Every valid token, weight 1: naive continual pretraining."""
    return MethodLoss(ls, valid.float(), {})


def top_k_by_excess(guided: "GuidedLoss", ls: Tensor, valid: Tensor, inputs: LossInputs) -> MethodLoss:
    """The top-k mapped tokens by excess loss over the teachers' reference (`selection.teacher_guided_selection`)."""
    selection = teacher_guided_selection(
        ls.detach(),
        inputs.teacher_losses,
        inputs.ranges,
        valid,
        guided.selection,
        token_bytes=inputs.token_bytes,
        chosen=inputs.chosen,
    )
    return selection_loss(ls, valid, selection, inputs)


@torch.no_grad()
def excess_ranking(guided: "GuidedLoss", ls: Tensor, valid: Tensor, inputs: LossInputs) -> tuple[Tensor, Tensor]:
    """What `top_k_by_excess` ranks: each token's excess loss over the teachers' reference; the candidates are the
    valid tokens a teacher maps."""
    args = guided.args
    reference, mapped, _ = teacher_reference(
        inputs.teacher_losses, inputs.ranges, args.aggregation, args.combine, inputs.token_bytes
    )
    return ls.float() - reference, valid & mapped


def paired(ls: Tensor, inputs: LossInputs, method: str) -> LossInputs:
    """One vocabulary (rho1): token i paired with teacher token i unless ranges are given."""
    if inputs.ranges is not None:
        return inputs
    teacher_losses = inputs.teacher_losses
    if len(teacher_losses) != 1 or teacher_losses[0].shape != ls.shape:
        raise ValueError(
            f"guidance.method={method!r} pairs token i with teacher token i: teacher_losses must be one"
            f" {tuple(ls.shape)} tensor, got {[tuple(t.shape) for t in teacher_losses]} (pass ranges, or use"
            " vocagnolm for different tokenizers)"
        )
    position = torch.arange(ls.shape[1], device=ls.device)
    return inputs._replace(ranges=[torch.stack([position, position + 1], dim=-1).expand(*ls.shape, 2)])


def paired_top_k_by_excess(guided: "GuidedLoss", ls: Tensor, valid: Tensor, inputs: LossInputs) -> MethodLoss:
    """`top_k_by_excess` with token i paired with teacher token i unless ranges are given (one vocabulary)."""
    return top_k_by_excess(guided, ls, valid, paired(ls, inputs, guided.args.method))


def paired_excess_ranking(guided: "GuidedLoss", ls: Tensor, valid: Tensor, inputs: LossInputs) -> tuple[Tensor, Tensor]:
    """What `paired_top_k_by_excess` ranks (`excess_ranking` of the paired tokens)."""
    return excess_ranking(guided, ls, valid, paired(ls, inputs, guided.args.method))


def mapped_by_ranges(ranges: Sequence[Tensor]) -> Tensor:
    """(B, T) bool: the tokens any teacher's range maps (`random` without teacher losses)."""
    return torch.stack([r[..., 1] > r[..., 0] for r in ranges]).any(0)


@torch.no_grad()
def random_tokens(guided: "GuidedLoss", ls: Tensor, valid: Tensor, inputs: LossInputs) -> MethodLoss:
    """As many mapped tokens as the top-k trains, the top-k by uniform draws, a function of the run's seed and each
    token's place in the data (`selection.position_draws`): among the tokens with a teacher loss when one is given
    (reporting the excess it would have ranked by), else among those with a non-empty range."""
    args, ranges, teacher_losses = guided.args, inputs.ranges, inputs.teacher_losses
    mapped, reference, excess, best = mapped_by_ranges(ranges), None, None, None
    if teacher_losses is not None:  # what the teachers would have ranked by, for the metrics
        reference, mapped, best = teacher_reference(teacher_losses, ranges, args.aggregation, args.combine)
        excess = ls.float() - reference
    selection = random_selection(
        valid,
        mapped,
        args.top_k,
        args.unmapped,
        position_draws(guided.seed, inputs.positions, valid.shape[1]),
        scope=args.scope,
        chosen=inputs.chosen,
    )
    return selection_loss(ls, valid, selection._replace(reference=reference, excess=excess, best=best), inputs)


@torch.no_grad()
def random_ranking(guided: "GuidedLoss", ls: Tensor, valid: Tensor, inputs: LossInputs) -> tuple[Tensor, Tensor]:
    """What `random_tokens` ranks: its draws, over the tokens it counts as mapped (it reads no student loss)."""
    args, ranges, teacher_losses = guided.args, inputs.ranges, inputs.teacher_losses
    mapped = mapped_by_ranges(ranges)
    if teacher_losses is not None:
        mapped = teacher_reference(teacher_losses, ranges, args.aggregation, args.combine)[1]
    return position_draws(guided.seed, inputs.positions, valid.shape[1]), valid & mapped


@torch.no_grad()
def top_k_by_ranking(guided: "GuidedLoss", ls: Tensor, valid: Tensor, inputs: LossInputs) -> MethodLoss:
    """The top-k candidates by what the method's table entry ranks them by (`GuidanceMethod.ranking`), for a method
    that needs no more than that: its loss is the student's, its metrics the shares selected."""
    scores, candidates = guided.args.spec.ranking(guided, ls, valid, inputs)
    args = guided.args
    weights, candidate, selected = select(
        scores,
        valid,
        candidates,
        top_k=args.top_k,
        unmapped=args.unmapped,
        scope=args.scope,
        chosen=inputs.chosen,
    )
    return selection_loss(ls, valid, Selection(weights, candidate, selected, None, None), inputs)


def selection_loss(ls: Tensor, valid: Tensor, selection: Selection, inputs: LossInputs) -> MethodLoss:
    metrics = selection_metrics(selection, valid.sum(), num_teachers(inputs))
    return MethodLoss(ls, selection.weights, metrics)


def num_teachers(inputs: LossInputs) -> int:
    """The teachers a micro-batch's inputs speak for (1 without any teacher's)."""
    return max(1, len(inputs.teacher_losses or ()), len(inputs.ranges or ()))


def kld_distillation(guided: "GuidedLoss", ls: Tensor, valid: Tensor, inputs: LossInputs) -> MethodLoss:
    """Cross-entropy plus `distill_weight` x forward KL to the paired teacher distribution over the student's tokens."""
    if guided.vocab_size is None:
        method = guided.args.method
        raise ValueError(f"guidance.method={method!r} needs vocab_size, the student tokenizer's vocabulary size")
    (ranges,) = inputs.ranges
    pair_index = paired_teacher_positions(ranges)
    teacher_logits = inputs.teacher_logits
    # The paired teacher distribution, position by position, over the student's tokens.
    index = pair_index.clamp(min=0)[..., None].expand(-1, -1, teacher_logits.shape[-1])
    paired = torch.gather(teacher_logits, 1, index)  # (B, T, Vt)
    distill = kld_loss(inputs.logits, paired, valid & (pair_index >= 0), guided.vocab_size, guided.args.temperature)
    return distillation_loss(guided.args, ls, valid, distill)


def uld_distillation(guided: "GuidedLoss", ls: Tensor, valid: Tensor, inputs: LossInputs) -> MethodLoss:
    """Cross-entropy plus `distill_weight` x ULD (sorted-probability L1) to the paired teacher position."""
    (ranges,) = inputs.ranges
    distill = uld_loss(inputs.logits, inputs.teacher_logits, paired_teacher_positions(ranges), valid)
    return distillation_loss(guided.args, ls, valid, distill)


def distillation_loss(args: "GuidanceArgs", ls: Tensor, valid: Tensor, distill: Tensor) -> MethodLoss:
    metrics = {"distill_loss": distill.detach().sum() / valid.sum()}
    return MethodLoss(ls + args.distill_weight * distill, valid.float(), metrics)


METHODS: dict[str, GuidanceMethod] = {
    method.name: method
    for method in (
        GuidanceMethod(
            "vocagnolm",
            "train the top-k mapped tokens by excess loss (student minus aligned teacher loss)",
            top_k_by_excess,
            inputs=("teacher_losses", "ranges"),
            alignment="token",
            ranking=excess_ranking,
            several_teachers=True,
        ),
        GuidanceMethod("ce", "naive continual pretraining: every token", cross_entropy_only),
        GuidanceMethod(
            "rho1",
            "vocagnolm for a same-vocabulary teacher, token i paired with token i",
            paired_top_k_by_excess,
            inputs=("teacher_losses",),
            same_vocabulary=True,
            ranking=paired_excess_ranking,
            several_teachers=True,
        ),
        GuidanceMethod(
            "kld",
            "CE + forward KL to the teacher's distribution over the student's vocabulary",
            kld_distillation,
            inputs=("ranges", "logits", "teacher_logits"),
            same_vocabulary=True,
            alignment="token",
        ),
        GuidanceMethod(
            "uld",
            "CE + Universal Logit Distillation (sorted-probability L1, any vocabulary)",
            uld_distillation,
            inputs=("ranges", "logits", "teacher_logits"),
            alignment="token",
        ),
        GuidanceMethod(
            "chunk",
            "vocagnolm through chunk-level alignment ranges",
            top_k_by_excess,
            inputs=("teacher_losses", "ranges"),
            alignment="chunk",
            ranking=excess_ranking,
            several_teachers=True,
        ),
        GuidanceMethod(
            "random",
            "as many mapped tokens as vocagnolm trains, drawn uniformly (the control)",
            random_tokens,
            inputs=("ranges", "positions"),
            alignment="token",
            ranking=random_ranking,
            several_teachers=True,
        ),
    )
}
Method = Literal[tuple(METHODS)]  # the choices of --guidance.method


def method_names(keep: Callable[[GuidanceMethod], bool], conjunction: str = "and") -> str:
    """The names of the methods `keep` accepts, for a message: "a, b and c"."""
    names = [m.name for m in METHODS.values() if keep(m)]
    return f" {conjunction} ".join(filter(None, [", ".join(names[:-1]), names[-1]]))


def method_help() -> str:
    """The table as `--help` prints it."""
    lines = [f"{m.name}: {m.description}" for m in METHODS.values()]
    lines.append(
        f"{method_names(lambda m: m.same_vocabulary)} need a teacher that has every student token with the same id"
        f" (the same"
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
    """Where the top-k is ranked: the micro-batch, each sequence, or global: the whole optimizer step (every
    micro-batch of every data-parallel rank; one more forward of the student without gradients per micro-batch,
    a third more of its compute, for the methods that rank by its loss)"""
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
    min_mapped: float = 0.05
    """Stop the run at a step where fewer than this share of the student tokens map to a teacher (for the methods that
    map them; a step that maps none stops whatever this is): real pairs map over 90%, so a share near 0 is a teacher
    whose losses are NaN, or data prepared for another pair. 0: only a step that maps nothing stops"""

    def __post_init__(self) -> None:
        kinds = {
            "method": Method,
            "aggregation": Aggregation,
            "unmapped": Unmapped,
            "scope": Scope,
            "combine": Combine,
            "compare": Compare,
        }
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
        if not 0 <= self.min_mapped <= 1:
            raise InvalidArgument(
                f"guidance.min_mapped must be a share in [0, 1] (default 0.05), got {self.min_mapped}"
            )

    @property
    def selection(self) -> SelectionArgs:
        """The top-k's settings, for `selection.teacher_guided_selection`."""
        return SelectionArgs(self.top_k, self.aggregation, self.unmapped, self.scope, self.combine)

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


@dataclass(frozen=True)
class GuidedLoss:
    """A run's guided loss, built once from its arguments and called on each micro-batch:
    `guided(ls, valid, inputs)` -> (weighted loss SUM, weight SUM, metrics).

    Divide the summed losses by the summed weights of all micro-batches and ranks of an optimizer step, once.
    kld and uld add `distill_weight * distillation` to each valid token's cross-entropy with the same weight 1, so
    their loss is mean CE + distill_weight * distillation summed over valid tokens / valid tokens (unpaired tokens add
    0 to the sum, 1 to the count).
    """

    args: GuidanceArgs
    """The method and its options."""
    vocab_size: int | None = None
    """kld: the student tokenizer's vocabulary size; ids below it are compared (see `distillation.kld_loss`)."""
    byte_tables: Sequence[Tensor] = ()
    """`--guidance.compare byte`: the UTF-8 bytes of each token id (`prepared.byte_table`), (V,) each: the student's,
    then each teacher's."""
    seed: int = 0
    """The run's seed: random's draws (`selection.position_draws`)."""

    @property
    def selection(self) -> SelectionArgs:
        """The top-k's settings (`selection.teacher_guided_selection`)."""
        return self.args.selection

    def token_bytes(self, targets: Tensor, teacher_ids: Sequence[Tensor]) -> TokenBytes | None:
        """The bytes of a micro-batch's student targets (B, T) and of each teacher's window tokens (B, M_k), which
        `compare="byte"` needs; None when comparing per token."""
        if self.args.compare != "byte":
            return None
        if not self.byte_tables:
            raise ValueError("guidance.compare='byte' needs byte_tables: the bytes of each student and teacher token")
        return TokenBytes.look_up(self.byte_tables, targets, teacher_ids)

    def ranking(self, ls: Tensor, valid: Tensor, inputs: LossInputs) -> tuple[Tensor, Tensor]:
        """What a selecting method ranks on one micro-batch: (scores (B, T), candidates (B, T) bool), after checking
        its inputs (`verdict`). Scope "global" ranks every micro-batch of an optimizer step so, then trains each with
        the step's verdict (`LossInputs.chosen`)."""
        return self.args.spec.ranking(self, ls, valid, self.checked(inputs))

    def checked(self, inputs: LossInputs) -> LossInputs:
        """`inputs` checked against the method's table entry (the fields it needs), its byte counts dropped when
        comparing per token."""
        method = self.args.spec
        if self.args.compare == "byte" and inputs.token_bytes is None:
            raise ValueError("guidance.compare='byte' needs token_bytes: the bytes of each student and teacher token")
        if self.args.compare != "byte":
            inputs = inputs._replace(token_bytes=None)
        self.args.check_several_teachers(num_teachers(inputs), fix="Pass one teacher's losses and ranges.")
        if missing := [name for name in method.inputs if getattr(inputs, name) is None]:
            raise ValueError(f"guidance.method={method.name!r} needs {' and '.join(missing)} (see methods.LossInputs)")
        return inputs

    def verdict(self, ls: Tensor, valid: Tensor, inputs: LossInputs) -> MethodLoss:
        """The method's per-token loss and weights on one micro-batch, after checking its inputs against the table.

        Args:
            ls: (B, T) float32 student per-token cross-entropy, with its gradient; 0 where not valid.
            valid: (B, T) bool, False where there is no target (padding).
            inputs: the micro-batch's tensors; the fields the method's entry names (`GuidanceMethod.inputs`) must be
                given. random takes `teacher_losses` optionally (without them a token is mapped when a range is
                non-empty); rho1 takes `ranges` optionally (token i -> [i, i + 1)). Several teachers' losses are
                combined by `args.combine` (see `selection.teacher_reference`).
        """
        return self.args.spec.loss(self, ls, valid, self.checked(inputs))

    def __call__(self, ls: Tensor, valid: Tensor, inputs: LossInputs) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """One micro-batch's loss (arguments as `verdict`).

        Returns: loss_sum (float32 scalar, with gradient), weight_sum (float32 scalar, no gradient), metrics (detached
            float32 scalars, no host sync): student_loss (mean CE over valid tokens), trained_fraction (weight sum /
            valid), and for the selecting methods mapped_fraction (of valid), selected_fraction (of valid mapped),
            plus, with a teacher loss, teacher_loss (mean over valid mapped), excess_selected and excess_unselected
            (mean excess of valid mapped tokens) and, with several teachers, reference_share_k for each teacher k (the
            share of the selected tokens where teacher k has the lowest aggregated loss: under `min`, where it set the
            reference); for the distillation methods distill_loss. Each is NaN where it would be computed over no
            token (`selection.selection_metrics`).
        """
        n_valid = valid.sum()
        per_token, weights, method_metrics = self.verdict(ls, valid, inputs)
        metrics = {"student_loss": ls.detach().sum() / n_valid, **method_metrics}
        weight_sum = weights.sum()
        metrics["trained_fraction"] = weight_sum / n_valid
        metrics = {name: value.detach().float() for name, value in metrics.items()}
        return (weights * per_token).sum(), weight_sum, metrics
