"""`vocagnolm plan --measure true`: the recipe's own steps run here for a few steps, beside what the plan says.

On one device (the first GPU, else the CPU) it runs one GPU's share of the configured run: its micro-batch, its
micro-batches per optimizer step, the recipe's architectures, precision and `compile`. After WARMUP_STEPS optimizer
steps (compilation) it times TIMED_STEPS of each kind of work:
  online         the recipe's loop (`recipe.fit`) with the teacher in the step
  cached         the same loop with the teacher's losses in the batch (from `score-teacher`'s cache, else random)
  student only   the same loop for a method that loads no teacher (`ce`, `random`)
  scoring        `score-teacher`'s forward (`teacher.teacher_token_loss`), compiled as `score-teacher` compiles by
                 default, over micro-batch x window teacher tokens
  LitGPT's step  what `litgpt pretrain` runs per optimizer step for the same student (`litgpt_step`)
  save, load     `checkpoints.Checkpointer`'s blocking save (what a SIGUSR1 stop writes) and its load of the configured
                 step's student and AdamW state, in the file system of the recipe's out_dir
The models have the recipe's architectures: the student with random weights (or its `initial_checkpoint_dir`'s),
each teacher from its checkpoint when lit_model.pth is there, else with random weights. The batches come from the
prepared data when its manifest is there, else are random blocks of the same shapes. Nothing is downloaded.

The configured run's wall-clock time is projected from the measured optimizer step: the budget's steps (as
`recipe.fit` counts them) times the step, on the run's number of GPUs. Communication between GPUs is not measured
(one device); the plan's lower bound for it is printed beside.
"""

import contextlib
import copy
import ctypes
import dataclasses
import gc
import io
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import lightning as L
import torch
import torch.nn as nn
from lightning.fabric.utilities.throughput import get_available_flops
from litgpt.config import Config
from litgpt.utils import chunked_cross_entropy, instantiate_torch_optimizer

from litgpt_vocagnolm.data.prepared import MANIFEST, Batch, TeacherSide, VocAgnoData, byte_table
from litgpt_vocagnolm.data.teacher_cache import CACHE_MANIFEST
from litgpt_vocagnolm.models.gpt import frozen_model, initialize_weights, load_model, new_model
from litgpt_vocagnolm.models.weights import load_weights
from litgpt_vocagnolm.planning.device import device_hours, device_name, devices
from litgpt_vocagnolm.planning.flops import forward_flops, training_flops
from litgpt_vocagnolm.training.checkpoints import Checkpointer
from litgpt_vocagnolm.training.checks import optimizer_spec
from litgpt_vocagnolm.training.distributed import checkpoint_activations, compile_blocks, fused_optimizer
from litgpt_vocagnolm.training.micro_batch import Guide
from litgpt_vocagnolm.training.recipe import Run, fit
from litgpt_vocagnolm.training.score_teacher import compiles_by_default
from litgpt_vocagnolm.training.teacher import Teacher, precision_dtype, teacher_token_loss

GB = 1e9
TIMED_STEPS = 2  # optimizer steps timed per kind of work, after the warm-up
WARMUP_STEPS = 1  # one more when something compiles: its first step compiles, its second may still recompile once
LARGEST = 1024  # the largest micro-batch looked for (as `vocagnolm plan` looks)
LITGPT = "LitGPT's step"
# Slurm's warning before a job's time limit: `#SBATCH --signal=USR1@120` in the packaged slurm/vocagnolm.sbatch. The run
# then ends its optimizer step and saves (`slurm.stop_signal`).
SLURM_WARNING_S = 120
# The pace the plan expects: the share of the device's dense bf16 peak each step ran at on one H100 at micro-batch 8
# (docs/performance.md: `benchmarks/bench_mfu.py --device cuda --compile`), compiled and eager. A step of a
# method that loads no teacher is the cached step without the selection: planned at the cached step's pace.
H100_MFU = {
    ("online", True): 0.564,
    ("online", False): 0.426,
    ("cached", True): 0.475,
    ("cached", False): 0.317,
    ("student only", True): 0.475,
    ("student only", False): 0.317,
    ("scoring", True): 0.607,
    ("scoring", False): 0.487,
}


@dataclass
class Setting:
    """The run `vocagnolm plan` resolved from the recipe's command line, and its figures for this device."""

    args: Any
    """The recipe's arguments (`recipe.setup`'s, instantiated)."""
    student: Config
    teachers: list[Config]
    """The teachers' configs (one per `--teacher.checkpoint_dir`); empty when they are unknown."""
    online: bool
    """Whether the recipe runs its teachers in the step (else their losses come from caches, or it needs none)."""
    seq_len: int
    window: int
    accumulation: int
    """Micro-batches per optimizer step on each GPU of the run."""
    world_size: int
    gpu_memory: float
    """Bytes of memory per GPU that the largest micro-batch must fit."""
    planned: Callable[[str, int], float]
    """The plan's peak bytes for a kind of work at a micro-batch, on one device as measured here."""
    communication_s: float
    """The plan's lower bound of a step's communication time on the run's GPUs (`memory.communication_seconds`)."""


@dataclass
class Measured:
    work: str
    micro_batch: int
    seconds: float
    """Per optimizer step (per forward for scoring)."""
    tokens: int
    """Tokens per optimizer step (per forward for scoring): the student's, the teacher's for scoring."""
    flops: float
    peak: float
    """Bytes (`PeakMemory`)."""


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release(device: torch.device) -> None:
    """Frees what the last work left: its tensors, the compiled graphs, and the memory the allocators keep."""
    gc.collect()
    torch._dynamo.reset()  # each work compiles afresh, as a run does (and never meets dynamo's recompile limit)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    else:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)  # glibc keeps freed pages resident otherwise


class PeakMemory:
    """The most memory held at once since `reset`, beyond what was held when this was made (before a work's models
    are built). On CUDA the tensors (`torch.cuda.max_memory_allocated`, what the plan counts); on a CPU the process's
    resident memory (Linux's VmHWM, reset through /proc/self/clear_refs), the allocator's free pages included."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        release(device)
        self.base = torch.cuda.memory_allocated(device) if self.cuda else resident_bytes("VmRSS")

    def reset(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        else:
            with contextlib.suppress(OSError):  # elsewhere than Linux: the process's peak so far stays
                Path("/proc/self/clear_refs").write_text("5")

    def peak(self) -> float:
        held = torch.cuda.max_memory_allocated() if self.cuda else resident_bytes("VmHWM")
        return float(held - self.base)


def resident_bytes(field: str) -> int:
    """A memory figure of this process from /proc/self/status (VmRSS: now, VmHWM: the peak), in bytes; 0 where there
    is none."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    return 0


class Stamped:
    """`batches` over and over (the loop that takes them stops itself). Taking batch number `at` (the first of the
    timed steps) waits for the device, resets the memory peak and starts the clock (`start`)."""

    def __init__(self, batches: Iterable, at: int, memory: PeakMemory, device: torch.device) -> None:
        self.batches, self.at, self.memory, self.device = batches, at, memory, device
        self.start = 0.0

    def __iter__(self) -> Iterator:
        taken = 0
        while True:
            for batch in self.batches:
                if taken == self.at:
                    synchronize(self.device)
                    self.memory.reset()
                    self.start = time.perf_counter()
                taken += 1
                yield batch

    def seconds_since_start(self) -> float:
        synchronize(self.device)
        return time.perf_counter() - self.start


def random_losses(side: TeacherSide) -> torch.Tensor:
    """Teacher losses (B, M) float32 as a cache gives them: NaN on each window's first token and on padding."""
    loss = torch.rand(side.valid.shape, device=side.valid.device) * 4
    loss[:, 0] = float("nan")
    return loss.masked_fill(~side.valid, float("nan"))


def with_random_losses(batch: Batch) -> Batch:
    """The batch with random teacher losses on each teacher side (`random_losses`)."""
    return batch._replace(teachers=[side._replace(loss=random_losses(side)) for side in batch.teachers])


def synthetic_batch(setting: Setting, micro_batch: int, losses: bool) -> Batch:
    """A batch of `data.VocAgnoData`'s shapes with random tokens: student token t maps to position t * M // T of each
    teacher's window (M = the plan's window); with `losses`, random teacher losses (`random_losses`)."""
    B, T, M = micro_batch, setting.seq_len, setting.window
    position = torch.arange(T) * M // T  # (T,)
    ranges = torch.stack([position, position + 1], dim=-1).expand(B, T, 2).contiguous()  # (B, T, 2)

    def side(vocab_size: int) -> TeacherSide:
        side = TeacherSide(torch.randint(0, vocab_size, (B, M)), torch.ones(B, M, dtype=torch.bool), ranges)
        return side._replace(loss=random_losses(side)) if losses else side

    vocabs = [t.vocab_size for t in setting.teachers] or [1] * teacher_sides(setting)  # unknown teachers' ids: unread
    input_ids = torch.randint(0, setting.student.vocab_size, (B, T))
    targets = torch.randint(0, setting.student.vocab_size, (B, T))
    return Batch(input_ids, targets, [side(v) for v in vocabs])


class WithRandomLosses:
    """A loader's batches with random teacher losses added to each teacher side (`random_losses`)."""

    def __init__(self, batches: Iterable[Batch]) -> None:
        self.batches = batches

    def __iter__(self) -> Iterator[Batch]:
        for batch in self.batches:
            yield with_random_losses(batch)


def teacher_sides(setting: Setting) -> int:
    """The teacher sides of `setting`'s batches: one per prepared dataset, else per teacher or cache, at least one."""
    data = prepared(setting)
    return len(data.paths) if data is not None else len(setting.teachers) or max(1, len(setting.args.teacher.caches))


def prepared(setting: Setting) -> VocAgnoData | None:
    """The recipe's prepared data when every manifest of it is there, else None."""
    data = setting.args.data
    if isinstance(data, VocAgnoData) and all((path / MANIFEST).is_file() for path in data.paths):
        return data
    return None


def batches(fabric: L.Fabric, setting: Setting, work: str, micro_batch: int) -> Iterable[Batch]:
    """The batches of `work`: the prepared data's, connected as `recipe.main` connects it (with the teachers' loss
    caches for the cached step when they are there, else random losses), or one synthetic batch."""
    data = prepared(setting)
    if data is None:
        return [synthetic_batch(setting, micro_batch, losses=work == "cached").to(fabric.device)]
    data, caches = copy.deepcopy(data), setting.args.teacher.caches
    cached = work == "cached" and bool(caches) and all((cache / CACHE_MANIFEST).is_file() for cache in caches)
    online = work == "online" and setting.teachers
    data.connect(
        batch_size=micro_batch,
        max_seq_length=setting.seq_len,
        num_chunks=setting.args.guidance.num_chunks_if_chunked,
        teacher_caches=caches if cached else None,
        teacher_block_size=min(t.block_size for t in setting.teachers) if online else None,
    )
    data.setup()
    loader = fabric.setup_dataloaders(data.train_dataloader())
    return WithRandomLosses(loader) if work == "cached" and not cached else loader


def student_model(fabric: L.Fabric, setting: Setting) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The student and its optimizer, built as `recipe.main` builds them on one device."""
    args, config = setting.args, setting.student
    model = new_model(fabric, config, args.train.tie_embeddings)
    model.max_seq_length = setting.seq_len
    if args.fsdp.activation_checkpointing:
        checkpoint_activations(model)
    if args.compile:
        compile_blocks(model)
    model = fabric.setup(model)
    optimizer = instantiate_torch_optimizer(
        optimizer_spec(args.optimizer), model.parameters(), fused=fused_optimizer(fabric.device)
    )
    initial = args.initial_checkpoint_dir
    if initial is not None and (Path(initial) / "lit_model.pth").is_file():
        load_weights(model, Path(initial) / "lit_model.pth")
    else:
        initialize_weights(model, args.seed)
    return model, fabric.setup_optimizers(optimizer)


def teacher_model(fabric: L.Fabric, config: Config, checkpoint_dir: Path, dtype: torch.dtype) -> nn.Module:
    """A frozen teacher as `gpt.load_model` gives it: from its checkpoint when lit_model.pth is there, else with
    random weights."""
    if (checkpoint_dir / "lit_model.pth").is_file():
        return load_model(checkpoint_dir, fabric, dtype)
    return fabric.setup_module(frozen_model(config, fabric, dtype, empty_init=False))


def warmup_steps(compiled: bool) -> int:
    return WARMUP_STEPS + compiled


def recipe_step(fabric: L.Fabric, setting: Setting, work: str, micro_batch: int, timed: int = TIMED_STEPS) -> tuple:
    """Runs the recipe's loop (`recipe.fit`) for the warm-up and `timed` optimizer steps of `work` ("online",
    "cached" or "student only") at `micro_batch`. Returns the `Measured` step and what a checkpoint needs: the
    training state."""
    args, device = setting.args, fabric.device
    memory = PeakMemory(device)
    model, optimizer = student_model(fabric, setting)
    teachers = []  # the recipe's (`teacher.teachers_of`), in the mode of `work`
    if work == "online":
        dtype = precision_dtype(args.teacher.precision, device)
        for config, checkpoint_dir in zip(setting.teachers, args.teacher.checkpoint_dirs, strict=True):
            teachers.append(
                Teacher(checkpoint_dir, mode="online", model=teacher_model(fabric, config, checkpoint_dir, dtype))
            )
            if args.compile:
                compile_blocks(teachers[-1].model)
    elif work == "cached":
        teachers = [Teacher(mode="cached") for _ in range(teacher_sides(setting))]
    A, B, T = setting.accumulation, micro_batch, setting.seq_len
    warmup = warmup_steps(args.compile)
    # One GPU's share of the run: A micro-batches per optimizer step; the budget and the schedule cover these steps.
    train = dataclasses.replace(
        args.train,
        micro_batch_size=B,
        global_batch_size=A * B,
        max_steps=warmup + timed,
        max_tokens=(warmup + timed) * A * B * T,
        save_interval=None,
        lr_warmup_steps=None,
        lr_warmup_fraction=None,
    )
    eval = dataclasses.replace(args.eval, interval=1 << 30, initial_validation=False, final_validation=False)
    state = {"model": model, "optimizer": optimizer, "iter_num": 0, "step_count": 0, "position": 0}
    run = Run(
        out_dir=args.out_dir,
        tokenizer_dir=args.tokenizer_dir,
        initial_checkpoint_dir=None,
        resume=False,
        devices=1,
        num_nodes=1,
        seed=args.seed,
        optimizer=args.optimizer,
        fsdp=args.fsdp,
        compile=args.compile,
        overwrite=False,
        hparams={},
        history=[],
        stop=threading.Event(),
        checkpointer=Checkpointer(fabric, state, args.out_dir, args.tokenizer_dir, {}),  # saves none: no save_interval
    )
    data = prepared(setting)
    vocab_size = data.manifest["student"]["vocab_size"] if data is not None else None
    tables = ()
    if args.guidance.compare == "byte":
        tables = [byte_table(d, device) for d in (args.tokenizer_dir, *args.teacher.checkpoint_dirs)]
    stamped = Stamped(batches(fabric, setting, work, B), at=warmup * A, memory=memory, device=device)
    guide = Guide.build(fabric, args.guidance, teachers, vocab_size, tables, seed=args.seed)
    with contextlib.redirect_stdout(io.StringIO()):  # its log lines: the table below says what they would
        fit(fabric, state, stamped, [], run, train, eval, guide)
    seconds = stamped.seconds_since_start() / timed
    flops = A * training_flops(setting.student, B, T)
    flops += A * sum(forward_flops(t, B, setting.window) for t in setting.teachers) if work == "online" else 0
    return Measured(work, B, seconds, A * B * T, flops, memory.peak()), state


def scoring(device: torch.device, setting: Setting, micro_batch: int) -> Measured:
    """`score-teacher`'s forward for the first teacher, as it runs it: a Fabric without a precision plugin, the
    teacher in its dtype, its blocks compiled where `score-teacher` compiles by default, `teacher_token_loss` under
    no_grad over `micro_batch` (its --batch_size) windows."""
    fabric = L.Fabric(accelerator=device.type, devices=1)
    memory = PeakMemory(device)
    config, checkpoint_dir = setting.teachers[0], setting.args.teacher.checkpoint_dirs[0]
    model = teacher_model(fabric, config, checkpoint_dir, precision_dtype(None, device))
    compiled = compiles_by_default(device)
    if compiled:
        compile_blocks(model)
    ids = torch.randint(0, config.vocab_size, (micro_batch, setting.window), device=device)
    valid = torch.ones_like(ids, dtype=torch.bool)
    warmup = warmup_steps(compiled)
    stamped = Stamped([(ids, valid)], at=warmup, memory=memory, device=device)
    taken = iter(stamped)
    for _ in range(warmup + TIMED_STEPS):
        with torch.no_grad():
            teacher_token_loss(model, *next(taken))
    seconds = stamped.seconds_since_start() / TIMED_STEPS
    return Measured(
        "scoring",
        micro_batch,
        seconds,
        micro_batch * setting.window,
        forward_flops(config, micro_batch, setting.window),
        memory.peak(),
    )


def litgpt_step(fabric: L.Fabric, setting: Setting, micro_batch: int) -> Measured:
    """What `litgpt pretrain` runs per optimizer step for the same student, from litgpt/pretrain.py (0.5.13) `main`
    and `fit`: LitGPT's own GPT, compiled whole (`torch.compile(model)`; on a CPU only where the recipe compiles:
    compiling takes minutes there), AdamW with the recipe's settings (fused on CUDA), the whole logits and
    `chunked_cross_entropy` per micro-batch, the gradients clipped, on the same batches as the cached step."""
    from litgpt.model import GPT as LitGPT

    args, device, config = setting.args, fabric.device, setting.student
    memory = PeakMemory(device)
    model = new_model(fabric, config, args.train.tie_embeddings, model_class=LitGPT)
    initialize_weights(model, args.seed)  # one device: the model is on it already
    model.max_seq_length = setting.seq_len
    compiled = device.type == "cuda" or args.compile
    # LitGPT's whole-model compile holds the head's product, not the loss (`chunked_cross_entropy` runs on the
    # logits outside), so no gather over rows x vocabulary is fused into one kernel (`distributed.compile_blocks`).
    model = fabric.setup(torch.compile(model) if compiled else model)
    optimizer = instantiate_torch_optimizer(
        optimizer_spec(args.optimizer), model.parameters(), fused=fused_optimizer(device)
    )
    optimizer = fabric.setup_optimizers(optimizer)
    A, warmup = setting.accumulation, warmup_steps(compiled)
    stamped = Stamped(batches(fabric, setting, "cached", micro_batch), at=warmup * A, memory=memory, device=device)
    taken = iter(stamped)
    for _ in range(warmup + TIMED_STEPS):
        for k in range(A):
            batch = next(taken)
            with fabric.no_backward_sync(model, enabled=k < A - 1):
                logits = model(batch.input_ids)
                loss = chunked_cross_entropy(logits, batch.targets)
                fabric.backward(loss / A)
        fabric.clip_gradients(model, optimizer, max_norm=args.train.max_norm)
        optimizer.step()
        optimizer.zero_grad()
    seconds = stamped.seconds_since_start() / TIMED_STEPS
    T = setting.seq_len
    return Measured(
        LITGPT, micro_batch, seconds, A * micro_batch * T, A * training_flops(config, micro_batch, T), memory.peak()
    )


def checkpoint_seconds(fabric: L.Fabric, state: dict, setting: Setting) -> tuple:
    """(save, load) seconds of `state` through the recipe's `Checkpointer`: the blocking save a SIGUSR1 stop writes,
    then the load a resume runs, in a temporary directory beside the recipe's out_dir (on its file system)."""
    parent = Path(setting.args.out_dir).absolute()
    while not parent.is_dir():
        parent = parent.parent
    with tempfile.TemporaryDirectory(prefix=".vocagnolm-plan-", dir=parent) as directory:
        checkpointer = Checkpointer(fabric, state, Path(directory), setting.args.tokenizer_dir, {})
        synchronize(fabric.device)
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):  # "Saving checkpoint to ..."
            checkpoint = checkpointer.save(0)
        t1 = time.perf_counter()
        checkpointer.load(checkpoint)
        synchronize(fabric.device)
        return t1 - t0, time.perf_counter() - t1


def largest_micro_batch(total: Callable[[int], float], budget: float) -> int:
    """The largest micro-batch up to LARGEST whose `total(micro_batch)` bytes fit `budget` (0: none), for a `total`
    that grows with the micro-batch: powers of two, then one by one up to the next."""
    largest = 0
    while largest < LARGEST and total(2 * largest or 1) <= budget:
        largest = 2 * largest or 1
    while 0 < largest < LARGEST and total(largest + 1) <= budget:
        largest += 1
    return largest


def budget_steps(setting: Setting) -> int:
    """Optimizer steps of the configured run's budget, counted as `recipe.fit` counts them."""
    train, A = setting.args.train, setting.accumulation
    tokens_per_iter = train.micro_batch_size * setting.seq_len
    max_iters = train.max_tokens // setting.world_size // tokens_per_iter if train.max_tokens else None
    if train.max_steps is not None:
        max_iters = min(max_iters or train.max_steps * A, train.max_steps * A)
    return (max_iters or 0) // A


def measure(setting: Setting) -> None:
    """Runs each kind of work of the configured recipe here (see the module's docstring) and prints what it measured
    beside the plan's figures, the configured budget's projected time, and the cached step's pace against LitGPT's
    own step for the same student."""
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    args, cuda = setting.args, device.type == "cuda"
    precision = args.precision or ("bf16-mixed" if cuda else "32-true")  # as `recipe.setup` chooses it
    fabric = L.Fabric(accelerator=device.type, devices=1, precision=precision, loggers=[])
    spec, B = args.guidance.spec, args.train.micro_batch_size
    configured = "online" if setting.online else "cached" if spec.needs_teacher else "student only"
    works = [configured]
    works += ["online"] if spec.needs_teacher and setting.teachers and configured != "online" else []
    works += ["cached"] if spec.needs_teacher and not spec.teacher_logits and configured != "cached" else []
    data = prepared(setting)
    source = f"from {data.path}" if data else "random, of the prepared shapes (no prepared data)"
    print(
        f"\nMeasured here, on one device, {device_name(device)}: one {'GPU' if cuda else 'process'}'s share of the"
        f" run ({setting.accumulation} x micro-batch {B} x {setting.seq_len} tokens per optimizer step), {precision},"
        f" compile {'on' if args.compile else 'off'}, {warmup_steps(args.compile)} warm-up and {TIMED_STEPS} timed"
        f" optimizer steps per work; batches {source}. Measuring ...",
        flush=True,
    )
    with warnings.catch_warnings():  # what a single process's run says of itself (DCP without a process group)
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        step, state = recipe_step(fabric, setting, configured, B)
        save_s, load_s = checkpoint_seconds(fabric, state, setting)
    del state
    other = B // 2 if B > 1 else 2  # a second micro-batch: how the peak grows with it
    results = [step, recipe_step(fabric, setting, configured, other, timed=1)[0]]
    results += [recipe_step(fabric, setting, work, B)[0] for work in works[1:]]
    results += [scoring(device, setting, B)] if setting.teachers else []
    results.append(litgpt_step(fabric, setting, B))
    release(device)
    report(setting, results, device, save_s, load_s)


def report(setting: Setting, results: list[Measured], device: torch.device, save_s: float, load_s: float) -> None:
    """Prints `measure`'s table and conclusions: `results` holds the configured step first, then the same at another
    micro-batch, the other works, and LitGPT's step last."""
    args, step, litgpt = setting.args, results[0], results[-1]
    peak_flops = get_available_flops(device, torch.bfloat16) if device.type == "cuda" else None
    print_measured(setting, results, device, peak_flops)
    print(
        f"Checkpoint of the student and its AdamW state (`Checkpointer`, on the file system of {args.out_dir}):"
        f" a blocking save {save_s:.2f} s, a load {load_s:.2f} s."
    )
    stop_s = step.seconds + save_s
    verdict = "in time" if stop_s <= SLURM_WARNING_S else "NOT in time: raise the lead of --signal"
    print(
        f"Slurm's warning comes {SLURM_WARNING_S} s before the time limit (slurm/vocagnolm.sbatch): the"
        f" step under way ({step.seconds:.2f} s) and the save take {stop_s:.2f} s of it, {verdict}."
    )
    other = results[1]
    sizes = (other.micro_batch, step.micro_batch)
    slope = (step.peak - other.peak) / (step.micro_batch - other.micro_batch)
    measured = largest_micro_batch(lambda b: step.peak + slope * (b - step.micro_batch), setting.gpu_memory)
    planned = largest_micro_batch(lambda b: setting.planned(step.work, b), setting.gpu_memory)
    print(
        f"Largest micro-batch that fits {setting.gpu_memory / GB:g} GB (--gpu_memory, the job's GPUs) at the peaks"
        f" measured here: planned {planned}, measured {measured} (the peaks at micro-batch {min(sizes)} and"
        f" {max(sizes)}, extrapolated linearly)."
    )
    print_projection(setting, step, peak_flops, device)
    reference = next((r for r in results if r.work == "cached"), step)  # else the configured step
    print(
        f"{reference.work.capitalize()} step / LitGPT's step, tokens/s at micro-batch {litgpt.micro_batch}:"
        f" {litgpt.seconds / reference.seconds:.2f}x (on a GPU at least 1.00x is expected: the same work plus a"
        " selection)."
    )


def print_measured(setting: Setting, results: list[Measured], device: torch.device, peak_flops: float | None) -> None:
    """Each work's peak memory, tokens/s and MFU, planned beside measured."""
    args = setting.args
    held = "torch.cuda.max_memory_allocated" if device.type == "cuda" else "the process's resident memory (a CPU)"
    print(
        f"Peak memory: {held}, beyond what was held before the work's models were built. Planned: the plan's"
        " estimate for this one device; tokens/s and MFU at the pace each work ran on one H100"
        " (docs/performance.md)."
    )
    print(f"  {'':<27} {'peak GB':^17}   {'tokens/s':^21}   {'MFU':^17}")
    print(
        f"  {'work':<14} {'micro-batch':>12} {'planned':>8} {'measured':>8}   {'planned':>10} {'measured':>10}"
        f"   {'planned':>8} {'measured':>8}"
    )
    for r in results:
        compiled = compiles_by_default(device) if r.work == "scoring" else args.compile
        share = H100_MFU.get((r.work, compiled))  # None for LitGPT's step: the plan has no figure for it
        planned_gb = f"{setting.planned(r.work, r.micro_batch) / GB:8.2f}" if r.work != LITGPT else f"{'n/a':>8}"
        planned_speed = f"{share * peak_flops / r.flops * r.tokens:10,.0f}" if share and peak_flops else f"{'n/a':>10}"
        planned_mfu = f"{share:8.1%}" if share else f"{'n/a':>8}"
        mfu = f"{r.flops / r.seconds / peak_flops:8.1%}" if peak_flops else f"{'n/a':>8}"
        print(
            f"  {r.work:<14} {r.micro_batch:>12} {planned_gb} {r.peak / GB:8.2f}   {planned_speed}"
            f" {r.tokens / r.seconds:10,.0f}   {planned_mfu} {mfu}"
        )


def print_projection(setting: Setting, step: Measured, peak_flops: float | None, device: torch.device) -> None:
    """The budget's wall-clock time and GPU-hours (CPU-hours on a CPU) at the configured `step`'s pace, planned and
    measured."""
    args, unit = setting.args, device_hours(device)
    steps, world = budget_steps(setting), setting.world_size
    share = H100_MFU[(step.work, args.compile)]
    if peak_flops:
        planned_s = step.flops / (share * peak_flops)
        projection = f"{steps:,} steps x {planned_s:.4f} s = {hours(steps * planned_s, world, unit)}"
    else:
        projection = "n/a (no bf16 peak is known for this device)"
    print(
        f"Projection of the budget ({step.work} steps on {devices(world, device)}): planned {projection}; measured"
        f" {steps:,} steps x {step.seconds:.4f} s = {hours(steps * step.seconds, world, unit)}. Communication between"
        f" devices is not in it: the plan's lower bound adds {setting.communication_s:.3f} s per step."
    )


def hours(wall: float, world: int, unit: str) -> str:
    """`wall` s wall-clock (in hours from an hour on), and its hours of `world` devices (`unit`: "GPU-hours")."""
    clock = f"{wall:,.1f} s" + (f" ({wall / 3600:,.2f} h)" if wall >= 3600 else "")
    return f"{clock} wall-clock, {wall / 3600 * world:,.2f} {unit}"
