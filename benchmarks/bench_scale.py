"""The paper's models at their real sizes: peak memory per device, tokens/s and MFU of each kind of step, next to the
`vocagnolm plan` estimate, and (on CPU) next to the step as it was before the logits were tiled.

Student `tiny-llama-1.1b`; teachers the Table 1 teachers' LitGPT configs (Qwen2.5-Math-7B by default), random weights,
sequence 2048, `bf16-mixed` for the student and a bf16 teacher as on a GPU cluster. Each configuration (teacher,
micro-batch, activation checkpointing) runs these steps, each the recipe's own (`micro_batch.forward_and_loss`,
backward,
gradient scaling, clipping, AdamW), one optimizer step on one device:
  ce       the student alone (naive continual pretraining);
  online   `vocagnolm` with the teacher scoring its window in the same step;
  cached   `vocagnolm` reading the teacher's losses from a cache (`--teacher.cache`): no teacher in memory;
  score    `vocagnolm score-teacher`'s forward: the teacher's per-token losses over its windows, no student.
With `--whole_logits` (the default on CPU) ce, online and score also run as before the change: LitGPT's forward
returning the whole (B, T, V) logits (float32 under bf16-mixed) and the cross-entropy over them. `--accumulation 1,2`
also measures optimizer steps of two micro-batches (the gradients kept whole and unreduced until the last), and
`--processes 2` runs every step under FSDP2 over two processes (gloo on a CPU), both models sharded, bf16 as the recipe
does it (`MixedPrecisionPolicy`); the peak is rank 0's.

Peak memory is every tensor allocated at once on the device during the measured step, the models and optimizer state
included: `torch.cuda.max_memory_allocated` on a GPU, the allocation events of the PyTorch profiler on a CPU (the same
count: tensors, not the allocator's cache). The optimizer state is created by a first, tiny step, so the measured step
is a steady-state one. MFU counts 6 N_student FLOPs per student token and 2 N_teacher per teacher token (N: the
parameters of matrix products, head included, embedding table excluded; attention's T^2 work not counted), against the
device's dense bf16 peak (`--peak_tflops`; H100/H200 SXM 989, A100 312) or, on a CPU, this CPU's own bf16 matrix
product rate measured at start (so CPU MFU says how well the step uses the CPU, not what a GPU would do). CPU timings
are taken under the profiler (a few percent of overhead).

    python benchmarks/bench_scale.py                                   # CPU: full width and vocabulary, 4 + 1 layers
    python benchmarks/bench_scale.py --device cuda --micro_batch 1,2,4,8 --teachers all   # the full models on a GPU
    python benchmarks/bench_scale.py --accumulation 1,2 --processes 2 --micro_batch 1 --steps ce,online
    python benchmarks/bench_scale.py --smoke          # one layer of width 64 each, sequence 16, 32k-token teacher
"""

import argparse
import functools
import gc
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import torch
from lightning.fabric.strategies import ModelParallelStrategy
from litgpt.config import Config
from smoke import parse_args  # benchmarks/ is on sys.path when this file runs as a script
from torch.profiler import record_function

from litgpt_vocagnolm.alignment.lexical import encode
from litgpt_vocagnolm.alignment.tokenizer_files import load_tokenizer
from litgpt_vocagnolm.data.prepared import Batch, TeacherSide
from litgpt_vocagnolm.loss.cross_entropy import per_token_cross_entropy
from litgpt_vocagnolm.loss.methods import GuidanceArgs, GuidedLoss
from litgpt_vocagnolm.models.gpt import GPT
from litgpt_vocagnolm.models.model_configs import register
from litgpt_vocagnolm.planning.memory import StepShape, cpu_peak_bytes, estimate_memory, matmul_parameters
from litgpt_vocagnolm.training.distributed import FSDPArgs, checkpoint_activations, parallelize
from litgpt_vocagnolm.training.micro_batch import Guide, forward_and_loss, loss_inputs
from litgpt_vocagnolm.training.teacher import Teacher, teacher_token_loss

REPO = Path(__file__).resolve().parent.parent
TOKENIZERS = REPO / "tests" / "fixtures" / "tokenizers"
STUDENT = "tiny-llama-1.1b"
# Table 1's teachers: LitGPT config, and the tokenizer that sets their window (None: not shipped, one teacher token
# per student token assumed). Qwen2.5-Math-7B-Instruct has Qwen2.5-Math-7B's architecture.
TEACHERS = {
    "Qwen2.5-Math-7B": ("Qwen2.5-Math-7B", "qwen2.5"),
    "Llemma-7B": ("llemma_7b", "llemma-7b"),
    "Mistral-7B-ProXMath": ("Mistral-7B-ProXMath", "mistral-7b-v0.1"),
    "DeepSeekMath-7B": ("deepseek-math-7b-base", None),
}
PEAK_TFLOPS = {"H100 PCIe": 756.0, "H100": 989.4, "H200": 989.4, "A100": 312.0}  # dense bf16, by device name
MFU_TARGETS = {"online": 0.40, "cached": 0.45, "score": 0.50}  # on an H100, at the micro-batch the plan fits


@dataclass
class Setting:
    """One configuration: the models, the micro-batch and what each step keeps."""

    teacher: str
    student_config: Config
    teacher_config: Config
    micro_batch: int
    seq_len: int
    window: int
    """Teacher tokens per student sequence (M)."""
    activation_checkpointing: bool
    accumulation: int = 1
    """Micro-batches per optimizer step: all but the last without the gradients' reduction (`no_backward_sync`)."""


def model_config(name: str, n_layer: int | None, n_embd: int | None) -> Config:
    """LitGPT's config `name`, with `n_layer` layers and at width `n_embd` (heads of 64, one key-value group, an MLP 3x
    as wide) where given; its vocabulary in any case."""
    narrow = (
        dict(
            n_embd=n_embd,
            n_head=max(1, n_embd // 64),
            n_query_groups=1,
            head_size=min(64, n_embd),
            intermediate_size=3 * n_embd,
        )
        if n_embd
        else {}
    )
    return Config.from_name(name, **({"n_layer": n_layer} if n_layer else {}), **narrow)


def teacher_window(tokenizer: str | None, seq_len: int) -> tuple[int, float]:
    """(M, teacher tokens per student token) measured on the shipped math text, as `vocagnolm prepare` measures it."""
    if tokenizer is None:
        return seq_len + 1, 1.0
    lines = (REPO / "data" / "gsm8k" / "train.jsonl").read_text(encoding="utf-8").splitlines()[:500]
    text = "\n\n".join(lines)
    student = len(encode(load_tokenizer(TOKENIZERS / "tinyllama-1.1b"), text)[0])
    ratio = len(encode(load_tokenizer(TOKENIZERS / tokenizer), text)[0]) / student
    return round((seq_len + 1) * ratio), ratio


def make_batch(setting: Setting, device: torch.device, generator: torch.Generator) -> Batch:
    """Random token ids with what `VocAgnoData` gives: (B, T) inputs and targets, (B, M) teacher window, monotone
    ranges (each student token maps to 1 or 2 teacher tokens), and a random cached teacher loss."""
    B, T, M = setting.micro_batch, setting.seq_len, setting.window
    Vs, Vt = setting.student_config.vocab_size, setting.teacher_config.vocab_size
    starts = torch.linspace(1, M - 2, T).long()
    ranges = torch.stack([starts, starts + 1 + (torch.arange(T) % 2)], -1).clamp(max=M)
    input_ids = torch.randint(0, Vs, (B, T), generator=generator)
    targets = torch.randint(0, Vs, (B, T), generator=generator)
    side = TeacherSide(
        ids=torch.randint(0, Vt, (B, M), generator=generator),
        valid=torch.ones(B, M, dtype=torch.bool),
        ranges=ranges.expand(B, T, 2).contiguous(),
        loss=torch.rand(B, M, generator=generator) * 4,
    )
    return Batch(input_ids, targets, [side]).to(device)


def forward_and_loss_whole_logits(model, guide: Guide, batch: Batch):
    """The step before tiling: LitGPT's forward returns the whole (B, T, V) logits, float32 under bf16-mixed, for the
    student and the teacher alike, and the per-token cross-entropy reads them."""
    (side,) = batch.teachers
    teacher_loss = side.loss
    for teacher in guide.teachers if guide.teachers[:1] and guide.teachers[0].mode == "online" else []:
        with torch.no_grad():
            teacher_loss = teacher_token_loss_whole_logits(teacher.model, side.ids, side.valid)
    ls = per_token_cross_entropy(model(batch.input_ids), batch.targets)
    inputs = loss_inputs(batch, guide.loss, None if teacher_loss is None else [teacher_loss])
    return guide.loss(ls, batch.targets != -100, inputs)


def teacher_token_loss_whole_logits(teacher, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    targets = torch.nn.functional.pad(ids[:, 1:], (0, 1), value=-100)
    return per_token_cross_entropy(teacher(ids), targets)  # the whole (B, M, V) logits


def build(fabric: L.Fabric, setting: Setting, kind: str):
    """The student (with its optimizer) and the frozen bf16 teacher that `kind` needs, set up as the recipe does
    (on several processes built on the meta device, each process materialising its shards)."""
    student = optimizer = teacher = None
    if kind != "score":
        with fabric.init_module(empty_init=fabric.world_size > 1):
            student = GPT(setting.student_config)
        if setting.activation_checkpointing:
            checkpoint_activations(student)
        student = fabric.setup(student)
        fused = fabric.device.type == "cuda"
        optimizer = fabric.setup_optimizers(torch.optim.AdamW(student.parameters(), lr=1e-5, fused=fused))
    if kind in ("online", "score"):
        torch.set_default_dtype(torch.bfloat16)  # as `gpt.load_model` builds the teacher
        with fabric.init_module(empty_init=fabric.world_size > 1):
            teacher = GPT(setting.teacher_config)
        torch.set_default_dtype(torch.float32)
        teacher = fabric.setup_module(teacher.requires_grad_(False).eval())
    return student, optimizer, teacher


def forward_backward(student, teacher, batch: Batch, kind: str, whole_logits: bool, fabric) -> torch.Tensor | None:
    """One micro-batch as `recipe.fit` takes it (one rank): forward and backward; for "score" the teacher's losses.
    Returns the weight sum that divides the gradients (None for "score")."""
    (side,) = batch.teachers
    if kind == "score":
        with torch.no_grad():
            if whole_logits:
                teacher_token_loss_whole_logits(teacher, side.ids, side.valid)
            else:
                teacher_token_loss(teacher, side.ids, side.valid)
        return None
    guidance = GuidanceArgs(method="ce" if kind == "ce" else "vocagnolm")
    if kind != "cached":
        batch = batch._replace(teachers=[side._replace(loss=None)])
    run = forward_and_loss_whole_logits if whole_logits else forward_and_loss
    teachers = [Teacher(mode="online", model=teacher)] if teacher is not None else []
    teachers += [Teacher(mode="cached")] if kind == "cached" else []
    loss_sum, weight_sum, _ = run(student, Guide(teachers, GuidedLoss(guidance)), batch)
    fabric.backward(loss_sum)
    return weight_sum


def optimizer_step(fabric, student, optimizer, weight_sum: torch.Tensor) -> None:
    """The rest of `recipe.fit`'s optimizer step: gradients divided by the weight, clipping, AdamW."""
    for param in student.parameters():
        if param.grad is not None:
            param.grad.mul_(1 / weight_sum.clamp(min=1))
    fabric.clip_gradients(student, optimizer, max_norm=1.0)
    optimizer.step()
    optimizer.zero_grad()


def measure(fabric: L.Fabric, setting: Setting, kind: str, whole_logits: bool) -> tuple[int, int, float]:
    """Peak bytes allocated on the device during a steady-state step, and during its forward and backward alone (the
    optimizer step aside), and the seconds of that step."""
    generator = torch.Generator().manual_seed(0)
    tiny = Setting(**{**setting.__dict__, "micro_batch": 1, "seq_len": 8, "window": 8})
    cuda = fabric.device.type == "cuda"
    peaks = {}

    def step(batch: Batch, accumulation: int = 1) -> None:
        with record_function("forward and backward"):
            for k in range(accumulation):  # the same micro-batch each time: the same memory
                with fabric.no_backward_sync(student, enabled=k < accumulation - 1) if student else nullcontext():
                    weight_sum = forward_backward(student, teacher, batch, kind, whole_logits, fabric)
        if cuda:
            peaks["forward and backward"] = torch.cuda.max_memory_allocated()
        if weight_sum is not None:
            optimizer_step(fabric, student, optimizer, weight_sum)

    def run() -> float:
        nonlocal student, optimizer, teacher
        student, optimizer, teacher = build(fabric, setting, kind)
        step(make_batch(tiny, fabric.device, generator))  # creates the optimizer state: a steady-state step next
        batch = make_batch(setting, fabric.device, generator)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        with record_function("measured step"):
            step(batch, setting.accumulation)
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    student = optimizer = teacher = None
    if cuda:
        seconds = run()
        peak, fwd_bwd = torch.cuda.max_memory_allocated(), peaks["forward and backward"]
    else:  # from the first allocation on, so that the events sum to all that is alive during the step
        timings = []
        peak, fwd_bwd = cpu_peak_bytes(lambda: timings.append(run()), during=("measured step", "forward and backward"))
        (seconds,) = timings
    student = optimizer = teacher = None
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return peak, fwd_bwd, seconds


def flops_per_step(setting: Setting, kind: str) -> float:
    """6 N per student token trained, 2 N per teacher token scored (N: `memory.matmul_parameters`), over the step's
    micro-batches."""
    B, T, M = setting.micro_batch, setting.seq_len, setting.window
    student = 6 * matmul_parameters(setting.student_config) * B * T if kind != "score" else 0
    teacher = 2 * matmul_parameters(setting.teacher_config) * B * M if kind in ("online", "score") else 0
    return setting.accumulation * (student + teacher)


def cpu_bf16_flops(size: int) -> float:
    """This CPU's bf16 matrix-product rate, FLOP/s: the best of 5 products of two (size, size) matrices."""
    a, b = torch.randn(size, size, dtype=torch.bfloat16), torch.randn(size, size, dtype=torch.bfloat16)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * size**3 / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--teachers", default="Qwen2.5-Math-7B", help=f"comma-separated, or all: {', '.join(TEACHERS)}")
    parser.add_argument("--micro_batch", default=None, help="comma-separated; default 1,2 on CPU, 1,2,4,8 on a GPU")
    parser.add_argument("--seq_len", type=int, default=2048)
    parser.add_argument("--activation_checkpointing", default="off,on")
    parser.add_argument("--student_layers", type=int, default=None, help="default: 4 on CPU, all on a GPU")
    parser.add_argument("--teacher_layers", type=int, default=None, help="default: 1 on CPU, all on a GPU")
    parser.add_argument("--n_embd", type=int, default=None, help="both models' width (default: their own)")
    parser.add_argument("--whole_logits", default=None, help="also run the step before tiling; default on CPU only")
    parser.add_argument("--steps", default="ce,online,cached,score")
    parser.add_argument("--peak_tflops", type=float, default=None, help="the device's dense bf16 peak")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rate_size", type=int, default=2048, help="the matrices that measure a CPU's bf16 rate")
    parser.add_argument("--accumulation", default="1", help="micro-batches per optimizer step, comma-separated: 1,2")
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="processes (GPUs, or gloo processes on a CPU): FSDP2 over them, bf16 as the recipe does",
    )
    smoke = {
        "device": "cpu",
        "teachers": "Mistral-7B-ProXMath",
        "micro_batch": "1",
        "seq_len": 16,
        "student_layers": 1,
        "n_embd": 64,
        "activation_checkpointing": "off",
        "rate_size": 128,
    }
    args = parse_args(parser, smoke)
    cpu = args.device == "cpu"
    if args.threads:
        torch.set_num_threads(args.threads)
    register()
    teachers = list(TEACHERS) if args.teachers == "all" else args.teachers.split(",")
    micro_batches = [int(b) for b in (args.micro_batch or ("1,2" if cpu else "1,2,4,8")).split(",")]
    checkpointing = [{"off": False, "on": True}[a] for a in args.activation_checkpointing.split(",")]
    whole_logits = (args.whole_logits or ("on" if cpu else "off")) == "on"
    kinds = args.steps.split(",")

    if cpu:
        peak, device_name = cpu_bf16_flops(args.rate_size), "CPU (peak = its measured bf16 matrix-product rate)"
    else:
        device_name = torch.cuda.get_device_name()
        known = next((v for k, v in PEAK_TFLOPS.items() if k in device_name), None)
        peak = 1e12 * (args.peak_tflops or known or parser.error(f"--peak_tflops: unknown device {device_name}"))
    if args.processes > 1:  # as `recipe.setup`: FSDP2's bf16 (MixedPrecisionPolicy), Fabric's plugin at float32
        parallelize_fn = functools.partial(parallelize, fsdp=FSDPArgs(), num_nodes=1, param_dtype=torch.bfloat16)
        strategy = ModelParallelStrategy(parallelize_fn, data_parallel_size=args.processes, tensor_parallel_size=1)
        fabric = L.Fabric(accelerator=args.device, devices=args.processes, strategy=strategy, precision="32-true")
    else:
        fabric = L.Fabric(accelerator=args.device, devices=1, precision="bf16-mixed")
    fabric.launch()
    print = fabric.print  # rank 0's measurements
    accumulations = [int(a) for a in args.accumulation.split(",")]
    student_layers = args.student_layers or (4 if cpu else None)
    teacher_layers = args.teacher_layers or (1 if cpu else None)
    student_config = model_config(STUDENT, student_layers, args.n_embd)
    print(
        f"torch {torch.__version__}, {device_name}: {peak / 1e12:.2f} TFLOP/s bf16; {torch.get_num_threads()} threads;"
        f" {fabric.world_size} process(es), FSDP2 over them when more than one"
    )
    print("MFU targets on an H100: " + ", ".join(f"{kind} >= {target:.0%}" for kind, target in MFU_TARGETS.items()))
    print(
        f"student {STUDENT}: {student_config.n_layer} of 22 layers, width {student_config.n_embd}, vocabulary"
        f" {student_config.padded_vocab_size}; sequence {args.seq_len}; precision bf16-mixed, teacher bf16"
    )
    # peak GB: the whole step (optimizer included); fwd+bwd GB: its forward and backward alone, where logits live.
    header = (
        f"{'teacher':<20} {'B':>2} {'AC':>3} {'acc':>3} {'step':<22} {'peak GB':>8} {'plan GB':>8} {'plan/peak':>9}"
        f" {'fwd+bwd GB':>10} {'tokens/s':>9} {'MFU':>6}"
    )
    for name in teachers:
        config_name, tokenizer = TEACHERS[name]
        teacher_config = model_config(config_name, teacher_layers, args.n_embd)
        window, ratio = teacher_window(tokenizer, args.seq_len)
        print(
            f"\nteacher {name} ({config_name}): {teacher_config.n_layer} layers, width {teacher_config.n_embd},"
            f" vocabulary {teacher_config.padded_vocab_size}; window M = {window} ({ratio:.3f} teacher tokens per"
            " student token on the shipped math text)"
        )
        print(header)
        for checkpoint, accumulation in [(c, a) for c in checkpointing for a in accumulations]:
            for micro_batch in micro_batches:
                setting = Setting(
                    name, student_config, teacher_config, micro_batch, args.seq_len, window, checkpoint, accumulation
                )
                times = {}
                if not checkpoint:  # what the tiling leaves unallocated (as float32: bf16-mixed's module outputs)
                    student_logits = micro_batch * args.seq_len * student_config.padded_vocab_size * 4
                    teacher_logits = micro_batch * window * teacher_config.padded_vocab_size * 4
                    print(
                        f"{'':<20} {micro_batch:>2} whole float32 logits: student {student_logits / 1e9:.2f} GB,"
                        f" teacher {teacher_logits / 1e9:.2f} GB"
                    )
                for kind in kinds:
                    if kind == "score" and checkpoint:
                        continue  # the teacher keeps no activations: checkpointing changes nothing
                    plain = not checkpoint and accumulation == 1 and fabric.world_size == 1
                    variants = [False, True] if whole_logits and kind != "cached" and plain else [False]
                    for whole in variants:
                        measured, fwd_bwd, seconds = measure(fabric, setting, kind, whole)
                        # The plan estimates the step as the recipe takes it, not the step before tiling.
                        step = StepShape(
                            micro_batch,
                            args.seq_len,
                            window,
                            train=kind != "score",
                            activation_checkpointing=checkpoint,
                            fused_optimizer=not cpu,
                            world_size=fabric.world_size,
                            accumulation=accumulation if kind != "score" else 1,
                            workspace=False,
                        )
                        teachers = [teacher_config] if kind in ("online", "score") else []
                        estimate = None if whole else estimate_memory(student_config, teachers, step).total
                        plan = f"{estimate / 1e9:>8.2f} {estimate / measured:>9.2f}" if estimate else f"{'':>8} {'':>9}"
                        tokens = accumulation * micro_batch * (window if kind == "score" else args.seq_len)
                        label = kind + (" (whole logits)" if whole else "")
                        times[label] = seconds
                        print(
                            f"{name:<20} {micro_batch:>2} {'on' if checkpoint else 'off':>3} {accumulation:>3}"
                            f" {label:<22}"
                            f" {measured / 1e9:>8.2f} {plan} {fwd_bwd / 1e9:>10.2f} {tokens / seconds:>9,.0f}"
                            f" {flops_per_step(setting, kind) / seconds / peak:>6.1%}"
                        )
                if "ce" in times and "online" in times:
                    print(
                        f"{'':<20} {micro_batch:>2} online / ce step time: {times['online'] / times['ce']:.2f}x;"
                        f" cached / ce: {times.get('cached', float('nan')) / times['ce']:.2f}x"
                    )


if __name__ == "__main__":
    main()
