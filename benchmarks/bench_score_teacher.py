"""`vocagnolm score-teacher` throughput next to bare teacher forwards over the same tokens, on CPU with tiny models.

One run prepares a small real corpus (GSM8K, TinyLlama student, a teacher tokenizer), makes a tiny teacher checkpoint
and, in alternating rounds, times
  score    `score_teacher.score_teacher` into a fresh directory: Fabric, teacher load, reading the prepared blocks,
  forward,
           per-token loss, the 16-bit cache files and manifest;
  forward  `model(ids)` under `torch.no_grad()` only, the same teacher weights, over exactly the batches that
           score_teacher forms (every block of both splits, `--batch_size` consecutive blocks of a shard, padded alike
           to one shape: `--batch_size` rows of the data's padded window), built before the clock starts.
Throughput is teacher tokens per second (the tokens of the windows, padding not counted, as score_teacher counts them).
Two ratios (goal: >= 0.95x): score's scoring loop alone (the time of its progress bars, which the benchmark
instruments: its input pipeline, loader workers included, and its writer thread) and score end to end (a fixed
start-up cost that a real corpus amortises). Medians of wall and process CPU time. Then where the loop's time goes
besides the forward: reading and padding the blocks, and `teacher_token_loss` (the transformer, then the head and
the loss a tile of rows at a time) in place of the forward.
One torch thread by default (`--threads`): on a shared machine, OpenMP threads wait spinning at every barrier for a
partner that is descheduled, which swings wall and CPU time alike, and hits most the many small operations of the
per-token loss (seen with 2 threads on 2 busy cores: 0.41x, against 0.85x with one thread minutes later).

    python benchmarks/bench_score_teacher.py [--rounds 5] [--records 40] [--batch_size 8] [--smoke]
"""

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from bench_train_step import prepared_pair, quiet  # benchmarks/ is on sys.path when this file runs as a script
from litgpt.config import Config
from smoke import parse_args
from torch import Tensor
from tqdm import tqdm

import litgpt_vocagnolm.training.score_teacher as score_module
from litgpt_vocagnolm.data.prepared import open_split, padded_window
from litgpt_vocagnolm.models.gpt import GPT
from litgpt_vocagnolm.training.score_teacher import score_teacher
from litgpt_vocagnolm.training.teacher import teacher_token_loss

LABELS = {
    "forward": "bare forward (no_grad)",
    "score loop": "score_teacher, scoring loop",
    "score": "score_teacher, end to end",
}


class LoopClock(tqdm):
    """score_teacher's progress bar, also adding up the wall and CPU seconds from its start to its close (a split's
    scoring loop; the writer thread finishes its last shard after it)."""

    wall = cpu = 0.0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.started = time.perf_counter(), time.process_time()

    def close(self):
        if hasattr(self, "started"):
            LoopClock.wall += time.perf_counter() - self.started[0]
            LoopClock.cpu += time.process_time() - self.started[1]
            del self.started
        super().close()


def scored_batches(
    data: Path, manifest: dict, batch_size: int, blocks_per_shard: int, width: int
) -> list[tuple[Tensor, int]]:
    """The (batch_size, width) id batches score_teacher forms (width: the padded window), in its order, each with the
    teacher tokens it holds."""
    batches = []
    for split in ("train", "val"):
        dataset = open_split(data, split, manifest)
        num_blocks = manifest["splits"][split]["blocks"]
        for shard_start in range(0, num_blocks, blocks_per_shard):
            indices = range(shard_start, min(shard_start + blocks_per_shard, num_blocks))
            for start in range(0, len(indices), batch_size):
                blocks = [dataset[i] for i in indices[start : start + batch_size]]
                ids = torch.zeros(batch_size, width, dtype=torch.long)
                for row, block in enumerate(blocks):
                    ids[row, : len(block["teacher_ids"])] = torch.from_numpy(block["teacher_ids"].astype(np.int64))
                batches.append((ids, sum(len(block["teacher_ids"]) for block in blocks)))
    return batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds; each runs score and forward once")
    parser.add_argument("--records", type=int, default=40, help="GSM8K records to prepare")
    parser.add_argument("--max_seq_length", type=int, default=128, help="student tokens per block")
    parser.add_argument("--batch_size", type=int, default=8, help="blocks per teacher forward (score_teacher's)")
    parser.add_argument("--blocks_per_shard", type=int, default=1024)
    parser.add_argument("--teacher_layers", type=int, default=4)
    parser.add_argument("--teacher_embd", type=int, default=256)
    parser.add_argument("--teacher_tokenizer", default="mistral-7b-v0.1", help="a folder of tests/fixtures/tokenizers")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (see the docstring)")
    parser.add_argument("--num_workers", type=int, default=1, help="score_teacher's loader workers")
    parser.add_argument("--verbose", action="store_true", help="show what prepare and score_teacher print")
    smoke = {"rounds": 1, "records": 10, "max_seq_length": 64, "batch_size": 2, "teacher_layers": 1, "teacher_embd": 64}
    args = parse_args(parser, smoke)
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data, teacher_dir, manifest = prepared_pair(tmp, args)
        model = GPT(Config.from_file(teacher_dir / "model_config.yaml"))
        width = padded_window(manifest, model.max_seq_length)
        batches = scored_batches(data, manifest, args.batch_size, args.blocks_per_shard, width)
        tokens = sum(count for _, count in batches)
        model.load_state_dict(torch.load(teacher_dir / "lit_model.pth", weights_only=True))
        model.requires_grad_(False).eval()

        def forward() -> None:
            with torch.no_grad():
                for ids, _ in batches:
                    model(ids)

        def score(round_: int) -> None:
            LoopClock.wall = LoopClock.cpu = 0.0
            score_module.tqdm = LoopClock
            try:
                with quiet(not args.verbose):
                    score_teacher(
                        data=data,
                        teacher=teacher_dir,
                        output=tmp / f"cache-{round_}",
                        batch_size=args.batch_size,
                        blocks_per_shard=args.blocks_per_shard,
                        num_workers=args.num_workers,
                    )
            finally:
                score_module.tqdm = tqdm

        # The loop's other work, once, on the same batches: reading and padding the blocks, the per-token loss.
        def read_blocks() -> None:
            scored_batches(data, manifest, args.batch_size, args.blocks_per_shard, width)

        def token_loss() -> None:  # what score_teacher runs: the transformer, then the head and loss tile by tile
            with torch.no_grad():
                for ids, _ in batches[:4]:
                    teacher_token_loss(model, ids, torch.ones_like(ids, dtype=torch.bool))

        forward()  # warm-up
        print(
            f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.2f};"
            f" teacher {args.teacher_layers} x {args.teacher_embd} ({sum(p.numel() for p in model.parameters()):,}"
            f" parameters, tokenizer {args.teacher_tokenizer}); {len(batches)} batches of up to {args.batch_size}"
            f" blocks, {tokens:,} teacher tokens"
        )
        times = {key: [] for key in ("score", "score loop", "forward")}
        cpu_times = {key: [] for key in times}
        for round_ in range(args.rounds):
            order = ("score", "forward") if round_ % 2 == 0 else ("forward", "score")
            for name in order:
                wall, cpu = time.perf_counter(), time.process_time()
                score(round_) if name == "score" else forward()
                times[name].append(time.perf_counter() - wall)
                cpu_times[name].append(time.process_time() - cpu)
                if name == "score":
                    times["score loop"].append(LoopClock.wall)
                    cpu_times["score loop"].append(LoopClock.cpu)
        # name: (run, the share of the batches it covers)
        parts = {
            "read and pad blocks": (read_blocks, 1),
            "teacher_token_loss instead of the forward": (token_loss, min(4, len(batches)) / len(batches)),
        }
        extra = {name: [] for name in parts}
        for _ in range(3):
            for name, (run, share) in parts.items():
                wall = time.perf_counter()
                run()
                extra[name].append((time.perf_counter() - wall) / share)

    wall = {name: statistics.median(values) for name, values in times.items()}
    cpu = {name: statistics.median(values) for name, values in cpu_times.items()}
    header = f"median of {args.rounds} rounds"
    print(f"{header:<32} {'wall s':>7} {'tokens/s':>9} {'cpu s':>7} {'tokens/cpu s':>13}")
    for name, label in LABELS.items():
        print(f"{label:<32} {wall[name]:7.2f} {tokens / wall[name]:9.0f} {cpu[name]:7.2f} {tokens / cpu[name]:13.0f}")
    for name in ("score loop", "score"):
        print(
            f"{LABELS[name]} / bare forward throughput: {wall['forward'] / wall[name]:.2f}x wall,"
            f" {cpu['forward'] / cpu[name]:.2f}x cpu (goal >= 0.95x)"
        )
    seconds = {name: statistics.median(values) for name, values in extra.items()}
    shares = [f"{name} {t:.2f} s ({t / wall['forward']:.0%})" for name, t in seconds.items()]
    print("besides the forward, over the same batches (median of 3; share of the bare forwards): " + ", ".join(shares))


if __name__ == "__main__":
    main()
