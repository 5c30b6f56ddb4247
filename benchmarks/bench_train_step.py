"""The training step with the teacher online, and with its losses read from a cache, next to plain cross-entropy.

One run on CPU with tiny models times the recipe's whole step (`micro_batch.forward_and_loss`, backward, the gradient
scaling and clipping `fit` does, AdamW step) for three variants over the same prepared batches:
  ce       the student alone (naive continual pretraining);
  online   `vocagnolm` with a frozen teacher, larger than the student, scoring its own tokens in every step;
  cached   `vocagnolm` reading the teacher's losses from a cache written by `score_teacher.score_teacher` (the
  batches carry
           "teacher_loss", as `VocAgnoData` gives them with `teacher_cache` set); no teacher in the step.
The variants alternate in rounds, so that other load on the machine hits all alike, and the medians count, in wall and
in CPU time of this process. Printed ratios:
  1. online / ce step time, beside the ratio the models' sizes predict: student step 6 N_s T tokens, teacher forward
     2 N_t M tokens (litgpt's `flops_per_param`, attention included; N counts the parameters of the matrix products,
     not the embedding table, whose lookup costs no FLOPs), and litgpt's `estimate_flops`, which counts every parameter;
  2. cached / ce (goal: <= 1.10x);
  3. the guided loss alone (forward + backward from the student's logits) as a share of the cached step, and the
     teacher's forward (with its per-token loss) as a share of the online step.
One torch thread by default (`--threads`): on a shared machine, OpenMP threads wait spinning at every barrier for a
partner that is descheduled, which swings wall and CPU time alike; use `--threads 2` on an idle machine.
Loading batches is not in the step (the loaders' workers do it, a teacher cache adds one slice per block there).

    python benchmarks/bench_train_step.py [--rounds 30] [--batch_size 2] [--max_seq_length 256] [--smoke]
"""

import argparse
import copy
import gzip
import os
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import lightning as L
import torch
from litgpt.config import Config
from litgpt.utils import estimate_flops, flops_per_param, num_parameters, save_config
from smoke import parse_args  # benchmarks/ is on sys.path when this file runs as a script

from litgpt_vocagnolm.data.prepare import prepare
from litgpt_vocagnolm.data.prepared import Batch, block_tokens, collate_blocks, load_manifest, open_split
from litgpt_vocagnolm.loss.cross_entropy import per_token_cross_entropy
from litgpt_vocagnolm.loss.methods import GuidanceArgs, GuidedLoss
from litgpt_vocagnolm.models.gpt import GPT, load_model
from litgpt_vocagnolm.models.model_configs import llama_config
from litgpt_vocagnolm.training.micro_batch import Guide, forward_and_loss, loss_inputs
from litgpt_vocagnolm.training.score_teacher import score_teacher
from litgpt_vocagnolm.training.stopwatch import Stopwatch
from litgpt_vocagnolm.training.teacher import Teacher, teacher_token_loss

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "data" / "gsm8k" / "train.jsonl"
TOKENIZERS = REPO / "tests" / "fixtures" / "tokenizers"
STUDENT_TOKENIZER = TOKENIZERS / "tinyllama-1.1b"
LABELS = {
    "ce": "step ce",
    "online": "step vocagnolm, teacher online",
    "cached": "step vocagnolm, teacher cached",
    "loss ce": "guided_loss ce alone (fwd + bwd)",
    "loss vocagnolm": "guided_loss vocagnolm alone (fwd + bwd)",
}


def tiny_config(name: str, vocab_size: int, n_layer: int, n_embd: int, block_size: int) -> Config:
    """A Llama-shaped model, heads of 64."""
    return llama_config(
        name,
        vocab_size,
        n_layer,
        n_embd,
        n_head=max(1, n_embd // 64),
        intermediate_size=4 * n_embd,
        block_size=block_size,
    )


def make_checkpoint(directory: Path, config: Config, tokenizer_dir: Path, seed: int) -> Path:
    """A LitGPT checkpoint directory as `litgpt download` leaves it: weights, config and the tokenizer's files."""
    directory.mkdir(parents=True)
    torch.manual_seed(seed)
    torch.save(GPT(config).state_dict(), directory / "lit_model.pth")
    save_config(config, directory)
    for file in tokenizer_dir.iterdir():
        if file.name == "tokenizer.json.gz":
            (directory / "tokenizer.json").write_bytes(gzip.decompress(file.read_bytes()))
        elif file.is_file():
            shutil.copy(file, directory)
    return directory


@contextmanager
def quiet(enabled: bool = True):
    """Sends what runs inside to /dev/null, workers' output and progress bars included (file descriptors 1 and 2)."""
    if not enabled:
        yield
        return
    sys.stdout.flush(), sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 1), os.dup2(devnull.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os.dup2(saved[0], 1), os.dup2(saved[1], 2)
            os.close(saved[0]), os.close(saved[1])


def prepared_pair(tmp: Path, args: argparse.Namespace) -> tuple[Path, Path, dict]:
    """The first `args.records` GSM8K records prepared for TinyLlama and the teacher's tokenizer, and a teacher
    checkpoint of `args.teacher_layers` x `args.teacher_embd` whose context holds a whole teacher window.

    Returns (data dir, teacher checkpoint dir, data manifest).
    """
    corpus = tmp / "corpus.jsonl"
    lines = CORPUS.read_text(encoding="utf-8").splitlines()[: args.records]
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    teacher_tokenizer = TOKENIZERS / args.teacher_tokenizer
    data = tmp / "data"
    with quiet(not args.verbose):
        prepare(
            student=STUDENT_TOKENIZER,
            teacher=teacher_tokenizer,
            input=[corpus],
            output=data,
            max_seq_length=args.max_seq_length,
            num_workers=1,
            text_key="question,answer",
            val_fraction=0.1,
        )
    manifest = load_manifest(data)
    vocab_size = manifest["teacher"]["vocab_size"]
    config = tiny_config("teacher", vocab_size, args.teacher_layers, args.teacher_embd, manifest["teacher_max_length"])
    teacher = make_checkpoint(tmp / "teacher", config, teacher_tokenizer, seed=1)
    return data, teacher, manifest


def scored_batches(data: Path, teacher: Path, manifest: dict, tmp: Path, batch_size: int, count: int) -> list[Batch]:
    """`count` training batches, each with the teacher's losses from a real cache (`score_teacher` on the data)."""
    cache = tmp / "cache"
    with quiet():
        score_teacher(data=data, teacher=teacher, output=cache, batch_size=8)
    dataset = open_split(data, "train", manifest, teacher_cache=cache)
    full = len(dataset) // batch_size  # full batches only: every step the same shape
    if full < count:
        raise SystemExit(f"The data holds {full} full batches of {batch_size}; use more --records or fewer --batches.")
    items = [dataset[i] for i in range(count * batch_size)]
    return [collate_blocks(items[i : i + batch_size], block_tokens(manifest)) for i in range(0, len(items), batch_size)]


def matmul_parameters(model: GPT) -> int:
    """Parameters used in matrix products: all but the embedding table (a lookup) and the norms' scales."""
    return sum(p.numel() for name, p in model.named_parameters() if p.dim() == 2 and "wte" not in name)


def train_step(fabric, model, optimizer, teacher, batch: Batch, guidance: GuidanceArgs, max_norm: float) -> float:
    """One optimizer step of `recipe.fit` (one micro-batch, one rank); returns the seconds spent in the teacher."""
    teacher_timer = Stopwatch(fabric.device)
    cached = [Teacher(mode="cached") for _ in batch.teachers]  # the batch's losses, from the cache
    guide = Guide([Teacher(mode="online", model=teacher)] if teacher is not None else cached, GuidedLoss(guidance))
    loss_sum, weight_sum, _ = forward_and_loss(model, guide, batch, teacher_timer=teacher_timer)
    fabric.backward(loss_sum)
    scale = 1 / weight_sum.clamp(min=1)  # what fit does with the all-reduced weight sum of the step
    for param in model.parameters():
        if param.grad is not None:
            param.grad.mul_(scale)
    fabric.clip_gradients(model, optimizer, max_norm=max_norm)
    optimizer.step()
    optimizer.zero_grad()
    return teacher_timer.seconds()


def median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30, help="timed rounds; each runs every variant once")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    parser.add_argument("--batch_size", type=int, default=2)
    parser.add_argument("--max_seq_length", type=int, default=256, help="student tokens per sequence")
    parser.add_argument("--batches", type=int, default=4, help="distinct batches, cycled through")
    parser.add_argument("--records", type=int, default=40, help="GSM8K records to prepare")
    parser.add_argument("--student_layers", type=int, default=2)
    parser.add_argument("--student_embd", type=int, default=128)
    parser.add_argument("--teacher_layers", type=int, default=4)
    parser.add_argument("--teacher_embd", type=int, default=256)
    parser.add_argument("--teacher_tokenizer", default="mistral-7b-v0.1", help="a folder of tests/fixtures/tokenizers")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (see the docstring)")
    parser.add_argument("--verbose", action="store_true", help="show what prepare prints")
    smoke = {
        "rounds": 1,
        "warmup": 0,
        "records": 10,
        "batches": 1,
        "max_seq_length": 64,
        "student_layers": 1,
        "student_embd": 64,
        "teacher_layers": 1,
        "teacher_embd": 64,
    }
    args = parse_args(parser, smoke)
    torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    fabric = L.Fabric(accelerator="cpu", devices=1, precision="32-true")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        data, teacher_dir, manifest = prepared_pair(tmp, args)
        batches = scored_batches(data, teacher_dir, manifest, tmp, args.batch_size, args.batches)
        teacher = load_model(teacher_dir, fabric, torch.float32)
        setup_seconds = time.perf_counter() - t0

    # The cache holds what the online teacher computes, to float16 rounding (losses of a few nats: 1e-2 is ~2 ulp).
    (first,) = batches[0].teachers
    with torch.no_grad():
        online = teacher_token_loss(teacher, first.ids, first.valid)
    torch.testing.assert_close(first.loss, online, atol=1e-2, rtol=1e-3, equal_nan=True)

    student_config = tiny_config(
        "student", manifest["student"]["vocab_size"], args.student_layers, args.student_embd, args.max_seq_length
    )
    base = GPT(student_config)
    variants = {  # name: (guidance, teacher, batches)
        "ce": (GuidanceArgs(method="ce"), None, batches),
        "online": (
            GuidanceArgs(),
            teacher,
            [b._replace(teachers=[s._replace(loss=None) for s in b.teachers]) for b in batches],
        ),
        "cached": (GuidanceArgs(), None, batches),
    }
    runners = {}
    for name, (guidance, teacher_model, variant_batches) in variants.items():
        model = fabric.setup(copy.deepcopy(base))
        optimizer = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=1e-4))
        runners[name] = (model, optimizer, guidance, teacher_model, variant_batches)

    # The loss alone: forward + backward of guided_loss from fixed student logits, as it runs inside the step.
    with torch.no_grad():
        logits_per_batch = [base(b.input_ids) for b in batches]

    def loss_alone(k: int, guidance: GuidanceArgs) -> None:
        logits = logits_per_batch[k].requires_grad_()
        batch = batches[k]
        ls = per_token_cross_entropy(logits, batch.targets)
        guided = GuidedLoss(guidance)
        loss_sum, _, _ = guided(ls, batch.targets != -100, loss_inputs(batch, guided, [batch.teachers[0].loss]))
        loss_sum.backward()
        logits.grad = None

    B, T = batches[0].input_ids.shape
    M = statistics.mean(b.teachers[0].ids.shape[1] for b in batches)  # padded width: what the teacher computes on
    M_valid = statistics.mean(b.teachers[0].valid.sum().item() / B for b in batches)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.2f}"
        f" (setup {setup_seconds:.0f} s)"
    )
    print(
        f"student {args.student_layers} x {args.student_embd} ({num_parameters(base):,} parameters,"
        f" {matmul_parameters(base):,} in matrix products), teacher {args.teacher_layers} x {args.teacher_embd}"
        f" ({num_parameters(teacher):,}, {matmul_parameters(teacher.module):,}; tokenizer {args.teacher_tokenizer});"
        f" batch {B} x {T} student tokens, teacher windows {M:.0f} wide ({M_valid:.0f} tokens on average)"
    )

    times = {(name, clock): [] for name in [*runners, "loss ce", "loss vocagnolm"] for clock in ("wall", "cpu")}
    teacher_share = []
    names = list(runners)
    for round_ in range(args.warmup + args.rounds):
        k = round_ % len(batches)
        timed = round_ >= args.warmup
        first = round_ % len(names)  # each variant takes each place in the order equally often
        for name in names[first:] + names[:first]:
            model, optimizer, guidance, teacher_model, variant_batches = runners[name]
            wall, cpu = time.perf_counter(), time.process_time()
            teacher_seconds = train_step(fabric, model, optimizer, teacher_model, variant_batches[k], guidance, 1.0)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            if timed:
                times[name, "wall"].append(wall)
                times[name, "cpu"].append(cpu)
                if name == "online":
                    teacher_share.append(teacher_seconds / wall)
        for method in ("ce", "vocagnolm") if round_ % 2 else ("vocagnolm", "ce"):
            wall, cpu = time.perf_counter(), time.process_time()
            loss_alone(k, GuidanceArgs(method=method))
            if timed:
                times[f"loss {method}", "wall"].append(time.perf_counter() - wall)
                times[f"loss {method}", "cpu"].append(time.process_time() - cpu)

    median = {key: median_ms(values) for key, values in times.items()}
    header = f"median of {args.rounds} rounds"
    print(f"{header:<40} {'wall ms':>9} {'cpu ms':>9} {'x ce wall':>10} {'x ce cpu':>9}")
    for name in dict.fromkeys(name for name, _ in times):
        wall, cpu = median[name, "wall"], median[name, "cpu"]
        label = LABELS[name]
        ratios = f"{wall / median['ce', 'wall']:9.2f}x {cpu / median['ce', 'cpu']:8.2f}x"
        print(f"{label:<40} {wall:9.1f} {cpu:9.1f} {ratios}")

    # Predicted FLOPs of one step: student forward + backward (3 x forward), teacher forward.
    student_flops = 3 * B * flops_per_param(T, student_config.n_layer, student_config.n_embd, matmul_parameters(base))
    config = teacher.module.config
    teacher_flops = B * flops_per_param(round(M), config.n_layer, config.n_embd, matmul_parameters(teacher.module))
    base.max_seq_length, teacher.module.max_seq_length = T, round(M)
    litgpt_ratio = 1 + estimate_flops(teacher.module, training=False) / estimate_flops(base, training=True)
    print(
        f"online / ce: {median['online', 'wall'] / median['ce', 'wall']:.2f}x wall,"
        f" {median['online', 'cpu'] / median['ce', 'cpu']:.2f}x cpu; predicted from FLOPs:"
        f" {(student_flops + teacher_flops) / student_flops:.2f}x (matrix-product parameters),"
        f" {litgpt_ratio:.2f}x (litgpt estimate_flops, all parameters)"
    )
    print(
        f"cached / ce: {median['cached', 'wall'] / median['ce', 'wall']:.2f}x wall,"
        f" {median['cached', 'cpu'] / median['ce', 'cpu']:.2f}x cpu (goal <= 1.10x)"
    )
    loss, ce_loss, step = median["loss vocagnolm", "wall"], median["loss ce", "wall"], median["ce", "wall"]
    print(
        f"guided_loss vocagnolm alone: {loss / median['cached', 'wall']:.1%} of the cached step ({ce_loss / step:.1%}"
        f" for ce's loss in the ce step); the selection (vocagnolm's loss minus ce's) {(loss - ce_loss) / step:+.1%}"
        " of a ce step"
    )
    print(
        f"guided_loss vocagnolm alone: {loss / median['online', 'wall']:.1%} of the online"
        f" step; the teacher's forward and per-token loss: {statistics.median(teacher_share):.1%} of it"
    )


if __name__ == "__main__":
    main()
