"""Token-level Lexical Alignment next to tokenization, TinyLlama (student) vs Qwen2.5 (teacher), on real math text.

Prints, from one run, each step's time and three ratios:
  1. `align` vs a straightforward per-token Python two-pointer loop on the same offsets (target: >= 10x faster);
  2. `align` vs tokenizing the text with both tokenizers (target: <= 5%);
  3. offsets (`token_offsets`) plus `align` vs tokenizing both sides (target: <= 10%), next to the naive route of
     turning `Encoding.offsets` into arrays.
Tokenizing means `Tokenizer.encode` plus the ids as an array, which any data pipeline needs. Each step runs
`--repeats` times over every document; the fastest run counts (the others carry noise from other processes).

    python benchmarks/bench_alignment.py [--file data/gsm8k/train.jsonl ...] [--megabytes 3]
"""

import argparse
import json
import time
from pathlib import Path
from typing import Callable

import numpy as np

from litgpt_vocagnolm.alignment import align, align_batch, load_tokenizer, token_offsets

REPO = Path(__file__).resolve().parent.parent
FILES = [REPO / "data/gsm8k/train.jsonl", REPO / "data/stackexchange/math_stackexchange_33votes.jsonl"]
STUDENT = REPO / "tests/fixtures/tokenizers/tinyllama-1.1b"
TEACHER = REPO / "tests/fixtures/tokenizers/qwen2.5"
# Text fields of a JSON line, joined into one document: GSM8K question/answer, Stack Exchange input/output.
TEXT_KEYS = (("question", "answer"), ("input", "output"), ("text",))


def read_documents(files: list[Path], characters: int) -> list[str]:
    """About `characters` characters of documents, an equal share from each file (JSON lines or plain text)."""
    share = characters // len(files)
    documents = []
    for file in files:
        taken = 0
        lines = file.read_text(encoding="utf-8").splitlines() if file.suffix == ".jsonl" else [file.read_text()]
        for line in lines:
            if taken >= share:
                break
            if file.suffix == ".jsonl":
                row = json.loads(line)
                keys = next(keys for keys in TEXT_KEYS if all(k in row for k in keys))
                line = "\n".join(row[k] for k in keys)
            documents.append(line[: share - taken])
            taken += len(documents[-1])
    return documents


def two_pointer_align(student: list[tuple[int, int]], teacher: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The straightforward alignment: walk both offset lists (as `Encoding.offsets` gives them) token by token."""
    ranges, first = [], 0
    for start, end in student:
        while first < len(teacher) and teacher[first][1] <= start:
            first += 1
        stop = first
        while stop < len(teacher) and teacher[stop][0] < end:
            stop += 1
        ranges.append((first, stop) if start < end and first < stop else (0, 0))
    return ranges


def best_time(step: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--file", type=Path, action="append", help="JSON lines or text; repeatable (default: GSM8K train and Stack Exchange)")
    parser.add_argument("--megabytes", type=float, default=3.0, help="characters of text to use, in millions")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    documents = read_documents(args.file or FILES, int(args.megabytes * 1e6))
    tokenizers = load_tokenizer(STUDENT), load_tokenizer(TEACHER)
    print(f"{len(documents)} documents, {sum(map(len, documents)) / 1e6:.2f} M characters, {args.repeats} repeats")

    encodings = [[t.encode(d, add_special_tokens=False) for d in documents] for t in tokenizers]
    ids = [[np.array(e.ids, dtype=np.int32) for e in side] for side in encodings]
    offsets = [[token_offsets(t, d, e, i) for d, e, i in zip(documents, side, side_ids)]
               for t, side, side_ids in zip(tokenizers, encodings, ids)]
    offset_lists = [[e.offsets for e in side] for side in encodings]
    for side, side_offsets in zip(offset_lists, offsets):
        assert all(np.array_equal(np.array(o).reshape(-1, 2), a) for o, a in zip(side, side_offsets))
    ranges = align_batch(*offsets)
    assert all(np.array_equal(align(s, t), r) for s, t, r in zip(*offsets, ranges))
    assert all(np.array_equal(np.array(two_pointer_align(s, t)).reshape(-1, 2), r) for s, t, r in zip(*offset_lists, ranges))
    print(f"tokens: student {sum(map(len, ids[0])):,}, teacher {sum(map(len, ids[1])):,}; offsets and ranges checked")

    def tokenize() -> None:
        for t in tokenizers:
            for d in documents:
                np.array(t.encode(d, add_special_tokens=False).ids, dtype=np.int32)

    def naive_offsets() -> None:
        for side in encodings:
            for e in side:
                np.array(e.offsets, dtype=np.int64).reshape(-1, 2)

    def our_offsets() -> None:
        for t, side, side_ids in zip(tokenizers, encodings, ids):
            for d, e, i in zip(documents, side, side_ids):
                token_offsets(t, d, e, i)

    times = {
        "tokenize both sides (encode + ids)": best_time(tokenize, args.repeats),
        "naive offsets (np.array(Encoding.offsets))": best_time(naive_offsets, args.repeats),
        "our offsets (token_offsets)": best_time(our_offsets, args.repeats),
        "align_batch (binary search, all documents)": best_time(lambda: align_batch(*offsets), args.repeats),
        "align (binary search, one call per document)": best_time(
            lambda: [align(s, t) for s, t in zip(*offsets)], args.repeats
        ),
        "align (Python two-pointer loop)": best_time(
            lambda: [two_pointer_align(s, t) for s, t in zip(*offset_lists)], args.repeats
        ),
    }
    for name, seconds in times.items():
        print(f"  {name:<45} {seconds:8.3f} s")
    tokenize_s, naive_s, ours_s, align_s, align_each_s, loop_s = times.values()
    print(f"1. two-pointer loop / align_batch:            {loop_s / align_s:6.1f}x   (target >= 10x)")
    print(f"   two-pointer loop / align per document:     {loop_s / align_each_s:6.1f}x")
    print(f"2. align_batch / tokenize:                    {align_s / tokenize_s:6.1%}   (target <= 5%)")
    print(f"3. (our offsets + align_batch) / tokenize:     {(ours_s + align_s) / tokenize_s:6.1%}   (target <= 10%)")
    print(f"   (naive offsets + align_batch) / tokenize:     {(naive_s + align_s) / tokenize_s:6.1%}")
    print(f"   naive offsets / our offsets:               {naive_s / ours_s:6.1f}x")


if __name__ == "__main__":
    main()
