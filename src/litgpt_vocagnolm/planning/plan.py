"""`vocagnolm plan`: the per-GPU memory of a recipe's step before it goes to Slurm, and the largest micro-batch
that fits.

The command reads as its stages: the recipe's command line parsed and checked (`plan_parser`, `checked_seq_len`,
`teacher_configs`, `teacher_window`, `step_shape`), then the estimate (`memory.estimate_memory`) printed: the step's
peak by component (`print_step`), each layout's memory and traffic (`print_layouts`), the largest micro-batch and the
rest (`print_limits`); with `--measure true` the recipe's steps then run here (`measure_plan`).
"""

import dataclasses
import functools
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from litgpt.config import Config

from litgpt_vocagnolm.errors import InvalidArgument, at_least
from litgpt_vocagnolm.planning.device import gpus
from litgpt_vocagnolm.planning.memory import (
    GB,
    MemoryEstimate,
    StepShape,
    communication_seconds,
    estimate_memory,
    traffic_per_step,
)


def plan(args: list[str], prog: str = "vocagnolm plan", parser_class: type | None = None) -> None:
    """Per-GPU memory of a recipe's step and the largest micro-batch that fits, before submitting it.

    Takes the recipe's own command line (`--config` with a packaged recipe's name or a YAML's path, any override such
    as `--devices 8 --num_nodes 4` or `--train.micro_batch_size 16`) and three options of its own, `--gpu_memory`,
    `--window` and `--measure`. The student is the one the run would train, chosen as the recipe's command line
    chooses it (`student.choose_student`: what is typed wins over the recipe). The teacher's config comes from its
    checkpoint dir (or, before downloading, from the directory name, as LitGPT names configs); the teacher window from
    the prepared data's manifest when it exists.
    With `--measure true` the recipe's steps then run here for a few steps, and what they measure is printed beside
    the plan (`measure`).
    """
    from litgpt_vocagnolm.models.model_configs import register
    from litgpt_vocagnolm.training.student import resolve_model_config
    from litgpt_vocagnolm.training.teacher import teacher_mode

    register()
    parser = plan_parser(prog, parser_class)
    parsed = parser.parse_args(args)
    gpu_memory, window, measuring = parsed.pop("gpu_memory"), parsed.pop("window"), parsed.pop("measure")
    args = parser.instantiate_classes(parsed)
    student = resolve_model_config(args.model_name, args.model_config)
    T = checked_seq_len(args, student, gpu_memory)
    warn_prepared_length(args.data, T)
    online = teacher_mode(args.teacher, args.guidance.spec) == "online"  # `random` and `ce` load none
    teachers = teacher_configs(args.teacher.checkpoint_dirs)
    shape = step_shape(args, T, teacher_window(window, args.data, T, teachers))
    running = teachers if online else []
    kind = "teacher online" if online else ("teacher cached" if args.guidance.spec.needs_teacher else "no teacher")
    kind += f" ({', '.join(t.name for t in teachers)})" if online else ""
    recipe = " ".join(map(str, parsed.get("config") or ["The recipe"]))
    print_step(f"{recipe}: student {student.name}, {kind}", estimate_memory(student, running, shape), shape, gpu_memory)
    print_layouts(student, running, shape, gpu_memory, online)
    print_limits(student, teachers, online, shape, gpu_memory, args.train.global_batch_size)
    if measuring:
        measure_plan(args, student, teachers, online, shape, gpu_memory)


def checked_seq_len(args: Any, student: Config, gpu_memory: float) -> int:
    """The student tokens per sequence of the recipe's run (`recipe.setup`'s arguments, instantiated), after refusing
    what the plan cannot count: `--devices auto`, run arguments the recipe refuses, no GPU memory, sequences longer
    than the student's block, a budget of no step."""
    from litgpt_vocagnolm.training.checks import check_budget, check_run_args, check_seq_len

    if args.devices == "auto":
        raise InvalidArgument("--devices auto: say how many GPUs per node the job will have, e.g. --devices 8.")
    check_run_args(args.train, args.eval, args.devices, args.num_nodes)
    if not gpu_memory > 0:
        raise InvalidArgument(f"--gpu_memory must be above 0 GB, got {gpu_memory}.")
    T = check_seq_len(student, None, args.train, "--model_config.block_size" if args.model_config else None)
    check_budget(args.train, T)
    return T


def warn_prepared_length(data: Any, seq_len: int) -> None:
    """One line when the recipe's prepared data (its manifest's max_seq_length) holds blocks for another sequence
    length than the recipe's `seq_len`: the run would refuse it, after this plan for `seq_len`."""
    from litgpt_vocagnolm.data.prepared import VocAgnoData, load_manifest

    paths = data.paths if isinstance(data, VocAgnoData) else []
    prepared = [(p, load_manifest(p)["max_seq_length"]) for p in paths if (p / "manifest.json").is_file()]
    for path, length in prepared:
        if length != seq_len:
            print(
                f"Warning: {path} holds blocks for max_seq_length {length}, but this plan is for {seq_len} (the"
                f" recipe's): the run would refuse the data. Pass --train.max_seq_length {length}, or prepare again"
                f" with --max_seq_length {seq_len}."
            )
            return


def measure_plan(
    args: Any, student: Config, teachers: list[Config], online: bool, shape: StepShape, gpu_memory: float
) -> None:
    """`--measure true`: the recipe's steps run here (`measure`), set beside this plan's figures for one device."""
    from litgpt_vocagnolm.planning.measure import Setting, measure

    traffic = traffic_per_step(
        student,
        teachers if online else [],
        args.fsdp,
        devices=shape.world_size // shape.num_nodes,
        num_nodes=shape.num_nodes,
        accumulation=shape.accumulation,
    )
    measure(
        Setting(
            args=args,
            student=student,
            teachers=teachers,
            online=online,
            seq_len=shape.seq_len,
            window=shape.window,
            accumulation=shape.accumulation,
            world_size=shape.world_size,
            gpu_memory=gpu_memory * GB,
            planned=functools.partial(planned_here, student, teachers, shape),
            communication_s=communication_seconds(*traffic),
        )
    )


def plan_parser(prog: str, parser_class: type | None) -> Any:
    """The recipe's parser (`recipe.setup`'s) with `plan`'s own options: `--gpu_memory`, `--window`, `--measure`."""
    from jsonargparse import CLI, ArgumentParser, capture_parser

    from litgpt_vocagnolm.training.recipe import setup

    parser = capture_parser(lambda: CLI(setup, args=[], parser_class=parser_class or ArgumentParser))
    parser.prog = prog
    parser.description = plan.__doc__
    parser.add_argument("--gpu_memory", type=float, default=80.0, help="GB of memory per GPU, above 0 (H100: 80).")
    parser.add_argument(
        "--window",
        type=Optional[int],
        default=None,
        help="Teacher tokens per student sequence, from 1 to the teacher's block size (default: the"
        " prepared data's teacher_max_length rounded up to a multiple of 64, as training pads"
        " every window, else max_seq_length + 1).",
    )
    parser.add_argument(
        "--measure",
        type=bool,
        default=False,
        help="Then run the recipe's steps here (the first GPU, else the CPU) for a few steps after"
        " warm-up, and print what they measure beside the plan: peak memory, tokens/s, MFU, a"
        " checkpoint's save and load, the largest micro-batch that fits, the budget's"
        " wall-clock time and GPU-hours, and the pace of LitGPT's own step for the same"
        " student.",
    )
    return parser


def teacher_configs(checkpoint_dirs: Sequence[Path]) -> list[Config]:
    """Each teacher's config: its checkpoint dir's model_config.yaml, else (before downloading) its directory name."""
    from litgpt_vocagnolm.models.model_configs import config_named

    teachers = []
    for directory in checkpoint_dirs:
        found = directory / "model_config.yaml"
        by_name = f"--teacher.checkpoint_dir {directory} (no model_config.yaml there yet: its name)"
        teachers.append(Config.from_file(found) if found.is_file() else config_named(directory.name, by_name))
    return teachers


def teacher_window(window: int | None, data: Any, seq_len: int, teachers: Sequence[Config]) -> int:
    """`--window`, else the longest window of any teacher's prepared data (`data`, the recipe's), else
    `seq_len` + 1; refused when a teacher's block size is shorter."""
    from litgpt_vocagnolm.data.prepared import VocAgnoData, load_manifest, padded_window

    if window is None:  # the longest window of any teacher's prepared data
        paths = data.paths if isinstance(data, VocAgnoData) else []
        # padded as training pads it: one length per run, so that the compiled step has one shape
        prepared = [padded_window(load_manifest(p)) for p in paths if (p / "manifest.json").is_file()]
        window = max(prepared) if prepared else seq_len + 1
        unprepared = [p for p in paths if not (p / "manifest.json").is_file()]
        if unprepared and teachers:
            print(unprepared_note(unprepared, window, guessed=not prepared))
    at_least("--window", window, 1)
    for t in teachers:
        if window > t.block_size:
            raise InvalidArgument(
                f"The teacher window of {window} tokens is longer than {t.name}'s block size {t.block_size}: the run"
                f" would fail once both models are loaded. Give --window at most {t.block_size}, or prepare the data"
                f" with --teacher_max_length {t.block_size} or less."
            )
    return window


def unprepared_note(paths: Sequence[Path], window: int, guessed: bool) -> str:
    """The line that says which of the recipe's data `paths` hold no prepared data, and what the teacher `window` of
    the plan is then based on: max_seq_length + 1 (`guessed`), else the data that is prepared."""
    missing = "; ".join(f"{p} ({'no manifest.json' if p.is_dir() else 'no such folder'})" for p in paths)
    based_on = "max_seq_length + 1, a guess" if guessed else "that of the data that is prepared"
    return (
        f"Note: no prepared data at {missing}: the teacher window of {window} tokens is {based_on}, not the one"
        " `vocagnolm prepare` records (its teacher_max_length, padded to a multiple of 64). Give --data.path of the"
        " prepared data or --window, or plan again once the data is prepared."
    )


def step_shape(args: Any, seq_len: int, window: int) -> StepShape:
    """The recipe's configured step (`recipe.setup`'s arguments, instantiated) on the job's GPUs."""
    devices, num_nodes, B = int(args.devices), args.num_nodes, args.train.micro_batch_size
    world = devices * num_nodes
    accumulation = max(1, args.train.global_batch_size // (world * B)) if args.train.global_batch_size else 1
    return StepShape(
        B,
        seq_len,
        window,
        activation_checkpointing=args.fsdp.activation_checkpointing,
        world_size=world,
        num_nodes=num_nodes,
        layout=args.fsdp,
        accumulation=accumulation,
        compiled=args.compile,
    )


def print_step(run: str, step: MemoryEstimate, shape: StepShape, gpu_memory: float) -> None:
    """The run's line (`run`: the recipe, its student and teachers) and the step's peak per GPU, by component."""
    devices = shape.world_size // shape.num_nodes
    print(
        f"{run}; {gpus(shape.world_size)} ({shape.num_nodes} x {devices}), micro-batch {shape.micro_batch} x"
        f" {shape.seq_len} tokens, teacher window {shape.window}, activation checkpointing"
        f" {'on' if shape.activation_checkpointing else 'off'}, compile {'on' if shape.compiled else 'off'}"
    )
    print(f"Per GPU at the step's peak ({step.moment}):")
    for name, nbytes in step.components.items():
        print(f"  {name:<28} {nbytes / GB:8.2f} GB")
    verdict = "fits" if step.total <= gpu_memory * GB else "does NOT fit"
    print(f"  {'total':<28} {step.total / GB:8.2f} GB: {verdict} in {gpu_memory:g} GB")


def print_layouts(student: Config, running: list[Config], shape: StepShape, gpu_memory: float, online: bool) -> None:
    """Where each model lives: every layout's memory and traffic per GPU per optimizer step. The fastest is the one
    that fits with the least communication time (`communication_seconds`); the compute is the same in all of them.
    Without online teachers, the configured teacher layout only."""
    chosen = shape.layout
    print(
        f"Layouts (--fsdp.teacher, --fsdp.student), per GPU per optimizer step of {shape.accumulation} micro-batches:"
    )
    print(f"  {'teacher':<10} {'student':<8} {'memory GB':>9} {'node links GB':>13} {'network GB':>10} {'comm s':>7}")
    rows = []
    for teacher_layout in ("replicate", "node", "all") if online else (chosen.teacher,):
        for student_layout in ("full", "hybrid"):
            layout = dataclasses.replace(chosen, teacher=teacher_layout, student=student_layout)
            traffic = traffic_per_step(
                student,
                running,
                layout,
                devices=shape.world_size // shape.num_nodes,
                num_nodes=shape.num_nodes,
                accumulation=shape.accumulation,
            )
            memory = estimate_memory(student, running, dataclasses.replace(shape, layout=layout)).total
            rows.append((layout, memory, *traffic, communication_seconds(*traffic)))
    fitting = [row for row in rows if row[1] <= gpu_memory * GB]
    fastest = min(fitting, key=lambda row: row[4])[0] if fitting else None
    for layout, memory, node_links, network, seconds in rows:
        mark = " <- chosen" if layout == chosen else ""
        mark += " <- fastest that fits" if layout == fastest else ""
        print(
            f"  {layout.teacher:<10} {layout.student:<8} {memory / GB:9.2f} {node_links / GB:13.2f}"
            f" {network / GB:10.2f} {seconds:7.3f}{mark}"
        )


def print_limits(
    student: Config,
    teachers: list[Config],
    online: bool,
    shape: StepShape,
    gpu_memory: float,
    global_batch_size: int | None,
) -> None:
    """The largest micro-batch that fits, the whole logits the tiled head never allocates, `score-teacher`'s memory
    and how the global batch divides."""
    from litgpt_vocagnolm.planning.measure import largest_micro_batch

    running, B, T, window = teachers if online else [], shape.micro_batch, shape.seq_len, shape.window
    largest = largest_micro_batch(
        lambda micro_batch: (
            estimate_memory(student, running, dataclasses.replace(shape, micro_batch=micro_batch)).total
        ),
        gpu_memory * GB,
    )
    print(
        f"Largest micro-batch that fits {gpu_memory:g} GB: {largest or 'none'}"
        + ("" if largest else " (turn on --fsdp.activation_checkpointing, or use more GPUs)")
    )
    # What the tiled head and loss (`cross_entropy.linear_cross_entropy`) leave unallocated at this micro-batch.
    logits = B * T * student.padded_vocab_size
    whole = f"Whole logits, never allocated: the student's {logits * 4 / GB:.2f} GB (float32)"
    for t in running:
        logits = B * window * t.padded_vocab_size
        whole += f"; {t.name}'s {logits * 2 / GB:.2f} GB (bf16) and {logits * 4 / GB:.2f} GB more as bf16-mixed's"
        whole += " float32 copy"
    print(whole + ".")
    if teachers:  # score-teacher is data-parallel: the whole teacher on each GPU; one teacher at a time
        scoring = max(
            (estimate_memory(student, [t], StepShape(B, T, window, train=False)) for t in teachers),
            key=lambda e: e.total,
        )
        print(
            f"`vocagnolm score-teacher --batch_size {B}` (the whole teacher on each GPU): {scoring.total / GB:.2f} GB"
        )
    world, accumulation = shape.world_size, shape.accumulation
    if global_batch_size and accumulation * world * B != global_batch_size:
        print(f"Note: global batch {global_batch_size} is not a multiple of {gpus(world)} x micro-batch {B}.")
    elif global_batch_size:
        print(
            f"Global batch {global_batch_size} = {gpus(world)} x {B} x {accumulation} accumulation steps;"
            f" {global_batch_size * T:,} tokens per optimizer step."
        )


def planned_here(student: Config, teachers: list[Config], shape: StepShape, work: str, micro_batch: int) -> float:
    """The estimate for `work` ("scoring", "online", else the step without a teacher) on the one device `measure`
    runs it on, as it runs it there: the configured step's `shape` at `micro_batch`."""
    cuda = torch.cuda.is_available()
    if work == "scoring":  # `score-teacher`: the first teacher alone
        step = StepShape(micro_batch, shape.seq_len, shape.window, train=False, workspace=cuda)
        return estimate_memory(student, teachers[:1], step).total
    step = StepShape(
        micro_batch,
        shape.seq_len,
        shape.window,
        activation_checkpointing=shape.activation_checkpointing,
        accumulation=shape.accumulation,
        fused_optimizer=cuda,
        workspace=cuda,
        compiled=shape.compiled,
    )
    return estimate_memory(student, teachers if work == "online" else [], step).total
