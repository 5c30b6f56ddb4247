"""Tokens/s, MFU and peak memory of the recipe's three kinds of work, with the real configs and random weights.

For a user with a GPU: nothing is downloaded (the models are built from LitGPT's configs with random weights), and
for each micro-batch from 1 to `--max_micro_batch` (`vocagnolm plan` prints the largest that fits), with and without
`--compile`, it times
  online   a training step guided by the teacher online: the teacher's per-token losses, the student's forward and
           backward (`recipe.forward_and_loss`), AdamW;
  cached   the same step with the teacher's losses read from a cache (no teacher);
  scoring  `vocagnolm score-teacher`'s forward: `teacher_token_loss` over (micro-batch, window) teacher tokens.
MFU divides the FLOPs of the step (`flops.py`: tested equal to LitGPT's `measure_flops` for these configs; the
student's FLOPs only for the cached step, the student's and the teacher's for the online one) by the device's bf16
peak (`lightning.fabric.utilities.throughput.get_available_flops`); peak memory is set beside `plan.estimate_memory`.
Goals (issue 24): online >= 40%, cached >= 45%, scoring >= 50%.

    python benchmarks/bench_mfu.py --device cuda [--compile] [--max_micro_batch 8]
    python benchmarks/bench_mfu.py --device cpu --student pythia-14m --teacher pythia-31m --seq 128 --window 192
"""

import argparse
import time

import torch
from lightning.fabric.utilities.throughput import get_available_flops
from litgpt.config import Config

from litgpt_vocagnolm.distributed import compile_blocks
from litgpt_vocagnolm.flops import forward_flops, training_flops
from litgpt_vocagnolm.gpt import GPT
from litgpt_vocagnolm.methods import GuidanceArgs
from litgpt_vocagnolm.model_configs import register
from litgpt_vocagnolm.plan import GB, estimate_memory
from litgpt_vocagnolm.recipe import forward_and_loss
from litgpt_vocagnolm.teacher import teacher_token_loss


def random_batch(student: Config, teacher: Config, batch: int, seq: int, window: int, device) -> dict:
    """A batch of the loader's shapes (`data.VocAgnoData`) with random tokens; student token t covers teacher token
    t * window // seq."""
    position = torch.arange(seq, device=device) * window // seq  # (T,)
    ranges = torch.stack([position, position + 1], dim=-1).expand(batch, seq, 2)  # (B, T, 2)
    return {
        "input_ids": torch.randint(0, student.vocab_size, (batch, seq), device=device),
        "targets": torch.randint(0, student.vocab_size, (batch, seq), device=device),
        "teacher_ids": torch.randint(0, teacher.vocab_size, (batch, window), device=device),
        "teacher_valid": torch.ones(batch, window, dtype=torch.bool, device=device),
        "ranges": ranges.contiguous(),
    }


def timed(run, device: torch.device, steps: int) -> float:
    """Seconds per call of `run`, after two warm-up calls (compilation)."""
    for _ in range(2):
        run()
    synchronize = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        run()
    synchronize()
    return (time.perf_counter() - t0) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--student", default="tiny-llama-1.1b", help="a LitGPT config name (the recipe's student)")
    parser.add_argument("--teacher", default="Qwen2.5-Math-7B", help="a LitGPT config name (the recipe's teacher)")
    parser.add_argument("--seq", type=int, default=2048, help="student tokens per sequence")
    parser.add_argument("--window", type=int, default=2560, help="teacher window (the data's, padded to 64)")
    parser.add_argument("--max_micro_batch", type=int, default=8, help="the plan's largest micro-batch")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per measurement")
    parser.add_argument("--compile", action="store_true", help="also measure with each block compiled")
    args = parser.parse_args()
    register()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    student_config, teacher_config = Config.from_name(args.student), Config.from_name(args.teacher)
    peak = get_available_flops(device, torch.bfloat16) if cuda else None
    with torch.device(device):
        student = GPT(student_config)  # float32 weights, bf16 autocast: the recipe's bf16-mixed
        teacher = GPT(teacher_config).to(torch.bfloat16 if cuda else torch.float32).requires_grad_(False).eval()
    student.max_seq_length, teacher.max_seq_length = args.seq, args.window
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-5, fused=cuda)
    guidance = GuidanceArgs(method="vocagnolm", top_k=0.4)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda)
    print(f"{torch.cuda.get_device_name(device) if cuda else 'CPU'}; student {args.student}, teacher {args.teacher},"
          f" {args.seq} student tokens, teacher window {args.window};"
          f" bf16 peak {f'{peak / 1e12:.0f} TFLOP/s' if peak else 'unknown (no MFU)'}")  # fmt: skip
    print(f"{'work':<8} {'compile':>7} {'batch':>5} {'tokens/s':>10} {'MFU':>6} {'peak GB':>8} {'plan GB':>8}")
    for compiled in (False, True) if args.compile else (False,):
        if compiled:
            compile_blocks(student)
            compile_blocks(teacher)
        for B in sorted({1, *range(2, args.max_micro_batch + 1, 2), args.max_micro_batch}):
            # A run has one micro-batch size: each compiles afresh, as a run would, and the sweep never meets
            # dynamo's recompile limit (8 graphs per function; each size adds a few), which falls back to eager.
            torch._dynamo.reset()
            batch = random_batch(student_config, teacher_config, B, args.seq, args.window, device)
            cached = {**batch, "teacher_loss": torch.rand(B, args.window, device=device) * 4}

            def step(batch: dict, teachers: list) -> None:
                with autocast:
                    loss_sum, weight_sum, _ = forward_and_loss(student, teachers, batch, guidance)
                (loss_sum / weight_sum.clamp(min=1)).backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

            def scoring() -> None:
                with torch.no_grad():
                    teacher_token_loss(teacher, batch["teacher_ids"], batch["teacher_valid"])

            student_flops = training_flops(student_config, B, args.seq)
            teacher_flops = forward_flops(teacher_config, B, args.window)
            works = {
                "online": (lambda: step(batch, [teacher]), student_flops + teacher_flops, args.seq, True, True),
                "cached": (lambda: step(cached, []), student_flops, args.seq, True, False),
                "scoring": (scoring, teacher_flops, args.window, False, True),
            }
            for name, (run, flops, tokens, train, with_teacher) in works.items():
                if cuda:
                    torch.cuda.reset_peak_memory_stats(device)
                seconds = timed(run, device, args.steps)
                mfu = f"{flops / seconds / peak:6.1%}" if peak else f"{'n/a':>6}"
                used = f"{torch.cuda.max_memory_allocated(device) / GB:8.2f}" if cuda else f"{'n/a':>8}"
                plan = estimate_memory(student_config, teacher_config if with_teacher else None, micro_batch=B,
                                       seq_len=args.seq, window=args.window, train=train).total  # fmt: skip
                speed = B * tokens / seconds
                print(f"{name:<8} {str(compiled):>7} {B:>5} {speed:>10,.0f} {mfu} {used} {plan / GB:8.2f}")


if __name__ == "__main__":
    main()
