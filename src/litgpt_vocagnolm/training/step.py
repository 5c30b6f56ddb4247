"""One optimizer step of the recipe (`train_step`: its micro-batches, the one all-reduce, the gradients divided by the
step's weight, clipping, the optimizer) and what the loop keeps between steps (`Loop`: the schedule, the running
figures), which `recipe.fit` reads after each step, and the line and metrics it logs (`log_step`).

The loss is a weighted sum over every micro-batch and rank of one optimizer step divided once by the total weight:
each micro-batch backpropagates its unnormalised sum, and the gradients are divided by the all-reduced weight count
before clipping (so every trained token weighs the same, however selection spreads over micro-batches and ranks)."""

import math
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Iterator

import lightning as L
import torch
from litgpt.args import TrainArgs
from litgpt.utils import CycleIterator
from torch.distributed.tensor import DTensor

from litgpt_vocagnolm.data import order
from litgpt_vocagnolm.data.prepared import Batch
from litgpt_vocagnolm.errors import NotFinite, Unguided
from litgpt_vocagnolm.loss.cross_entropy import IGNORE_INDEX
from litgpt_vocagnolm.training.distributed import mean_over_ranks
from litgpt_vocagnolm.training.micro_batch import Guide, TeacherScores, forward_and_loss, step_choice, teacher_scores
from litgpt_vocagnolm.training.stopwatch import Stopwatch


@dataclass
class Step:
    """What one optimizer step leaves for what follows it: device tensors, read (a host sync) only on log steps and
    before checkpoints."""

    totals: torch.Tensor
    """(3,): the step's weighted loss sum, its weight sum and the number of ranks asked to stop, over all ranks."""
    faults: torch.Tensor
    """(2 + K,) bool, over all ranks: whether the step's share of mapped tokens fell below `--guidance.min_mapped` (or
    was 0; for the methods that map tokens), whether it trained no token, and for each of the K scoring teachers
    whether it gave a non-finite loss online (`Loop.check_guidance` reads them)."""
    metrics: dict[str, torch.Tensor]
    """The guided loss's metrics (`methods.GuidedLoss`), each (2,): this rank's sum over the step's micro-batches
    that computed it and their count (a NaN, computed over no token, counts as nothing); `distributed.mean_over_ranks`
    divides."""
    finite: torch.Tensor
    """() bool: whether the step's gradient norm was finite."""
    seconds: float
    """The step's time on the host."""


def train_step(
    fabric: L.Fabric,
    state: dict,
    batches: Iterator,
    guide: Guide,
    train: TrainArgs,
    *,
    stop: threading.Event,
    teacher_timer: Stopwatch,
) -> Step:
    """One optimizer step of `state`'s model and optimizer: the step's micro-batches taken from `batches` (under
    scope "global" all ranked first, `step_choice`), each one's weighted loss sum backpropagated, then one all-reduce
    of the sums and of the ranks' stop vote (`stop` set), so that all ranks stop after the same step (a rank that
    stopped alone would leave the others waiting in FSDP's collectives); the gradients divided by the total weight,
    clipped, and the optimizer's step. No host sync.

    Micro-batch k of this rank holds the step's (k·W + rank)-th micro-batch (`order.RankBatches`): its rows' places in
    the data order (`random`'s draws) follow from the position the step starts at."""
    t0 = time.perf_counter()
    model, optimizer = state["model"], state["optimizer"]
    B, W = train.micro_batch_size, fabric.world_size
    accumulation = order.accumulation(train.global_batch_size, B, W)
    micro_batches = [Batch.of(next(batches)) for _ in range(accumulation)]
    positions = [None] * accumulation
    if "positions" in guide.loss.args.spec.inputs:  # random's draws; no kernel for the other methods
        rows = torch.arange(B, device=fabric.device)
        positions = [rows + state["position"] + (k * W + fabric.global_rank) * B for k in range(accumulation)]
    scores, chosen = [None] * accumulation, [None] * accumulation
    if guide.ranks_the_step:
        scores, chosen = step_choice(model, guide, micro_batches, positions, teacher_timer)
    sums = torch.zeros(5 + len(guide.teachers), device=fabric.device)  # `Step.totals`, then `guidance_counts`
    metric_sums = 0.0  # (N, 2) once a micro-batch has added its metrics
    for k, batch in enumerate(micro_batches):
        state["iter_num"] += 1
        if scores[k] is None:
            scores[k] = teacher_scores(guide, batch, teacher_timer)
        with fabric.no_backward_sync(model, enabled=k < accumulation - 1):
            loss_sum, weight_sum, micro_metrics = forward_and_loss(
                model,
                guide,
                batch,
                positions=positions[k],
                chosen=chosen[k],
                scores=scores[k],
                teacher_timer=teacher_timer,
            )
            fabric.backward(loss_sum)
        sums[:2] += torch.stack([loss_sum.detach(), weight_sum.detach()])
        sums[3:] += guidance_counts(batch, micro_metrics, scores[k], len(guide.teachers))
        metric_sums = metric_sums + metric_pairs(micro_metrics)
    if stop.is_set():
        sums[2] = 1.0
    reduced = fabric.all_reduce(sums, reduce_op="sum")  # the one all-reduce of the step
    totals, (mapped, valid), nonfinite = reduced[:3], reduced[3:5], reduced[5:]
    unmapped = ((mapped == 0) | (mapped < guide.loss.args.min_mapped * valid)) & (valid > 0)
    faults = torch.cat([unmapped[None], totals[1:2] == 0, nonfinite > 0])
    # FSDP averages gradients over ranks; undo that and divide by the step's total weight instead.
    scale = fabric.world_size / totals[1].clamp(min=1)
    for param in model.parameters():
        if param.grad is not None:
            param.grad.mul_(scale)
    norm = fabric.clip_gradients(model, optimizer, max_norm=train.max_norm, error_if_nonfinite=False)
    finite = torch.isfinite(norm.full_tensor() if isinstance(norm, DTensor) else norm)  # FSDP2: a DTensor
    optimizer.step()
    optimizer.zero_grad()
    state["step_count"] += 1
    state["position"] += train.global_batch_size
    return Step(totals, faults, dict(zip(micro_metrics, metric_sums)), finite, time.perf_counter() - t0)


def guidance_counts(
    batch: Batch, metrics: dict[str, torch.Tensor], scores: TeacherScores, num_teachers: int
) -> torch.Tensor:
    """(2 + K,) of one micro-batch, what `Step.faults` is made of: its mapped and valid tokens (0 and 0 for a method
    that maps none: no `mapped_fraction`) and each online teacher's non-finite flag (`TeacherScores.nonfinite`)."""
    valid = (batch.targets != IGNORE_INDEX).sum().float()
    mapped = metrics.get("mapped_fraction")
    counts = torch.stack([mapped * valid, valid]).nan_to_num(0.0) if mapped is not None else valid.new_zeros(2)
    nonfinite = scores.nonfinite if scores.nonfinite is not None else valid.new_zeros(num_teachers)
    return torch.cat([counts, nonfinite])


def metric_pairs(metrics: dict[str, torch.Tensor]) -> torch.Tensor:
    """One micro-batch's N metrics (scalars, NaN where computed over no token) as (N, 2): each value (0 for a NaN) and
    whether it was computed, so that their sum over a step's micro-batches holds each metric's sum and count
    (`Step.metrics`). A handful of kernels whatever N, no host sync."""
    values = torch.stack(list(metrics.values())).float()
    return torch.stack([values.nan_to_num(0.0), (~values.isnan()).float()], dim=1)


@dataclass
class Loop:
    """What the training loop keeps between optimizer steps: its schedule, the batches and the running figures."""

    accumulation: int
    """Micro-batches per optimizer step on each rank (`order.accumulation`)."""
    tokens_per_iter: int
    """Tokens per micro-batch on each rank."""
    max_steps: int
    """The run's optimizer steps: its token budget, or `--train.max_steps`."""
    warmup_steps: int
    """The learning rate's warm-up, in optimizer steps."""
    epoch_blocks: int | None
    """Blocks in one epoch of the train split (`train_split_blocks`)."""
    batches: CycleIterator
    """The train loader's micro-batches, epoch after epoch."""
    teacher_timer: Stopwatch
    """Time spent in the online teachers."""
    initial_iter: int
    """The micro-batches trained before this process started (a resumed run's)."""
    finite: torch.Tensor
    """() bool: whether every gradient norm since the last check was finite."""
    teachers: list[str]
    """The scoring teachers, by checkpoint directory (or cache), as `check_guidance` names them."""
    min_mapped: float
    """`--guidance.min_mapped`, as `check_guidance` quotes it."""
    faults: torch.Tensor
    """(2 + K,) bool: `Step.faults` of every step since the last check, or-ed."""
    checked: int
    """The step of the last check (`check_guidance`), or the first step's predecessor."""
    t0: float = field(default_factory=time.perf_counter)
    """When the loop started, once every rank was there."""
    step_time: float = 0.0
    """Seconds spent in `train_step`."""
    val_metrics: dict[str, float] = field(default_factory=dict)
    """The last validation's."""

    @classmethod
    def start(cls, fabric: L.Fabric, state: dict, train_dataloader, train: TrainArgs, guide: Guide) -> "Loop":
        """The loop of `state`'s run from where it is, its schedule from `train`: the schedule counts optimizer steps,
        not micro-batches as litgpt.pretrain does, so that step k gets the same learning rate whatever the split of the
        global batch into devices and accumulation."""
        accumulation = order.accumulation(train.global_batch_size, train.micro_batch_size, fabric.world_size)
        epoch_blocks = train_split_blocks(train_dataloader, train.micro_batch_size * fabric.world_size)
        tokens_per_iter = train.micro_batch_size * state["model"].max_seq_length
        max_steps = run_steps(train, state["model"].max_seq_length)
        warmup_steps = train.lr_warmup_steps or 0
        if train.lr_warmup_fraction and epoch_blocks:  # a share of one epoch's steps, as LitGPT counts it
            warmup_steps = math.ceil(train.lr_warmup_fraction * epoch_blocks / train.global_batch_size)
        warmup_steps = min(warmup_steps, max_steps)
        if warmup_steps >= max_steps > 0:  # `get_lr` divides by max_steps - warmup_steps: leave one step of decay
            fabric.print(
                f"Warm-up capped at {max_steps - 1} steps: the run has {max_steps}, the last one for the decay."
            )
            warmup_steps = max_steps - 1
        fabric.print(
            f"Tokens per optimizer step: {tokens_per_iter * accumulation * fabric.world_size:,}"
            f" ({accumulation} micro-batches of {train.micro_batch_size} x {state['model'].max_seq_length} on"
            f" {fabric.world_size} ranks); {max_steps:,} steps."
        )
        if epoch_blocks and train.global_batch_size > epoch_blocks:  # a step spans epochs of the global order
            fabric.print(
                f"Each optimizer step reads {train.global_batch_size:,} blocks from a train split of {epoch_blocks:,}:"
                f" every block {train.global_batch_size / epoch_blocks:.2f} times on average. Lower"
                " --train.global_batch_size, or prepare more data, to read each block at most once a step."
            )
        finite = torch.ones((), dtype=torch.bool, device=fabric.device)
        faults = torch.zeros(2 + len(guide.teachers), dtype=torch.bool, device=fabric.device)
        teachers = [str(teacher.checkpoint_dir or teacher.cache) for teacher in guide.teachers]
        batches, timer = CycleIterator(train_dataloader), Stopwatch(fabric.device)
        fabric.barrier()
        return cls(
            accumulation,
            tokens_per_iter,
            max_steps,
            warmup_steps,
            epoch_blocks,
            batches,
            timer,
            state["iter_num"],
            finite,
            teachers,
            guide.loss.args.min_mapped,
            faults,
            state["step_count"],
        )

    def check_guidance(self, step: int) -> None:
        """Stops the run, in one line, when a step since the last check had a fault (`Step.faults`): a teacher's
        non-finite loss, too few tokens mapped, none trained. A host sync: on log steps and before checkpoints only,
        as the gradient norm's check; every rank reads the same all-reduced faults, so all stop together."""
        unmapped, untrained, *teachers = self.faults.tolist()
        steps, self.checked = f"steps {self.checked + 1}..{step}", step
        for name, nonfinite in zip(self.teachers, teachers):
            if nonfinite:
                raise NotFinite(
                    f"The teacher {name} gave a NaN or infinite loss in {steps}: it can't guide (its weights hold NaN,"
                    f" or its losses overflow --teacher.precision). Check it (`litgpt generate {name}`), or train with"
                    " --teacher.precision 32-true."
                )
        if unmapped:
            raise Unguided(
                f"A step in {steps} mapped fewer than {self.min_mapped:.0%} of its tokens to a teacher"
                " (--guidance.min_mapped): the teacher guides (almost) nothing. Real pairs map over 90%: check that the"
                " teacher's losses are finite and that --data.path was prepared for this teacher (`vocagnolm"
                " inspect`), or pass --guidance.min_mapped 0 to stop only where nothing maps."
            )
        if untrained:
            raise Unguided(
                f"A step in {steps} trained no token (every weight 0, so nothing learns): with --guidance.unmapped"
                " exclude no token was mapped. Check the teacher and --data.path, or train with --guidance.unmapped"
                " include."
            )


def run_steps(train: TrainArgs, max_seq_length: int) -> int:
    """The run's optimizer steps: as many global batches of `max_seq_length`-token blocks as its token budget holds,
    or `--train.max_steps` if fewer."""
    steps = train.max_tokens // (train.global_batch_size * max_seq_length)
    return steps if train.max_steps is None else min(steps, train.max_steps)


def train_split_blocks(train_dataloader, blocks_per_round: int) -> int | None:
    """Blocks in one epoch of the train split: the global order's (`order.train_loader`), or a LitGPT data module's
    loader's batches per rank times `blocks_per_round` (micro-batch x ranks); None for an iterable without a length."""
    dataset = getattr(train_dataloader, "dataset", None)
    if isinstance(dataset, order.Blocks):
        return len(dataset)
    return len(train_dataloader) * blocks_per_round if hasattr(train_dataloader, "__len__") else None


def log_step(fabric: L.Fabric, state: dict, step: Step, loop: Loop) -> None:
    """The step's log line and metrics: the loss read from the device (a host sync), the metrics' mean over ranks."""
    t1 = time.perf_counter()
    loss = (step.totals[0] / step.totals[1].clamp(min=1)).item()  # expensive device-to-host synchronization
    tokens_per_iter = loop.tokens_per_iter
    tokens = (state["iter_num"] - loop.initial_iter) * tokens_per_iter * fabric.world_size
    per_step = (t1 - loop.t0) / (state["iter_num"] - loop.initial_iter) * loop.accumulation
    log = {
        "loss": loss,
        "iter": state["iter_num"],
        "step": state["step_count"],
        "epoch": (state["position"] - 1) // loop.epoch_blocks if loop.epoch_blocks else loop.batches.epoch,
        "iter_time": step.seconds / loop.accumulation,
        "remaining_time": per_step * (loop.max_steps - state["step_count"]),
        "tokens": state["iter_num"] * tokens_per_iter,
        "total_tokens": state["iter_num"] * tokens_per_iter * fabric.world_size,
        "learning_rate": state["optimizer"].param_groups[0]["lr"],
        "tokens_per_sec": tokens / (t1 - loop.t0),
        "teacher_time_share": loop.teacher_timer.seconds() / max(loop.step_time, 1e-9),
        **mean_over_ranks(fabric, step.metrics),
    }
    fabric.print(
        f"Epoch {log['epoch'] + 1} | iter {log['iter']} step {log['step']} | loss train: {loss:.3f}"
        f"{step_summary(log)} | {format_metrics(loop.val_metrics)} | iter time: {log['iter_time'] * 1000:.2f} ms"
        f" remaining time: {timedelta(seconds=int(log['remaining_time']))!s}"
    )
    fabric.log_dict(log, step=state["step_count"])  # the step the line prints, as every logger keys it


def step_summary(log: dict[str, float]) -> str:
    """The step line's guided-loss figures, those the method reports: the student's cross-entropy and, for the
    selecting methods, the share of mapped tokens selected (no figure for what a method does not compute)."""
    text = f", student CE: {log['student_loss']:.3f}" if "student_loss" in log else ""
    if "selected_fraction" in log and "mapped_fraction" in log:
        text += f", selected: {log['selected_fraction']:.2f} of mapped {log['mapped_fraction']:.2f}"
    return text


def format_metrics(metrics: dict[str, float]) -> str:
    if not metrics:
        return "val: n/a"
    return ", ".join(f"{name}: {value:.3f}" for name, value in metrics.items() if name != "val_ppl")
