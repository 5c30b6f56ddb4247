"""The `vocagnolm` recipe: continual pretraining of a student guided by a frozen teacher with another tokenizer.

`litgpt pretrain --recipe vocagnolm --config <setting>` (a packaged recipe by name, or a YAML's path; or
`vocagnolm pretrain ...`).

It mirrors litgpt/pretrain.py (`setup()` -> `main()` -> `fit()` -> `validate()`, the same `state` keys, checkpoints
in `step-%08d/` and `final/`) and changes one thing: the loss. Each micro-batch carries the student block, the teacher
tokens covering the same characters and the alignment between them (prepared offline by `vocagnolm prepare`); the
frozen teacher scores its own tokens, and `methods.GuidedLoss` weights the student's per-token losses
(docs/design.md, "Teacher-guided loss"). Every method of `methods.METHODS` (VocAgnoLM and the baselines) is one
switch, `--guidance.method`, never a forked loop.

`fit` splits at the optimizer step: the step itself (its micro-batches, the one all-reduce, clipping, the optimizer)
is `step.train_step`, what follows it (log, validation, checkpoints, the stop signal) `after_step`.

What surrounds the loop lives apart: the input checks in `checks`, the order of the training data (one global order,
resumed from a count of blocks on any number of processes) in `order`, sharding and activation checkpointing in
`distributed`, checkpoint writing and resuming in `checkpoints`, the stop on a signal (SIGUSR1, SIGINT, SIGTERM) and
the requeue in `slurm`.
"""

import math
import pprint
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import lightning as L
import torch
import torch.nn as nn
from litgpt.args import EvalArgs, LogArgs, TrainArgs
from litgpt.config import Config
from litgpt.data import DataModule
from litgpt.pretrain import get_lr
from litgpt.types import LoggerChoice
from litgpt.utils import (
    choose_logger,
    init_out_dir,
    instantiate_torch_optimizer,
    num_parameters,
    parse_devices,
)

from litgpt_vocagnolm.data import order
from litgpt_vocagnolm.data.prepared import Batch, VocAgnoData, byte_table
from litgpt_vocagnolm.errors import NotFinite, check_writable, given_by
from litgpt_vocagnolm.loss.cross_entropy import IGNORE_INDEX
from litgpt_vocagnolm.loss.methods import GuidanceArgs
from litgpt_vocagnolm.loss.selection import bits_per_byte
from litgpt_vocagnolm.models.gpt import initialize_weights, new_model
from litgpt_vocagnolm.models.model_configs import register
from litgpt_vocagnolm.models.weights import load_weights
from litgpt_vocagnolm.training.checkpoints import (
    Checkpointer,
    check_out_dir,
    find_resume_checkpoint,
    hyperparameters,
    previous_checkpoints,
    saved_checkpoints,
)
from litgpt_vocagnolm.training.checks import (
    check_budget,
    check_optimizer,
    check_out_dir_apart,
    check_run_args,
    check_seed,
    check_seq_len,
    check_setup,
    check_start,
    resume_history,
    tokenizer_pair_summary,
)
from litgpt_vocagnolm.training.distributed import (
    FSDPArgs,
    checkpoint_activations,
    compile_blocks,
    fabric_strategy,
    fused_optimizer,
    hold_run_folder,
)
from litgpt_vocagnolm.training.micro_batch import Guide
from litgpt_vocagnolm.training.slurm import StopRequest, exit_after_stop, keep_workers, stop_signal
from litgpt_vocagnolm.training.step import Loop, Step, format_metrics, log_step, run_steps, train_step
from litgpt_vocagnolm.training.student import check_resumed_model, resolve_model_config
from litgpt_vocagnolm.training.teacher import Teacher, TeacherArgs, teachers_of
from litgpt_vocagnolm.training.train_state import check_left_to_train, data_position


@dataclass
class Run:
    """One run's settings besides the argument groups, as `setup` resolved them (what `main` and `fit` read)."""

    out_dir: Path
    tokenizer_dir: Path | None
    initial_checkpoint_dir: Path | None
    resume: bool | Literal["auto"] | Path
    devices: int
    num_nodes: int
    seed: int
    optimizer: str | dict
    fsdp: FSDPArgs
    compile: bool
    overwrite: bool
    hparams: dict
    """`setup`'s arguments, written into every checkpoint as hyperparameters.yaml."""
    history: list[str]
    """The resumes that changed the run's shape, headed to hyperparameters.yaml (`checks.resume_history`)."""
    stop: StopRequest
    """Set by SIGUSR1, SIGINT or SIGTERM: stop after the current optimizer step (see `slurm.stop_signal`)."""
    checkpointer: Checkpointer | None = None
    """Writes and reads the sharded checkpoints of the state (`checkpoints.Checkpointer`), built by `main` once the
    state exists."""


def setup(
    model_name: str | None = None,
    model_config: Config | None = None,
    out_dir: Path = Path("out/vocagnolm"),
    precision: Literal["bf16-true", "bf16-mixed", "32-true", None] = None,
    initial_checkpoint_dir: Path | None = None,
    resume: bool | Literal["auto"] | Path = False,
    data: DataModule | None = None,
    train: TrainArgs = TrainArgs(
        save_interval=1000,
        log_interval=1,
        global_batch_size=1024,  # x 2048 tokens = 2M tokens per step, as in the paper
        micro_batch_size=4,
        max_tokens=int(15e9),  # OpenWebMath, once
        max_norm=1.0,
        min_lr=8e-6,
        lr_warmup_steps=100,
        tie_embeddings=False,
    ),
    eval: EvalArgs = EvalArgs(interval=1000, max_iters=100),
    log: LogArgs = LogArgs(),
    optimizer: str | dict = "AdamW",
    devices: int | str = "auto",
    num_nodes: int = 1,
    tokenizer_dir: Path | None = None,
    logger_name: LoggerChoice = "tensorboard",
    seed: int = 42,
    teacher: TeacherArgs = TeacherArgs(),
    guidance: GuidanceArgs = GuidanceArgs(),
    fsdp: FSDPArgs = FSDPArgs(),
    compile: bool = False,
    overwrite: bool = False,
) -> None:
    """Continually pretrain a student with VocAgnoLM: a frozen teacher with a different tokenizer picks the tokens
    worth learning.

    Arguments:
        model_name: The student architecture, a name from ``litgpt.config`` (e.g. "tiny-llama-1.1b"). Use "list" to
            list them. Typed on the command line, it replaces a ``--config``'s ``model_config`` (a line says so).
        model_config: The student as a ``litgpt.Config``: a YAML or JSON file of its fields (such as the
            model_config.yaml beside a checkpoint's lit_model.pth, as ``litgpt download`` writes it) or inline JSON.
            ``--model_config.KEY VALUE`` changes one field of the student, however it is given. Typed on the command
            line, it replaces a ``--config``'s ``model_name``; typed with ``--model_name``, it is refused.
        out_dir: Directory for checkpoints (``step-*/``, ``final/``) and logs.
        precision: Student precision. Default: "bf16-mixed" on GPU, "32-true" on CPU. On more than one device both
            bf16 settings are FSDP2's mixed precision: bf16 gathers and compute, float32 shards and AdamW state.
        initial_checkpoint_dir: The student checkpoint to continue pretraining from (e.g. TinyLlama). With
            ``resume="auto"`` it is used only while ``out_dir`` has no checkpoint yet. Typed on the command line
            without ``--model_name`` or ``--model_config``, its model_config.yaml is the student (as ``litgpt
            generate`` builds a checkpoint's model), over a ``--config``'s model where they differ.
        resume: A checkpoint directory to resume from (``out_dir/step-*``), ``True`` for the latest in ``out_dir``,
            or ``"auto"``: the latest if there is one (what a requeued Slurm job wants). ``True`` and ``"auto"`` skip,
            and report, a checkpoint that is incomplete or fails its checksums. A finished run's ``final`` is resumed
            too, when it is the latest: a larger ``--train.max_tokens`` trains on; the same one is refused. Any number
            of devices and nodes resumes a checkpoint (they are sharded, resharded on load).
        data: The prepared data: ``VocAgnoData`` (``--data VocAgnoData --data.path DIR``, see ``vocagnolm prepare``).
            Plain LitGPT data modules work for ``--guidance.method ce`` only.
        train: Training-related arguments. See ``litgpt.args.TrainArgs``.
        eval: Evaluation-related arguments. See ``litgpt.args.EvalArgs``.
        log: Logger-related arguments. See ``litgpt.args.LogArgs``.
        optimizer: An optimizer name (such as "AdamW") or config.
        devices: Devices (GPUs) per node, at least 1. Uses all GPUs by default.
        num_nodes: Number of nodes, at least 1.
        tokenizer_dir: The student's tokenizer directory (usually ``initial_checkpoint_dir``); copied into every
            checkpoint so that ``litgpt generate`` can use it.
        logger_name: Where to send metrics.
        seed: Random seed.
        teacher: The frozen teacher. See ``TeacherArgs``.
        guidance: The loss: VocAgnoLM or a baseline. See ``GuidanceArgs``.
        fsdp: Where each model lives on several devices (sharded, hybrid, replicated) and activation checkpointing.
            See ``FSDPArgs``.
        compile: ``torch.compile`` each transformer block of both models (worth it on GPUs; ~20 s of compilation on a
            CPU). Every step has the same shapes, so they compile once.
        overwrite: Start afresh in an ``out_dir`` that holds a previous run's checkpoints (``step-*``, ``final``),
            deleting them. Without it (and without ``resume``) such an ``out_dir`` is refused.
    """
    optimizer = check_optimizer(optimizer)  # as the run builds it, which hyperparameters.yaml records
    hparams = hyperparameters(locals())
    register()  # the paper's teachers that LitGPT lacks (llemma_7b, deepseek-math-7b-*, Mistral-7B-ProXMath)
    if model_name == "list":
        from litgpt.config import name_to_config

        print("Available values:\n" + "\n".join(sorted(name_to_config)))
        return
    check_run_args(train, eval, devices, num_nodes)
    check_seed(seed)
    check_writable(init_out_dir(out_dir), "--out_dir")  # a read-only one fails now, not at the first checkpoint
    check_out_dir_apart(init_out_dir(out_dir), data, teacher)
    config = resolve_model_config(model_name, model_config)
    devices = parse_devices(devices)
    check_start(
        config, "--model_config" if model_config else f"--model_name {model_name}", initial_checkpoint_dir, resume
    )
    check_setup(config, data, train, teacher, guidance, tokenizer_dir=tokenizer_dir, world_size=devices * num_nodes)
    seq_len = check_seq_len(config, data, train, "--model_config.block_size" if model_config is not None else None)
    check_budget(train, seq_len)  # at least one step: else an untrained final/

    precision = precision or ("bf16-mixed" if torch.cuda.is_available() else "32-true")
    out_dir = init_out_dir(out_dir)
    check_out_dir(out_dir, resume, overwrite)
    logger = run_logger(logger_name, out_dir, config, resume, log)
    strategy, precision = fabric_strategy(devices, num_nodes, precision, fsdp)
    fabric = L.Fabric(devices=devices, num_nodes=num_nodes, strategy=strategy, precision=precision, loggers=[logger])
    fabric.launch()

    fabric.print(pprint.pformat(hparams))
    if logger_name in ("tensorboard", "wandb", "mlflow"):
        fabric.logger.log_hyperparams(hparams)

    # Slurm's warning before the time limit, Ctrl-C, scancel or preemption: end the step, save it, exit.
    # One run per --out_dir: a second one into it is refused (a rank 0 that died holds nothing).
    with (
        hold_run_folder(fabric, out_dir, "litgpt pretrain --recipe vocagnolm"),
        stop_signal(out_dir, announce=fabric.global_rank == 0) as stop,
    ):
        run = Run(
            out_dir=out_dir,
            tokenizer_dir=tokenizer_dir,
            initial_checkpoint_dir=initial_checkpoint_dir,
            resume=resume,
            devices=devices,
            num_nodes=num_nodes,
            seed=seed,
            optimizer=optimizer,
            fsdp=fsdp,
            compile=compile,
            overwrite=overwrite,
            hparams=hparams,
            history=[],
            stop=stop,
        )
        main(fabric, config, data, run, train, eval, teacher, guidance)


def run_logger(
    logger_name: LoggerChoice, out_dir: Path, config: Config, resume: bool | Literal["auto"] | Path, log: LogArgs
):
    """The run's metrics logger, LitGPT's `choose_logger`; a logger whose package is missing is a user error."""
    with given_by("--logger_name", "Install the logger's package, or choose another (csv, tensorboard: here)."):
        return choose_logger(
            logger_name,
            out_dir,
            name=f"vocagnolm-{config.name}",
            resume=bool(resume),
            # The CSV logger writes its file when (step + 1) divides this, LitGPT counting steps from 0; the recipe
            # logs only on its log steps, at the optimizer step (from 1): every call writes.
            log_interval=1,
            log_args=asdict(log),
        )


def main(
    fabric: L.Fabric,
    config: Config,
    data: DataModule,
    run: Run,
    train: TrainArgs,
    eval: EvalArgs,
    teacher_args: TeacherArgs,
    guidance: GuidanceArgs,
) -> None:
    """The run, in its stages: the out_dir and where it resumes -> the student, the teachers, the optimizer -> the data
    -> the training state (weights loaded, initialised or resumed) -> `fit` -> the final checkpoint and the report."""
    prepare_out_dir(fabric, run, data, teacher_args)
    fabric.seed_everything(run.seed)  # the same seed on every rank: identical initialisation before sharding
    fabric.barrier()
    resume, position = resume_point(fabric, config, data, run, train)

    model = build_student(fabric, config, run, train)
    teachers = teachers_of(teacher_args, guidance.spec)  # one per prepared dataset, every batch through each
    load_teachers(fabric, teachers, run)
    optimizer = instantiate_torch_optimizer(run.optimizer, model.parameters(), fused=fused_optimizer(fabric.device))
    optimizer = fabric.setup_optimizers(optimizer)
    train_dataloader, val_dataloader = build_loaders(fabric, data, train, model, guidance, teachers, position)
    state = build_state(fabric, model, optimizer, train_dataloader, run, resume, position, train)
    initial_iter = state["iter_num"]

    train_t0 = time.perf_counter()
    vocab_size = data.manifest["student"]["vocab_size"] if isinstance(data, VocAgnoData) else None
    tables = []  # bytes per token id: the student's, each teacher's
    if guidance.compare == "byte":
        tables = [byte_table(run.tokenizer_dir, fabric.device), *(t.byte_table(fabric.device) for t in teachers)]
    guide = Guide.build(fabric, guidance, teachers, vocab_size, tables, seed=run.seed)
    stopped = fit(fabric, state, train_dataloader, val_dataloader, run, train, eval, guide)
    if stopped is not None:
        exit_after_stop(fabric, run.stop, stopped, state["step_count"])
    run.checkpointer.save_final()
    for logger in fabric.loggers:
        logger.finalize("success")  # whatever a logger still holds, written
    report_performance(fabric, train, state, initial_iter, time.perf_counter() - train_t0)


def prepare_out_dir(fabric: L.Fabric, run: Run, data: DataModule, teacher_args: TeacherArgs) -> None:
    """On rank 0: the out_dir made, a previous run's checkpoints deleted under --overwrite, and each tokenizer pair's
    line printed."""
    out_dir, tokenizer_dir = run.out_dir, run.tokenizer_dir
    if fabric.global_rank == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
        for path in previous_checkpoints(out_dir) if run.overwrite and not run.resume else []:
            fabric.print(f"--overwrite: deleting the previous run's {path}")
            shutil.rmtree(path)
        if isinstance(data, VocAgnoData) and tokenizer_dir is not None:
            for k, teacher_dir in enumerate(teacher_args.checkpoint_dirs or [None] * len(data.paths)):
                fabric.print(tokenizer_pair_summary(data, tokenizer_dir, teacher_dir, k))


def resume_point(
    fabric: L.Fabric, config: Config, data: DataModule, run: Run, train: TrainArgs
) -> tuple[Path | None, int]:
    """The checkpoint the run resumes from (None for a fresh start) and the blocks consumed over all ranks before it:
    where the data order continues. A change of the run's shape is refused, or carried out and said, here (before any
    model is built), and goes into `run.history`."""
    # Before any model: `auto` skips unreadable checkpoints.
    resume = find_resume_checkpoint(fabric, run.resume, run.out_dir)
    position = 0  # the blocks consumed over all ranks: where the data order continues
    if resume:  # a change of the run's shape: refused, or carried out and said (before any model is built)
        check_resumed_model(config, resume)
        max_seq_length = train.max_seq_length or config.block_size
        check_left_to_train(resume, run_steps(train, max_seq_length), train.global_batch_size * max_seq_length)
        run.history = resume_history(resume, run.hparams, fabric.world_size)
        for line in run.history:
            fabric.print(line)
        position = data_position(resume, train.global_batch_size, fabric.world_size, isinstance(data, VocAgnoData))
    return resume, position


def build_student(fabric: L.Fabric, config: Config, run: Run, train: TrainArgs) -> nn.Module:
    """The student, its blocks checkpointed and compiled as `run` asks, set up by Fabric (sharded on several
    devices); its weights are still the meta or empty ones (`build_state` loads or initialises them)."""
    t0 = time.perf_counter()
    model = new_model(fabric, config, train.tie_embeddings)
    if train.max_seq_length:
        model.max_seq_length = train.max_seq_length
    fabric.print(f"Time to instantiate model: {time.perf_counter() - t0:.02f} seconds.")
    fabric.print(f"Total parameters: {num_parameters(model):,}")
    if run.fsdp.activation_checkpointing:
        checkpoint_activations(model)  # before sharding, so that FSDP shards the wrapped blocks
    if run.compile:
        compile_blocks(model)
    return fabric.setup(model)


def load_teachers(fabric: L.Fabric, teachers: list[Teacher], run: Run) -> None:
    """Loads each teacher that runs online (frozen; compiled as `run` asks); a cached one loads nothing."""
    for teacher in [t for t in teachers if t.mode == "online"]:
        t0 = time.perf_counter()
        teacher_model = teacher.load(fabric)
        if run.compile:
            compile_blocks(teacher_model)
        fabric.print(
            f"Teacher {teacher.checkpoint_dir} ({num_parameters(teacher_model):,} parameters, frozen) loaded in"
            f" {time.perf_counter() - t0:.02f} seconds."
        )


def build_loaders(
    fabric: L.Fabric,
    data: DataModule,
    train: TrainArgs,
    model: nn.Module,
    guidance: GuidanceArgs,
    teachers: list[Teacher],
    position: int,
) -> tuple:
    """The training and validation loaders, set up by Fabric: `VocAgnoData`'s in one global order continued at
    `position`, a LitGPT data module's own otherwise."""
    if isinstance(data, VocAgnoData):
        data.connect(
            batch_size=train.micro_batch_size,
            max_seq_length=model.max_seq_length,
            num_chunks=guidance.num_chunks_if_chunked,
            teacher_caches=[t.cache for t in teachers if t.mode == "cached"] or None,
            teacher_block_size=min((t.model.max_seq_length for t in teachers if t.model), default=None),
        )
    else:
        data.connect(batch_size=train.micro_batch_size, max_seq_length=model.max_seq_length)
    with fabric.rank_zero_first():
        data.prepare_data()  # LitGPT's data modules download here; VocAgnoData's files were checked by `check_setup`
    data.setup()
    if isinstance(data, VocAgnoData):  # one global order from the seed, continued at `position` on any number of ranks
        loaders = (
            order.train_loader(data, position, fabric.global_rank, fabric.world_size),
            order.val_loader(data, fabric.global_rank, fabric.world_size),
        )
    else:  # a LitGPT data module's own loaders, dealt to ranks by Fabric's sampler or LitData
        loaders = (data.train_dataloader(), data.val_dataloader())
    loaders = [keep_workers(loader) for loader in loaders]  # they serve the step that a SIGTERM to every process ends
    return fabric.setup_dataloaders(*loaders, use_distributed_sampler=not isinstance(data, VocAgnoData))


def build_state(
    fabric: L.Fabric,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    train_dataloader,
    run: Run,
    resume: Path | None,
    position: int,
    train: TrainArgs,
) -> dict:
    """The training state with the student's weights loaded from the initial checkpoint, initialised, or resumed
    with the optimizer's from `resume`; `run.checkpointer` built over it."""
    stateful = hasattr(train_dataloader, "state_dict")  # LitData's: resumed on as many ranks (`data_position`)
    if run.initial_checkpoint_dir and not resume:
        load_weights(model, run.initial_checkpoint_dir / "lit_model.pth")
    elif not resume:  # from the seed and each parameter's name: the same weights on any number of processes
        initialize_weights(model, run.seed)

    # The teacher is not here: it is frozen, so it is reloaded on resume and never saved.
    state = {"model": model, "optimizer": optimizer, "iter_num": 0, "step_count": 0, "position": position}
    if stateful:  # the checkpoint keeps every rank's loader state
        state["train_dataloader"] = train_dataloader
    run.checkpointer = Checkpointer(fabric, state, run.out_dir, run.tokenizer_dir, run.hparams, run.history)
    run.checkpointer.check_room()  # before the first step, not at the first save
    if resume:
        fabric.print(f"Resuming training from {resume} after {position:,} blocks")
        run.checkpointer.load(resume)  # resharded for this run's number of processes
        # Saved after an optimizer step: the devices or the micro-batch may have changed how many micro-batches a step
        # has, not the step, the blocks it trains, the tokens trained or the schedule.
        state["iter_num"] = state["step_count"] * order.accumulation(
            train.global_batch_size, train.micro_batch_size, fabric.world_size
        )
    return state


def report_performance(fabric: L.Fabric, train: TrainArgs, state: dict, initial_iter: int, train_time: float) -> None:
    """The run's closing table: the tokens trained in all and by this run, its time and speed, the peak memory."""
    tokens_per_iter = train.micro_batch_size * state["model"].max_seq_length * fabric.world_size
    total_tokens = state["iter_num"] * tokens_per_iter
    run_tokens = (state["iter_num"] - initial_iter) * tokens_per_iter  # a resumed run's own, for its speed
    separator = "-" * 40
    fabric.print(separator)
    fabric.print("| Performance")
    fabric.print(f"| - Total tokens  : {total_tokens:,}")
    fabric.print(f"| - This run      : {run_tokens:,} tokens")
    fabric.print(f"| - Training Time : {train_time:.2f} s")
    fabric.print(f"| - Tok/sec       : {run_tokens / train_time:.2f} tok/s")
    if fabric.device.type == "cuda":
        fabric.print(f"| - Memory Used   : {torch.cuda.max_memory_allocated() / 1e9:.2f} GB")
    fabric.print(separator)


def fit(
    fabric: L.Fabric,
    state: dict,
    train_dataloader,
    val_dataloader,
    run: Run,
    train: TrainArgs,
    eval: EvalArgs,
    guide: Guide,
) -> Path | None:
    """The training loop: an optimizer step (`step.train_step`), then what follows it (`after_step`). Returns the
    checkpoint of the step where it stopped early on `run.stop` (set by a signal), None once the run's budget is
    trained: every rank stops at the end of the same optimizer step."""
    model, optimizer = state["model"], state["optimizer"]
    if eval.initial_validation:
        val_metrics = validate(fabric, model, val_dataloader, max_iters=eval.max_iters)
        fabric.print(f"Initial validation | {format_metrics(val_metrics)}")
    else:
        fabric.print("Verifying settings ...")
        validate(fabric, model, val_dataloader, max_iters=2)  # sanity check

    loop = Loop.start(fabric, state, train_dataloader, train, guide)
    while state["step_count"] < loop.max_steps:  # no batch read past the budget: a resumed run starts with the next
        lr = get_lr(optimizer.defaults["lr"], state["step_count"] + 1, loop.warmup_steps, loop.max_steps, train.min_lr)
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr
        step = train_step(fabric, state, loop.batches, guide, train, stop=run.stop, teacher_timer=loop.teacher_timer)
        stopped = after_step(fabric, state, step, loop, val_dataloader, run, train, eval)
        if stopped is not None:
            return stopped

    if eval.final_validation:
        val_metrics = validate(fabric, model, val_dataloader, max_iters=eval.max_iters)
        fabric.log_dict(val_metrics, step=state["step_count"])
        fabric.print(f"Final evaluation | {format_metrics(val_metrics)}")
    return None


def after_step(
    fabric: L.Fabric,
    state: dict,
    step: Step,
    loop: Loop,
    val_dataloader,
    run: Run,
    train: TrainArgs,
    eval: EvalArgs,
) -> Path | None:
    """What follows an optimizer step: the log line, validation, checkpoints and the stop signal. Whether the norms
    were finite and whether a rank was asked to stop are read (a host sync) on log steps and before checkpoints only
    (the stop then comes at the next of those: every 10 steps in the paper's recipes). Returns the checkpoint of the
    step when the run stops here (saved, complete), else None."""
    loop.finite &= step.finite
    loop.faults |= step.faults
    loop.step_time += step.seconds
    step_count = state["step_count"]
    logs = step_count % train.log_interval == 0
    saves = train.save_interval is not None and step_count % train.save_interval == 0
    stopping = False
    if logs or saves:
        check_finite(loop.finite, step_count, run.out_dir)
        loop.check_guidance(step_count)
        stopping = step.totals[2].item() > 0
    if logs:
        log_step(fabric, state, step, loop)
    if stopping:
        return run.checkpointer.save(step_count)  # complete before exit

    if val_dataloader is not None and step_count % eval.interval == 0:
        t0 = time.perf_counter()
        loop.val_metrics = validate(fabric, state["model"], val_dataloader, max_iters=eval.max_iters)
        fabric.print(
            f"iter {state['iter_num']}: {format_metrics(loop.val_metrics)}, val time:"
            f" {(time.perf_counter() - t0) * 1000:.2f} ms"
        )
        fabric.log_dict(loop.val_metrics, step=step_count)
        fabric.barrier()

    run.checkpointer.poll()  # a background save that every rank has written: make it the latest
    if saves:
        run.checkpointer.save(step_count, blocking=False)
    return None


@torch.no_grad()
def validate(fabric: L.Fabric, model: nn.Module, val_dataloader, max_iters: int) -> dict[str, float]:
    """Student cross-entropy on every held-out token, and bits per byte (comparable across tokenizers), over the first
    `max_iters` micro-batches of each rank: sums of nats, tokens and bytes all-reduced, then divided.

    Every rank runs as many forwards (under FSDP each one gathers every layer from every rank): where the split's
    micro-batches do not divide evenly over the ranks (`order.val_loader`), a rank short of one runs an empty one,
    every target ignored, which adds no nats, tokens or bytes."""
    fabric.barrier()
    model.eval()
    sums = torch.zeros(3, device=fabric.device, dtype=torch.float64)  # nats, tokens, bytes
    most = fabric.all_reduce(torch.tensor(len(val_dataloader), device=fabric.device), reduce_op="max")
    batches = iter(val_dataloader)
    for _ in range(min(max_iters, int(most.item()))):
        batch = next(batches, None)
        if batch is None:  # (1, T) of padding, nothing to predict
            inputs = torch.zeros(1, model.max_seq_length, dtype=torch.long, device=fabric.device)
            batch = Batch(inputs, torch.full_like(inputs, IGNORE_INDEX), [])
        batch = Batch.of(batch)
        targets = batch.targets
        nats = model(batch.input_ids, targets=targets)  # (B, T) float32, no (B, T, V) logits
        num_bytes = torch.zeros((), device=fabric.device) if batch.num_bytes is None else batch.num_bytes.sum()
        sums += torch.stack([nats.sum().double(), (targets != IGNORE_INDEX).sum().double(), num_bytes.double()])
    sums = fabric.all_reduce(sums, reduce_op="sum")
    model.train()
    fabric.barrier()
    nats, tokens, num_bytes = sums.tolist()
    metrics = {"val_loss": nats / max(tokens, 1), "val_ppl": math.exp(min(nats / max(tokens, 1), 50))}
    if num_bytes > 0:
        metrics["val_bpb"] = bits_per_byte(nats, int(num_bytes))
    return metrics


def check_finite(finite: torch.Tensor, step: int, out_dir: Path) -> None:
    """Stops the run, in one line naming the checkpoint to resume from, when a gradient norm since the last check was
    not finite (a host sync: on log steps only)."""
    if not finite.item():
        latest = saved_checkpoints(out_dir)
        resume = f"--resume {latest[0][1]}" if latest else "a fresh start (no checkpoint was saved)"
        raise NotFinite(
            f"A gradient norm was not finite between the last log step and step {step}: the weights are no longer"
            f" finite. Run again from {resume} with a lower learning rate (the optimizer's lr) or another"
            " --train.max_norm."
        )
