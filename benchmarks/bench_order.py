"""The train loader of the global order (`order.train_loader`: a torch DataLoader whose workers read the blocks it names
by index) against today's LitData loader (`VocAgnoData.train_dataloader`: a `StreamingDataLoader` with LitData's
shuffle), on the same prepared data, with 1 and 4 loader workers.

The data is the text of data/ (GSM8K and Math Stack Exchange), prepared by `vocagnolm prepare` (student TinyLlama,
teacher Qwen2.5) at sequence 2048, with LitData chunks of `--chunk_bytes` so that the split holds many chunks, as
data at the paper's scale does with 64 MB chunks. Prints, for each number of workers:
  1. blocks/s, reading as fast as the loader delivers (after its first micro-batch: the workers' start is apart), the
     best of `--rounds` rounds, the two loaders interleaved; as `new / litdata, N workers: R x`.
  2. the time a consumer waits on data: it takes the paper's cached step time per micro-batch (sleeping, as a host
     waits on its GPU), and the mean time `next()` kept it waiting per step after the first is reported.
and the blocks/s a GPU needs to keep the paper's step fed: 8 blocks per step per GPU at the H100 step times of the
docs/performance.md (`benchmarks/bench_mfu.py --device cuda --compile --max_micro_batch 8`).

    python benchmarks/bench_order.py [--max_seq_length 2048] [--micro_batch_size 8] [--workers 1 4] [--smoke]
"""

import argparse
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Iterable

from smoke import parse_args  # benchmarks/ is on sys.path when this file runs as a script

from litgpt_vocagnolm.data import prepare
from litgpt_vocagnolm.data.documents import FIELD_SEPARATOR
from litgpt_vocagnolm.data.order import train_loader
from litgpt_vocagnolm.data.prepared import VocAgnoData

REPO = Path(__file__).resolve().parent.parent
FILES = [REPO / "data/gsm8k/train.jsonl", REPO / "data/stackexchange/math_stackexchange_33votes.jsonl"]
STUDENT = REPO / "tests/fixtures/tokenizers/tinyllama-1.1b"
TEACHER = REPO / "tests/fixtures/tokenizers/qwen2.5"
TEXT_KEYS = (("question", "answer"), ("input", "output"))  # GSM8K, Math Stack Exchange
# The paper's step on one H100 (docs/performance.md): compiled, micro-batch 8, sequence 2048.
PAPER_BLOCKS_PER_STEP = 8
PAPER_SEQUENCE = 2048
STEP_TOKENS_PER_SECOND = {"online": 21_227, "cached": 64_268}


def write_text(files: list[Path], out: Path, megabytes: float) -> float:
    """The documents of `files` (fields joined as `prepare --text_key a,b` does) as {"text": ...} lines, up to
    `megabytes` of text; returns the megabytes written."""
    total = 0
    with open(out, "w", encoding="utf-8") as f:
        for file in files:
            for line in file.read_text(encoding="utf-8").splitlines():
                if total >= megabytes * 1e6:
                    return total / 1e6
                row = json.loads(line)
                text = FIELD_SEPARATOR.join(row[k] for k in next(keys for keys in TEXT_KEYS if keys[0] in row))
                f.write(json.dumps({"text": text}) + "\n")
                total += len(text.encode("utf-8"))
    return total / 1e6


def quietly(function, **kwargs) -> None:
    """Runs `function` with LitData's progress chatter sent to /dev/null."""
    with open(os.devnull, "w") as devnull:
        saved = os.dup(1), os.dup(2)
        sys.stdout.flush(), sys.stderr.flush()
        os.dup2(devnull.fileno(), 1), os.dup2(devnull.fileno(), 2)
        try:
            function(**kwargs)
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os.dup2(saved[0], 1), os.dup2(saved[1], 2)


def loader(kind: str, data: VocAgnoData) -> Iterable[dict]:
    """A fresh loader of the train split: the global order from position 0 on one rank, or LitData's."""
    return train_loader(data, 0, rank=0, world_size=1) if kind == "new" else data.train_dataloader()


def blocks_per_second(batches: Iterable[dict], micro_batches: int) -> float:
    """Blocks/s over `micro_batches` micro-batches, timed from the first one's arrival (the workers' start apart)."""
    iterator = iter(batches)
    next(iterator)
    t0, blocks = time.perf_counter(), 0
    for _ in range(micro_batches):
        blocks += len(next(iterator).input_ids)
    return blocks / (time.perf_counter() - t0)


def wait_per_step(batches: Iterable[dict], micro_batches: int, step_seconds: float) -> tuple[float, float]:
    """Seconds the first micro-batch took to arrive, and the mean seconds a consumer that takes `step_seconds` per
    micro-batch then waits in `next()` per micro-batch."""
    iterator = iter(batches)
    t0 = time.perf_counter()
    next(iterator)
    first, waited = time.perf_counter() - t0, 0.0
    for _ in range(micro_batches):
        time.sleep(step_seconds)  # the step: the host waits on its GPU
        t0 = time.perf_counter()
        next(iterator)
        waited += time.perf_counter() - t0
    return first, waited / micro_batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, help="prepared data to read (default: prepare data/'s text in a temp dir)")
    parser.add_argument("--megabytes", type=float, default=8.0, help="text to prepare (data/ holds about 7 MB)")
    parser.add_argument("--max_seq_length", type=int, default=PAPER_SEQUENCE)
    parser.add_argument("--chunk_bytes", default="2MB", help="LitData chunk size of the prepared data")
    parser.add_argument("--micro_batch_size", type=int, default=PAPER_BLOCKS_PER_STEP)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--micro_batches", type=int, default=120, help="micro-batches timed per loader and round")
    parser.add_argument("--wait_micro_batches", type=int, default=24, help="micro-batches of the waiting consumer")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--step_seconds", type=float, help="the waiting consumer's step (default: the cached step's)")
    args = parse_args(
        parser,
        smoke={
            "megabytes": 0.05,
            "max_seq_length": 128,
            "chunk_bytes": "64KB",
            "micro_batch_size": 2,
            "workers": [1],
            "micro_batches": 4,
            "wait_micro_batches": 2,
            "rounds": 1,
            "step_seconds": 0.01,
        },
    )

    warnings.filterwarnings("ignore", message="This DataLoader will create")  # more workers than this machine's CPUs
    step_tokens = PAPER_BLOCKS_PER_STEP * PAPER_SEQUENCE
    step_seconds = {work: step_tokens / rate for work, rate in STEP_TOKENS_PER_SECOND.items()}
    needed = {work: PAPER_BLOCKS_PER_STEP / seconds for work, seconds in step_seconds.items()}
    consumer_step = args.step_seconds or step_seconds["cached"]
    with tempfile.TemporaryDirectory() as tmp:
        path = args.data
        if path is None:
            path, text = Path(tmp) / "prepared", Path(tmp) / "text.jsonl"
            megabytes = write_text(FILES, text, args.megabytes)
            prepare.LITDATA_CHUNK_BYTES = args.chunk_bytes
            t0 = time.perf_counter()
            quietly(
                prepare.prepare,
                student=STUDENT,
                teacher=TEACHER,
                input=[text],
                output=path,
                max_seq_length=args.max_seq_length,
                num_workers=2,
            )
            print(f"Prepared {megabytes:.2f} MB of data/'s text in {time.perf_counter() - t0:.1f} s.")
        data = VocAgnoData(path)
        data.connect(batch_size=args.micro_batch_size)
        chunks = len(json.loads((path / "train" / "index.json").read_text())["chunks"])
        num_blocks = data.manifest["splits"]["train"]["blocks"]
        print(
            f"Train split: {num_blocks:,} blocks of sequence {data.manifest['max_seq_length']} in {chunks} LitData"
            f" chunks; micro-batch {args.micro_batch_size}; {os.cpu_count()} CPUs."
        )
        micro_batches = min(args.micro_batches, num_blocks // args.micro_batch_size - 1)  # within LitData's epoch
        wait_batches = min(args.wait_micro_batches, micro_batches)
        print(
            f"The paper's step ({PAPER_BLOCKS_PER_STEP} blocks of {PAPER_SEQUENCE} tokens per GPU, compiled, one"
            " H100, docs/performance.md) needs:"
        )
        for work, rate in STEP_TOKENS_PER_SECOND.items():
            print(f"  {work} step: {rate:,} tokens/s, {step_seconds[work]:.3f} s per step: {needed[work]:.1f} blocks/s")
        for workers in args.workers:
            data.num_workers = workers
            label = f"{workers} worker{'s' if workers > 1 else ''}"
            rates = {"new": [], "litdata": []}
            for _ in range(args.rounds):
                for kind in rates:
                    rates[kind].append(blocks_per_second(loader(kind, data), micro_batches))
            best = {kind: max(found) for kind, found in rates.items()}
            waits = {kind: wait_per_step(loader(kind, data), wait_batches, consumer_step) for kind in rates}
            rounds = " ".join(f"{new / old:.2f}" for new, old in zip(rates["new"], rates["litdata"]))
            print(
                f"{label}: new {best['new']:,.1f} blocks/s, litdata {best['litdata']:,.1f} blocks/s, best of"
                f" {args.rounds} (new / litdata by round: {rounds})"
            )
            print(
                f"{label}: wait on data per step of {consumer_step:.3f} s: new {1e3 * waits['new'][1]:.2f} ms,"
                f" litdata {1e3 * waits['litdata'][1]:.2f} ms; first micro-batch after new {waits['new'][0]:.2f} s,"
                f" litdata {waits['litdata'][0]:.2f} s"
            )
            print(f"new / litdata, {label}: {best['new'] / best['litdata']:.2f}x")
            print(f"wait, new / litdata, {label}: {waits['new'][1] / max(waits['litdata'][1], 1e-9):.2f}x")
            print(f"new / needed by the cached step, {label}: {best['new'] / needed['cached']:.2f}x")


if __name__ == "__main__":
    main()
