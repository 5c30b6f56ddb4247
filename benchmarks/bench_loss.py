"""Teacher Guided Loss vs LitGPT's `chunked_cross_entropy` alone, the distillation baselines' cost, and the tiled
head's with a bias and a logit soft cap, on CPU.

Each row times forward + backward of ours and of the baseline side by side, interleaved, and prints the ratio of
medians (goal for the guided loss: <= 1.10x at B=2, T=2048, V=32000), in wall-clock and in process CPU time (steadier
when other processes share the cores). Teacher losses and ranges are given, as in training, where the teacher's
forward is separate. The head's rows time `linear_cross_entropy` (the head and the loss a tile of rows at a time)
with Phi-2's head bias, Gemma-2's final soft cap (30) or both against the plain tiled head, and the plain and the
capped and biased ones against the unfused head LitGPT runs (`F.linear`, `do_softcapping`, `chunked_cross_entropy`
over the whole logits), in float32.
Runs in a few minutes on 2 idle cores:

    python benchmarks/bench_loss.py [--seq_len 2048] [--vocab_size 32000] [--head_vocab_size 32000] [--smoke]
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from litgpt.model import do_softcapping
from litgpt.utils import chunked_cross_entropy
from smoke import parse_args  # benchmarks/ is on sys.path when this file runs as a script

from litgpt_vocagnolm.loss.cross_entropy import linear_cross_entropy, per_token_cross_entropy
from litgpt_vocagnolm.loss.methods import GuidanceArgs, GuidedLoss, LossInputs


def synthetic_alignment(B: int, T: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Ranges as a tokenizer pair gives them: most student tokens map to 1 teacher token, some to 2-3, a few to 0.

    Returns teacher loss (B, M), NaN at each row's first token and in the padding, and ranges (B, T, 2).
    """
    lengths = torch.multinomial(torch.tensor([0.05, 0.70, 0.20, 0.05]), B * T, replacement=True, generator=generator)
    end = lengths.view(B, T).cumsum(-1)
    ranges = torch.stack([end - lengths.view(B, T), end], -1)
    M = int(end[:, -1].max())
    teacher_loss = torch.rand(B, M, generator=generator) * 6
    teacher_loss[torch.arange(M) >= end[:, -1:]] = float("nan")
    teacher_loss[:, 0] = float("nan")
    return teacher_loss, ranges


def time_side_by_side(ours, baseline, repeats: int) -> dict[str, tuple[float, float]]:
    """Median wall and CPU seconds of (ours, baseline), alternating runs so that outside load hits both alike."""
    ours(), baseline()  # warm-up
    times = {(clock, name): [] for clock in ("wall", "cpu") for name in ("ours", "baseline")}
    for _ in range(repeats):
        for name, run in (("ours", ours), ("baseline", baseline)):
            wall, cpu = time.perf_counter(), time.process_time()
            run()
            times["wall", name].append(time.perf_counter() - wall)
            times["cpu", name].append(time.process_time() - cpu)
    median = {key: statistics.median(values) for key, values in times.items()}
    return {clock: (median[clock, "ours"], median[clock, "baseline"]) for clock in ("wall", "cpu")}


def saved_bytes(run) -> int:
    """Bytes autograd keeps for backward while `run` builds its graph."""
    total = 0

    def pack(tensor):
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return total


def report(name: str, timings: dict[str, tuple[float, float]], baseline_name: str = "chunked_cross_entropy") -> None:
    (ours, baseline), (ours_cpu, baseline_cpu) = timings["wall"], timings["cpu"]
    print(
        f"{name + ':':<44} {ours * 1e3:8.0f} ms  vs {baseline_name} {baseline * 1e3:7.0f} ms"
        f"  {ours / baseline:5.2f}x wall  {ours_cpu / baseline_cpu:5.2f}x cpu"
    )


def guided(
    args: GuidanceArgs,
    logits: torch.Tensor,
    targets: torch.Tensor,
    ranges: torch.Tensor,
    *,
    teacher_loss: torch.Tensor | None = None,
    teacher_logits: torch.Tensor | None = None,
    vocab_size: int | None = None,
):
    """The guided loss (`methods.GuidedLoss`) of one teacher from the student's logits, as
    `micro_batch.forward_and_loss` runs it."""
    ls = per_token_cross_entropy(logits, targets)
    inputs = LossInputs(None if teacher_loss is None else [teacher_loss], [ranges], logits, teacher_logits)
    return GuidedLoss(args, vocab_size=vocab_size)(ls, targets != -100, inputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch_size", type=int, default=2)
    parser.add_argument("--seq_len", type=int, default=2048)
    parser.add_argument("--vocab_size", type=int, default=32000, help="the student's (TinyLlama's)")
    parser.add_argument("--distill_seq_len", type=int, default=256, help="tokens of the distillation baselines' rows")
    parser.add_argument("--teacher_vocab_size", type=int, default=152064, help="ULD's teacher's (Qwen2.5's)")
    parser.add_argument("--head_rows", type=int, default=1024, help="tokens of the head's rows")
    parser.add_argument("--head_width", type=int, default=256, help="hidden width of the head's rows")
    parser.add_argument("--head_vocab_size", type=int, default=32000, help="the head's rows' (Gemma-2's: 256000)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each side, medians")
    smoke = {"seq_len": 128, "vocab_size": 512, "distill_seq_len": 16, "teacher_vocab_size": 1024, "repeats": 1}
    smoke |= {"head_rows": 64, "head_width": 16, "head_vocab_size": 512}
    args = parse_args(parser, smoke)
    generator = torch.Generator().manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; forward + backward, interleaved medians")

    B, T, V = args.batch_size, args.seq_len, args.vocab_size
    teacher_loss, ranges = synthetic_alignment(B, T, generator)
    targets = torch.randint(0, V, (B, T), generator=generator)
    print(f"B={B} T={T} V={V}, teacher M={teacher_loss.shape[1]}")
    for dtype in (torch.float32, torch.bfloat16):
        logits = torch.randn(B, T, V, generator=generator).to(dtype).requires_grad_()

        def baseline():
            logits.grad = None
            chunked_cross_entropy(logits, targets).backward()

        def step(guidance: GuidanceArgs):
            def run():
                logits.grad = None
                loss_sum, weight_sum, _ = guided(guidance, logits, targets, ranges, teacher_loss=teacher_loss)
                (loss_sum / weight_sum.clamp(min=1)).backward()

            return run

        settings = [GuidanceArgs(), GuidanceArgs(method="ce")]
        if dtype == torch.float32:
            settings.insert(1, GuidanceArgs(scope="sequence", aggregation="mean"))
        for setting in settings:
            label = f"guided_loss {setting.method} {setting.scope}/{setting.aggregation} {str(dtype)[6:]}"
            report(label, time_side_by_side(step(setting), baseline, args.repeats))
        if dtype == torch.bfloat16:
            setting = GuidanceArgs()
            ours = saved_bytes(lambda: guided(setting, logits, targets, ranges, teacher_loss=teacher_loss))
            theirs = saved_bytes(lambda: chunked_cross_entropy(logits, targets))
            print(
                f"saved for backward, bf16: guided_loss {ours / 2**20:.0f} MiB, chunked_cross_entropy"
                f" {theirs / 2**20:.0f} MiB (logits are {logits.numel() * 2 / 2**20:.0f} MiB)"
            )

    # The distillation baselines need the teacher's full logits; ULD sorts a 152k-word teacher vocabulary per token.
    B, T, Vt = 1, args.distill_seq_len, args.teacher_vocab_size
    targets = torch.randint(0, V, (B, T), generator=generator)
    logits = torch.randn(B, T, V, generator=generator).requires_grad_()
    print(f"B={B} T={T} V={V}, teacher vocabulary {Vt} (bf16 teacher logits)")

    def baseline():
        logits.grad = None
        chunked_cross_entropy(logits, targets).backward()

    # Student position i paired with teacher position i: the range of i starts at teacher token i + 1.
    pairs = torch.stack([torch.arange(1, T + 1), torch.arange(2, T + 2)], -1).expand(B, T, 2)

    def distill(guidance: GuidanceArgs, teacher_logits: torch.Tensor):
        def run():
            logits.grad = None
            loss_sum, weight_sum, _ = guided(
                guidance, logits, targets, pairs, teacher_logits=teacher_logits, vocab_size=V
            )
            (loss_sum / weight_sum).backward()

        return run

    same_vocab = torch.randn(B, T, V, generator=generator).bfloat16()
    kld = distill(GuidanceArgs(method="kld"), same_vocab)
    report("guided_loss kld (same vocabulary)", time_side_by_side(kld, baseline, args.repeats))
    other_vocab = (torch.randn(B, T, Vt, generator=generator) * 3).bfloat16()
    uld = distill(GuidanceArgs(method="uld"), other_vocab)
    report("guided_loss uld (other vocabulary)", time_side_by_side(uld, baseline, args.repeats))
    time_heads(args.head_rows, args.head_width, args.head_vocab_size, args.repeats, generator)


def time_heads(N: int, D: int, V: int, repeats: int, generator: torch.Generator) -> None:
    """The tiled head (`linear_cross_entropy`) with a bias, a soft cap or both against itself without, and the plain
    and the capped and biased ones against LitGPT's unfused head: forward + backward over N rows of width D and a
    vocabulary of V."""
    print(f"head: {N} rows x width {D} x vocabulary {V}, float32, soft cap 30")
    hidden = torch.randn(1, N, D, generator=generator).requires_grad_()
    weight = (torch.randn(V, D, generator=generator) / D**0.5).requires_grad_()
    bias = torch.randn(V, generator=generator).requires_grad_()
    targets = torch.randint(0, V, (1, N), generator=generator)

    def run(tiled: bool, biased: bool, softcap: float | None):
        def step():
            hidden.grad = weight.grad = bias.grad = None
            b = bias if biased else None
            if tiled:
                linear_cross_entropy(hidden, weight, targets, bias=b, softcap=softcap).sum().backward()
            else:  # LitGPT's `GPT.forward` head, then its loss over the whole logits
                logits = F.linear(hidden, weight, b)
                logits = logits if softcap is None else do_softcapping(logits, softcap)
                chunked_cross_entropy(logits, targets).backward()

        return step

    plain = run(True, False, None)
    for label, biased, softcap in (("biased", True, None), ("capped", False, 30.0), ("capped and biased", True, 30.0)):
        report(f"tiled head {label} / plain", time_side_by_side(run(True, biased, softcap), plain, repeats), "plain")
    for label, biased, softcap in (("plain", False, None), ("capped and biased", True, 30.0)):
        timings = time_side_by_side(run(True, biased, softcap), run(False, biased, softcap), repeats)
        report(f"tiled head {label} / unfused", timings, "unfused")


if __name__ == "__main__":
    main()
