"""One micro-batch of training: the teachers' scores (online or cached), the student's per-token loss and the guided
loss over them. `Guide` is what guides every micro-batch of a run, built once before `recipe.fit`."""

import contextlib
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import lightning as L
import torch
import torch.nn as nn

from litgpt_vocagnolm.data.prepared import Batch, TeacherSide
from litgpt_vocagnolm.loss.cross_entropy import IGNORE_INDEX, per_token_cross_entropy
from litgpt_vocagnolm.loss.methods import GuidanceArgs, GuidedLoss, LossInputs
from litgpt_vocagnolm.loss.selection import AllGather, select_top_k
from litgpt_vocagnolm.training.teacher import Teacher


@dataclass
class Guide:
    """What guides the student on each micro-batch: the teachers that score it and the run's guided loss."""

    teachers: list[Teacher]
    """The scoring teachers (online or cached: `teacher.teachers_of`), one per teacher side of a batch
    (`prepared.Batch.teachers`); empty when none scores."""
    loss: GuidedLoss
    """Built once from the run's arguments (`methods.GuidedLoss`)."""
    all_gather: AllGather | None = None
    """Scope "global": stacks a tensor from every data-parallel rank (`fabric.all_gather`), for the top-k over a whole
    step (`step_choice`)."""
    rank: int = 0
    """This process's index in the `all_gather` result (`fabric.global_rank`)."""

    @classmethod
    def build(
        cls,
        fabric: L.Fabric,
        guidance: GuidanceArgs,
        teachers: list[Teacher],
        vocab_size: int | None = None,
        byte_tables: Sequence[torch.Tensor] = (),
        seed: int = 0,
    ) -> "Guide":
        """The guide of a run on `fabric`: its rank, and its all_gather for `--guidance.scope global`; `vocab_size`
        (the student tokenizer's) for `kld`, `byte_tables` (`prepared.byte_table`) for `--guidance.compare byte`,
        `seed` for `random`'s draws; of `teachers`, those that score (`Teacher.mode`)."""
        loss = GuidedLoss(guidance, vocab_size=vocab_size, byte_tables=byte_tables, seed=seed)
        all_gather = fabric.all_gather if guidance.scope == "global" else None
        return cls([t for t in teachers if t.mode], loss, all_gather, fabric.global_rank)

    @property
    def ranks_the_step(self) -> bool:
        """Whether the top-k ranks a whole optimizer step's tokens (scope "global" of a selecting method), so that
        each micro-batch trains with the step's verdict (`step_choice`)."""
        return self.loss.args.scope == "global" and self.loss.args.spec.selects


class TeacherScores(NamedTuple):
    """What the teachers say of one micro-batch (`teacher_scores`)."""

    losses: list[torch.Tensor] | None
    """(B, M_k) each teacher's per-token loss, NaN = unavailable; None when no teacher scores."""
    logits: torch.Tensor | None
    """(B, M, V_teacher) the first teacher's logits, for the distillation methods; else None."""
    nonfinite: torch.Tensor | None = None
    """(K,) float: for each online teacher, whether it gave a NaN or infinite loss (or logit) where it has one to give
    (`nonfinite_scores`); None for cached teachers (a cache holding one is refused when read) and without teachers."""


def teacher_scores(
    guide: Guide, batch: Batch, teacher_timer: contextlib.AbstractContextManager = contextlib.nullcontext()
) -> TeacherScores:
    """The teachers' scores of a micro-batch (`Teacher.score`: online, timed by `teacher_timer`, or cached), under
    no_grad."""
    teachers, sides = guide.teachers, batch.teachers
    online = bool(teachers) and teachers[0].mode == "online"
    with teacher_timer if online else contextlib.nullcontext(), torch.no_grad():
        if online and guide.loss.args.spec.teacher_logits:  # the distillation baselines need the whole distribution
            logits = teachers[0].model(sides[0].ids)  # (B, M, V_teacher)
            return TeacherScores(None, logits, (~torch.isfinite(logits).all()).float()[None])
        if teachers:
            losses = [teacher.score(side) for teacher, side in zip(teachers, sides, strict=True)]
            return TeacherScores(losses, None, nonfinite_scores(losses, sides) if online else None)
    return TeacherScores(None, None)


def nonfinite_scores(losses: Sequence[torch.Tensor], sides: Sequence[TeacherSide]) -> torch.Tensor:
    """(K,) float: for each teacher, whether one of its per-token losses (B, M) is NaN or infinite on its window's
    tokens (NaN is its loss by definition on each window's first token and on padding). One reduction per teacher,
    no host sync: `step.train_step` adds them to the step's all-reduce."""
    return torch.stack(
        [(~torch.isfinite(loss[:, 1:]) & side.valid[:, 1:]).any() for loss, side in zip(losses, sides)]
    ).float()


def forward_and_loss(
    model: nn.Module,
    guide: Guide,
    batch: Batch | torch.Tensor,
    *,
    positions: torch.Tensor | None = None,
    chosen: torch.Tensor | None = None,
    scores: TeacherScores | None = None,
    teacher_timer: contextlib.AbstractContextManager = contextlib.nullcontext(),
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """One micro-batch: teacher scores (`teacher_scores`, unless `scores` were computed already), student forward,
    guided loss. `batch`: a loader's (`prepared.Batch.of`); `positions` (B,): its rows' places in the data order
    (`random`'s draws); `chosen` (B, T): the step's verdict under scope "global" (`step_choice`). Returns the weighted
    loss sum, the weight sum and detached metrics (see `methods.GuidedLoss`)."""
    batch = Batch.of(batch)
    scores = teacher_scores(guide, batch, teacher_timer) if scores is None else scores
    if guide.loss.args.spec.teacher_logits:
        logits = model(batch.input_ids)  # (B, T, V_student)
        ls = per_token_cross_entropy(logits, batch.targets)  # (B, T) float32
    else:  # the head and the loss a tile of rows at a time: no (B, T, V) logits
        logits, ls = None, model(batch.input_ids, targets=batch.targets)  # (B, T) float32
    inputs = loss_inputs(
        batch, guide.loss, scores.losses, logits=logits, teacher_logits=scores.logits, positions=positions
    )
    return guide.loss(ls, batch.targets != IGNORE_INDEX, inputs._replace(chosen=chosen))


@torch.no_grad()
def step_choice(
    model: nn.Module,
    guide: Guide,
    batches: Sequence[Batch],
    positions: Sequence[torch.Tensor | None],
    teacher_timer: contextlib.AbstractContextManager = contextlib.nullcontext(),
) -> tuple[list[TeacherScores], torch.Tensor]:
    """Scope "global": the top-k over a whole optimizer step, before any of its micro-batches trains. Each of this
    rank's micro-batches (`batches`, their rows' `positions`) is scored by the teachers and ranked by the method
    (`GuidedLoss.ranking`; the methods that rank by the student's loss run its forward without gradients first, a
    third more of its compute), then every rank's ranks are gathered and ranked in the step's order
    (`selection.select_top_k`), so that 1 or N processes select the same tokens. Returns the teachers' scores, for
    the training pass to reuse, and this rank's verdict (A, B, T) bool."""
    scores, ranked, candidates = [], [], []
    needs_loss = guide.loss.args.spec.teacher_loss  # excess ranks by the student's loss; random reads none
    for batch, rows in zip(batches, positions, strict=True):
        scores.append(teacher_scores(guide, batch, teacher_timer))
        ls = model(batch.input_ids, targets=batch.targets) if needs_loss else None  # (B, T) float32
        inputs = loss_inputs(batch, guide.loss, scores[-1].losses, positions=rows)
        rank_by, candidate = guide.loss.ranking(ls, batch.targets != IGNORE_INDEX, inputs)
        ranked.append(rank_by)
        candidates.append(candidate)
    args = guide.loss.args
    chosen = select_top_k(
        torch.stack(ranked),
        torch.stack(candidates),
        args.top_k,
        scope="global",
        all_gather=guide.all_gather,
        rank=guide.rank,
    )
    return scores, chosen


def loss_inputs(
    batch: Batch,
    guided: GuidedLoss,
    teacher_losses: list[torch.Tensor] | None,
    *,
    logits: torch.Tensor | None = None,
    teacher_logits: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
) -> LossInputs:
    """What the guided loss reads of a micro-batch: its teachers' ranges and token bytes, with the teachers' losses
    (one (B, M_k) per teacher, cached or online, or None), the logits of the distillation methods and its rows'
    positions in the data order (`random`)."""
    sides = batch.teachers
    ranges = [side.ranges for side in sides] or None
    token_bytes = guided.token_bytes(batch.targets, [side.ids for side in sides])
    return LossInputs(teacher_losses, ranges, logits, teacher_logits, token_bytes, positions)
