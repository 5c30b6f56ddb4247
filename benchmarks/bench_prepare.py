"""`vocagnolm prepare` next to only tokenizing the same text, its peak memory as the input or a document grows, and what
cutting long documents into segments changes.

Prints, from one run:
  1. MB/s of text through `prepare` (read, tokenize both sides with offsets, align, pack, write the LitData shards of
     both splits, manifest) vs only tokenizing the same documents with both tokenizers, offsets included
     (`alignment.encode_batch`), with the same number of worker processes over the same work units (target: >= 0.75x).
     Both read the documents with `documents.read_documents`; tokenizers are loaded before the clock starts. Wall time,
     and CPU time of all processes (steadier on a shared machine); each runs `--repeats` times, interleaved, and the
     fastest run counts.
  2. Peak resident memory of `prepare` (its process, and the largest of its workers) on `--memory_megabytes` of the
     input and on `--scale` copies of that, each in a fresh process (target: flat). A worker buffers one LitData chunk
     before writing it, so memory grows with the input until that buffer is full (`prepare.LITDATA_CHUNK_BYTES`, 64 MB,
     about 25 MB of text): this comparison uses 1 MB chunks, full at both sizes, to show that nothing else grows.
  3. Peak resident memory of `prepare` on one document of `--long_megabytes` million characters (the input's text
     joined and repeated), as a single .jsonl line and as a .txt file, next to one of a tenth of that, with the same
     small LitData chunks (target: flat; a .jsonl line is parsed whole, a few bytes per character).
  4. What the cuts between segments (`documents.segments`) change: the input's text joined into one document, cut
     into segments of `--segment_chars`, tokenized segment by segment (`packing.encode_segments`) vs whole, per
     tokenizer: the hard cuts (no line or word boundary in reach) and the tokens that differ.

    python benchmarks/bench_prepare.py [--input FILE ...] [--num_workers 2] [--scale 10] [--memory_megabytes 1]
        [--long_megabytes 20] [--segment_chars 300 2000 65536] [--smoke]
"""

import argparse
import functools
import json
import multiprocessing
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator, Optional

import numpy as np
from smoke import parse_args  # benchmarks/ is on sys.path when this file runs as a script

from litgpt_vocagnolm.alignment.lexical import encode, encode_batch
from litgpt_vocagnolm.alignment.tokenizer_files import (
    find_tokenizer_file,
    load_tokenizer,
    tokenizer_info,
)
from litgpt_vocagnolm.data import documents, packing, prepare

REPO = Path(__file__).resolve().parent.parent
FILES = [REPO / "data/gsm8k/train.jsonl", REPO / "data/stackexchange/math_stackexchange_33votes.jsonl"]
STUDENT = REPO / "tests/fixtures/tokenizers/tinyllama-1.1b"
TEACHER = REPO / "tests/fixtures/tokenizers/qwen2.5"
# Also in the comparison of cuts (Llemma's tokenizer is TinyLlama's with 16 more tokens).
OTHER_TOKENIZERS = [REPO / "tests/fixtures/tokenizers/mistral-7b-v0.1"]
# Text fields of a JSON line, joined into one document: GSM8K question/answer, Stack Exchange input/output.
TEXT_KEYS = (("question", "answer"), ("input", "output"), ("text",))
# The input of each form of the long document: one line of a .jsonl file with a short document, or a .txt file (one
# document per file) beside a short one; one of the two documents goes to the val split.
LONG_DOCUMENT_FILES = {"jsonl": ["doc.jsonl"], "txt": ["doc.txt", "short.txt"]}


def input_texts(files: list[Path]) -> Iterator[str]:
    """The documents of `files`, fields joined as `prepare --text_key a,b` does."""
    for file in files:
        for line in file.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            yield documents.FIELD_SEPARATOR.join(row[k] for k in next(ks for ks in TEXT_KEYS if ks[0] in row))


def write_text_jsonl(files: list[Path], out: Path, megabytes: float = float("inf")) -> int:
    """The documents of `files` as {"text": ...} lines; returns the bytes of text written."""
    total = 0
    with open(out, "w", encoding="utf-8") as f:
        for text in input_texts(files):
            if total >= megabytes * 1e6:
                break
            f.write(json.dumps({"text": text}) + "\n")
            total += len(text.encode("utf-8"))
    return total


def one_document(files: list[Path], characters: Optional[int] = None) -> str:
    """The documents of `files` joined by blank lines, repeated or cut to `characters` characters if given."""
    text = "\n\n".join(input_texts(files))
    return text if characters is None else (text * (characters // len(text) + 1))[:characters]


def tokenize_unit(unit: documents.Unit, student: str, teacher: str) -> int:
    """The baseline's work per unit: read its documents, tokenize them with both tokenizers, offsets included."""
    student_tokenizer, teacher_tokenizer = load_tokenizer(student), load_tokenizer(teacher)
    segments = documents.split_documents(unit, ["text"], "train", None, documents.Stats())
    tokens = 0
    for batch in packing.segment_batches(segments, packing.BATCH_CHARS):
        tokens += sum(len(ids) for ids, _ in encode_batch(student_tokenizer, [s.text for s in batch]))
        tokens += sum(len(ids) for ids, _ in encode_batch(teacher_tokenizer, [s.text for s in batch]))
    return tokens


def tokenize_only(files: list[Path], num_workers: int, student: str, teacher: str) -> int:
    units = documents.plan_units(files)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker, as in prepare
    with multiprocessing.get_context("fork").Pool(min(num_workers, len(units))) as pool:
        return sum(pool.imap_unordered(functools.partial(tokenize_unit, student=student, teacher=teacher), units))


def run_prepare(files: list[Path], output: Path, num_workers: int) -> None:
    shutil.rmtree(output, ignore_errors=True)
    prepare.prepare(student=STUDENT, teacher=TEACHER, input=files, output=output, num_workers=num_workers)


def cpu_seconds() -> float:
    """CPU time of this process and of its finished child processes (workers, and their helpers)."""
    usages = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return sum(usage.ru_utime + usage.ru_stime for usage in usages)


def quietly(function, *args) -> tuple[float, float]:
    """Runs `function` with LitData's progress chatter sent to /dev/null; returns its wall and CPU seconds."""
    with open(os.devnull, "w") as devnull:
        saved = os.dup(1), os.dup(2)
        sys.stdout.flush(), sys.stderr.flush()
        os.dup2(devnull.fileno(), 1), os.dup2(devnull.fileno(), 2)
        try:
            t0, c0 = time.perf_counter(), cpu_seconds()
            function(*args)
            return time.perf_counter() - t0, cpu_seconds() - c0
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os.dup2(saved[0], 1), os.dup2(saved[1], 2)


def own_peak_megabytes() -> float:
    """This process's peak resident memory. Linux keeps ru_maxrss across exec: read alone, a child started by a parent
    that once held more (the long document, before it writes it out) would report the parent's peak."""
    status = Path("/proc/self/status")
    lines = status.read_text().splitlines() if status.exists() else []
    peak = [int(line.split()[1]) for line in lines if line.startswith("VmHWM:")]  # kB, of this process image only
    return (peak[0] if peak else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 1024


def peak_memory(files: list[Path], output: Path, num_workers: int, chunk_bytes: str) -> dict:
    """Peak RSS (MB) of `prepare` run in a fresh process: that process, and the largest of its workers."""
    command = [sys.executable, __file__, "--memory_of", *map(str, files), "--output", str(output)]
    command += ["--num_workers", str(num_workers), "--chunk_bytes", chunk_bytes]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def cut_changes(text: str, tokenizer_dir: Path, max_chars: int) -> tuple[int, int, int, int]:
    """Segments, hard cuts, tokens of `text` that segment-by-segment tokenization changes (counted on either side,
    a token being its id and character span), and the whole document's tokens."""
    tokenizer = load_tokenizer(tokenizer_dir)
    segments = list(documents.segments(documents.TextChunks(text, max_chars), max_chars))
    starts = np.cumsum([0] + [len(s.text) for s in segments])[:-1]
    pieces = packing.encode_segments(tokenizer, segments)
    ids = np.concatenate([i for i, _ in pieces])
    offsets = np.concatenate([o + start for (_, o), start in zip(pieces, starts)])
    whole_ids, whole_offsets = encode(tokenizer, text)
    tokens = set(zip(ids.tolist(), map(tuple, offsets.tolist())))
    whole = set(zip(whole_ids.tolist(), map(tuple, whole_offsets.tolist())))
    hard = sum(1 for s in segments if not s.first and not s.context)
    return len(segments), hard, max(len(whole - tokens), len(tokens - whole)), len(whole_ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", type=Path, nargs="+", default=FILES)
    parser.add_argument("--megabytes", type=float, default=None, help="of the input's text to use (default: all)")
    parser.add_argument("--num_workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--scale", type=int, default=10)
    parser.add_argument("--memory_megabytes", type=float, default=1.0, help="base input of the memory comparison")
    parser.add_argument("--chunk_bytes", default="1MB", help="LitData chunk size in the memory comparison")
    parser.add_argument("--long_megabytes", type=float, default=20.0, help="characters (millions) of the long document")
    parser.add_argument(
        "--formats",
        nargs="+",
        choices=["jsonl", "txt"],
        default=["jsonl", "txt"],
        help="the long document as one .jsonl line, as a .txt file, or both",
    )
    parser.add_argument("--segment_chars", type=int, nargs="+", default=[300, 2000, documents.SEGMENT_CHARS])
    parser.add_argument("--memory_of", type=Path, nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--output", type=Path, help=argparse.SUPPRESS)
    smoke = {
        "megabytes": 0.05,
        "num_workers": 1,
        "repeats": 1,
        "scale": 2,
        "memory_megabytes": 0.02,
        "long_megabytes": 0.05,
        "formats": ["txt"],
        "segment_chars": [300, 2000],
    }
    args = parse_args(parser, smoke)

    if args.memory_of:  # the child process of `peak_memory`
        prepare.LITDATA_CHUNK_BYTES = args.chunk_bytes
        quietly(run_prepare, args.memory_of, args.output, args.num_workers)
        workers_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        print(json.dumps({"process": own_peak_megabytes(), "workers": workers_mb}))
        return

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        text = tmp / "text.jsonl"
        megabytes = write_text_jsonl(args.input, text, args.megabytes or float("inf")) / 1e6
        student = tokenizer_info(find_tokenizer_file(STUDENT)).path  # loaded once, before any clock
        teacher = tokenizer_info(find_tokenizer_file(TEACHER)).path
        print(
            f"{megabytes:.1f} MB of text ({', '.join(p.name for p in args.input)}), {args.num_workers} workers,"
            f" {len(documents.plan_units([text]))} work units; student {STUDENT.name}, teacher {TEACHER.name}."
        )
        runs = {"prepare": [], "tokenize only": []}
        for _ in range(args.repeats):
            runs["prepare"].append(quietly(run_prepare, [text], tmp / "out", args.num_workers))
            runs["tokenize only"].append(quietly(tokenize_only, [text], args.num_workers, student, teacher))
        best = {name: [min(times) for times in zip(*timings)] for name, timings in runs.items()}  # [wall, cpu]
        for name, (wall, cpu) in best.items():
            walls = ", ".join(f"{wall:.2f}" for wall, _ in runs[name])
            print(f"  {name:<14} wall {wall:6.2f} s, {megabytes / wall:5.2f} MB/s (runs: {walls});  CPU {cpu:6.2f} s")
        ratios = [tokenize / prepare for tokenize, prepare in zip(best["tokenize only"], best["prepare"])]
        manifest = json.loads((tmp / "out" / "manifest.json").read_text())
        print(
            f"  prepare / tokenize only throughput: {ratios[0]:.2f}x by wall time, {ratios[1]:.2f}x by CPU time"
            f" (target >= 0.75x); {manifest['bytes_per_student_token']:.2f} bytes per student token on disk,"
            f" {manifest['alignment_bytes_per_student_token']} for the alignment."
        )

        base = tmp / "memory" / "base.jsonl"
        base.parent.mkdir()
        base_megabytes = write_text_jsonl(args.input, base, args.memory_megabytes) / 1e6
        copies = []
        for k in range(args.scale):
            copies.append(tmp / "memory" / f"copy{k}.jsonl")
            shutil.copyfile(base, copies[-1])
        small = peak_memory([base], tmp / "memory" / "out-1", args.num_workers, args.chunk_bytes)
        large = peak_memory(copies, tmp / "memory" / f"out-{args.scale}", args.num_workers, args.chunk_bytes)
        print(f"Peak resident memory of prepare ({args.num_workers} workers, LitData chunks of {args.chunk_bytes}):")
        for name, sizes in ((f"{base_megabytes:.1f} MB", small), (f"{base_megabytes * args.scale:.1f} MB", large)):
            print(f"  {name:>8} of text: process {sizes['process']:6.0f} MB, largest worker {sizes['workers']:6.0f} MB")
        growth = {name: large[name] / small[name] for name in small}
        print(
            f"  peak memory growth with the input: {growth['process']:.2f}x the process's peak,"
            f" {growth['workers']:.2f}x"
            f" the largest worker's at {args.scale}x the input (target: flat, ~1.0x)"
        )

        long_dir = tmp / "long"
        long_dir.mkdir()
        characters = int(args.long_megabytes * 1e6)
        print(
            f"Peak resident memory of prepare on one document ({args.num_workers} workers, LitData chunks of"
            f" {args.chunk_bytes}; target: flat):"
        )
        short = next(input_texts(args.input))  # a second document: one of the two goes to the val split
        (long_dir / "short.txt").write_text(short, encoding="utf-8")
        for size in (characters // 10, characters):
            text = one_document(args.input, size)
            lines = [json.dumps({"text": text}), json.dumps({"text": short})]
            (long_dir / "doc.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
            (long_dir / "doc.txt").write_text(text, encoding="utf-8")
            del text, lines
            for name in args.formats:
                files = [long_dir / file for file in LONG_DOCUMENT_FILES[name]]
                sizes = peak_memory(files, long_dir / "out", args.num_workers, args.chunk_bytes)
                print(
                    f"  peak memory on one document: {size / 1e6:5.1f} M characters, one {name:>5} document,"
                    f" process {sizes['process']:6.0f} MB, largest worker {sizes['workers']:6.0f} MB"
                )
                shutil.rmtree(long_dir / "out")

    text = one_document(args.input, args.megabytes and int(args.megabytes * 1e6))
    print(f"Cutting one document of {len(text):,} characters (the input joined) into segments, tokenized one by one:")
    for tokenizer_dir in [STUDENT, TEACHER, *OTHER_TOKENIZERS]:
        for max_chars in args.segment_chars:
            count, hard, changed, total = cut_changes(text, tokenizer_dir, max_chars)
            print(
                f"  tokens changed by segments: {tokenizer_dir.name:<16} segments of {max_chars:>6,} characters,"
                f" {count:>6,} segments, {hard:>3} hard cuts, {changed:>3} of {total:,} tokens differ from the whole"
                " document's"
            )


if __name__ == "__main__":
    main()
