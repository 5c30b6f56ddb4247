"""One micro-batch of training: the teachers' scores (online or cached), the student's per-token loss and the guided
loss over them. `Guide` is what guides every micro-batch of a run, built once before `recipe.fit`."""

import contextlib
from dataclasses import dataclass
from typing import Sequence

import lightning as L
import torch
import torch.nn as nn

from litgpt_vocagnolm.data.prepared import Batch
from litgpt_vocagnolm.loss.cross_entropy import IGNORE_INDEX, per_token_cross_entropy
from litgpt_vocagnolm.loss.methods import GuidanceArgs, GuidedLoss, LossInputs
from litgpt_vocagnolm.training.teacher import Teacher


@dataclass
class Guide:
    """What guides the student on each micro-batch: the teachers that score it and the run's guided loss."""

    teachers: list[Teacher]
    """The scoring teachers (online or cached: `teacher.teachers_of`), one per teacher side of a batch
    (`prepared.Batch.teachers`); empty when none scores."""
    loss: GuidedLoss
    """Built once from the run's arguments (`methods.GuidedLoss`)."""

    @classmethod
    def build(
        cls,
        fabric: L.Fabric,
        guidance: GuidanceArgs,
        teachers: list[Teacher],
        vocab_size: int | None = None,
        byte_tables: Sequence[torch.Tensor] = (),
    ) -> "Guide":
        """The guide of a run on `fabric`: its rank, and its all_gather for `--guidance.scope global`; `vocab_size`
        (the student tokenizer's) for `kld`, `byte_tables` (`prepared.byte_table`) for `--guidance.compare byte`; of
        `teachers`, those that score (`Teacher.mode`)."""
        all_gather = fabric.all_gather if guidance.scope == "global" else None
        loss = GuidedLoss(
            guidance, all_gather=all_gather, rank=fabric.global_rank, vocab_size=vocab_size, byte_tables=byte_tables
        )
        return cls([t for t in teachers if t.mode], loss)


def forward_and_loss(
    model: nn.Module,
    guide: Guide,
    batch: Batch | torch.Tensor,
    *,
    generator: torch.Generator | None = None,
    teacher_timer: contextlib.AbstractContextManager = contextlib.nullcontext(),
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """One micro-batch: teacher scores (`Teacher.score`: online, timed by `teacher_timer`, or cached), student forward,
    guided loss (`generator`: `random`'s draws). `batch`: a loader's (`prepared.Batch.of`). Returns the weighted loss
    sum, the weight sum and detached metrics (see `methods.GuidedLoss`)."""
    batch, method, teachers = Batch.of(batch), guide.loss.args.spec, guide.teachers
    sides = batch.teachers
    teacher_losses, teacher_logits = None, None
    online = bool(teachers) and teachers[0].mode == "online"
    with teacher_timer if online else contextlib.nullcontext(), torch.no_grad():
        if online and method.teacher_logits:  # the distillation baselines need the whole distribution, at a cost
            teacher_logits = teachers[0].model(sides[0].ids)  # (B, M, V_teacher)
        elif teachers:
            teacher_losses = [teacher.score(side) for teacher, side in zip(teachers, sides, strict=True)]  # (B, M_k)

    if method.teacher_logits:
        logits = model(batch.input_ids)  # (B, T, V_student)
        ls = per_token_cross_entropy(logits, batch.targets)  # (B, T) float32
    else:  # the head and the loss a tile of rows at a time: no (B, T, V) logits
        logits, ls = None, model(batch.input_ids, targets=batch.targets)  # (B, T) float32
    inputs = loss_inputs(
        batch, guide.loss, teacher_losses, logits=logits, teacher_logits=teacher_logits, generator=generator
    )
    return guide.loss(ls, batch.targets != IGNORE_INDEX, inputs)


def loss_inputs(
    batch: Batch,
    guided: GuidedLoss,
    teacher_losses: list[torch.Tensor] | None,
    *,
    logits: torch.Tensor | None = None,
    teacher_logits: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> LossInputs:
    """What the guided loss reads of a micro-batch: its teachers' ranges and token bytes, with the teachers' losses
    (one (B, M_k) per teacher, cached or online, or None), the logits of the distillation methods and `random`'s
    generator."""
    sides = batch.teachers
    ranges = [side.ranges for side in sides] or None
    token_bytes = guided.token_bytes(batch.targets, [side.ids for side in sides])
    return LossInputs(teacher_losses, ranges, logits, teacher_logits, token_bytes, generator)
