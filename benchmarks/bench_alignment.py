"""Token-level Lexical Alignment next to tokenization, TinyLlama (student) vs Qwen2.5 (teacher), on real math text,
then for every tokenizer family of tests/fixtures/tokenizers.

Prints, from one run, each step's time and three ratios:
  1. `align_batch` vs a straightforward per-token Python two-pointer loop on the same offset arrays (target: >= 10x);
     also the loop on the lists of tuples `Encoding.offsets` gives, made outside the timing: the loop's best case;
  2. `align_batch` vs tokenizing the text with both tokenizers (target: <= 5%);
  3. offsets (`token_offsets`) plus `align_batch` vs tokenizing both sides (target: <= 10%), next to the naive route
     of turning `Encoding.offsets` into arrays.
Tokenizing means `Tokenizer.encode` plus the ids as an array, which any data pipeline needs. Then, per pair of
families (each family as the student of Qwen2.5, and as the teacher of TinyLlama), what `prepare` pays: `encode` of
both sides (ids and tiling spans) plus `align_batch`, against tokenizing both sides (target: <= 1.10x), with the share
of student tokens mapped. Times are CPU time of this process (every step runs on one thread), so other processes on a
shared machine disturb them less than wall time; each step runs `--repeats` times, interleaved with the others, and
the fastest run counts.

    python benchmarks/bench_alignment.py [--file data/gsm8k/train.jsonl ...] [--megabytes 3] [--smoke]
"""

import argparse
import json
import time
from pathlib import Path
from typing import Callable

import numpy as np
from smoke import parse_args  # benchmarks/ is on sys.path when this file runs as a script
from tokenizers import Tokenizer

from litgpt_vocagnolm.alignment.lexical import align, align_batch, encode, token_offsets
from litgpt_vocagnolm.alignment.tokenizer_files import load_tokenizer

REPO = Path(__file__).resolve().parent.parent
FILES = [REPO / "data/gsm8k/train.jsonl", REPO / "data/stackexchange/math_stackexchange_33votes.jsonl"]
TOKENIZERS = REPO / "tests/fixtures/tokenizers"
STUDENT = TOKENIZERS / "tinyllama-1.1b"
TEACHER = TOKENIZERS / "qwen2.5"
# Text fields of a JSON line, joined into one document: GSM8K question/answer, Stack Exchange input/output.
TEXT_KEYS = (("question", "answer"), ("input", "output"), ("text",))


def read_documents(files: list[Path], characters: int) -> list[str]:
    """About `characters` characters of documents, an equal share from each file (JSON lines, or plain text)."""
    share = characters // len(files)
    documents = []
    for file in files:
        text = file.read_text(encoding="utf-8")
        if file.suffix == ".jsonl":
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
            texts = ["\n".join(row[k] for k in next(keys for keys in TEXT_KEYS if keys[0] in row)) for row in rows]
        else:
            texts = [text]
        taken = 0
        for text in texts:
            if taken >= share:
                break
            documents.append(text[: share - taken])
            taken += len(documents[-1])
    return documents


def two_pointer_align(student, teacher) -> list[tuple[int, int]]:
    """The straightforward alignment: walk both offset sequences token by token (no special tokens)."""
    ranges, first = [], 0
    for start, end in student:
        while first < len(teacher) and teacher[first][1] <= start:
            first += 1
        stop = first
        while stop < len(teacher) and teacher[stop][0] < end:
            stop += 1
        ranges.append((first, stop) if start < end and first < stop else (0, 0))
    return ranges


def best_times(steps: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    best = dict.fromkeys(steps, float("inf"))
    for _ in range(repeats):
        for name, step in steps.items():
            start = time.process_time()
            step()
            best[name] = min(best[name], time.process_time() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--file", type=Path, action="append", help="JSON lines or text; repeatable (default: GSM8K and Stack Exchange)"
    )
    parser.add_argument("--megabytes", type=float, default=3.0, help="millions of characters of text to use")
    parser.add_argument("--repeats", type=int, default=3)
    args = parse_args(parser, smoke={"megabytes": 0.02, "repeats": 1})

    documents = read_documents(args.file or FILES, int(args.megabytes * 1e6))
    tokenizers = load_tokenizer(STUDENT), load_tokenizer(TEACHER)
    print(f"{len(documents):,} documents, {sum(map(len, documents)) / 1e6:.2f} M characters, {args.repeats} repeats")

    # Inputs of each step, made once: encodings, id arrays, offset arrays, and offsets as `Encoding.offsets` lists.
    encodings = [[t.encode(d, add_special_tokens=False) for d in documents] for t in tokenizers]
    ids = [[np.array(e.ids, dtype=np.int32) for e in side] for side in encodings]
    offsets = [
        [token_offsets(t, d, e, i) for d, e, i in zip(documents, side, side_ids)]
        for t, side, side_ids in zip(tokenizers, encodings, ids)
    ]
    offset_lists = [[e.offsets for e in side] for side in encodings]
    for side_lists, side_offsets in zip(offset_lists, offsets):
        assert all(np.array_equal(np.reshape(o, (-1, 2)), a) for o, a in zip(side_lists, side_offsets))
    ranges = align_batch(*offsets)
    for s, t, r in zip(*offset_lists, ranges):
        assert np.array_equal(np.reshape(two_pointer_align(s, t), (-1, 2)), r)
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

    times = best_times(
        {
            "tokenize both sides (encode + ids)": tokenize,
            "naive offsets: np.array(Encoding.offsets)": naive_offsets,
            "our offsets: token_offsets": our_offsets,
            "align_batch, all documents in one call": lambda: align_batch(*offsets),
            "align, one call per document": lambda: [align(s, t) for s, t in zip(*offsets)],
            "loop over the offset arrays": lambda: [two_pointer_align(s, t) for s, t in zip(*offsets)],
            "loop over Encoding.offsets lists (made untimed)": lambda: [
                two_pointer_align(s, t) for s, t in zip(*offset_lists)
            ],
        },
        args.repeats,
    )
    for name, seconds in times.items():
        print(f"  {name:<50}{seconds:8.3f} s")
    tokenize_s, naive_s, ours_s, batch_s, each_s, loop_arrays_s, loop_lists_s = times.values()
    print(f"1. loop / align_batch, same offset arrays in:   {loop_arrays_s / batch_s:6.1f}x   (target >= 10x)")
    print(f"   loop on ready-made lists / align_batch:      {loop_lists_s / batch_s:6.1f}x")
    print(f"   loop on ready-made lists / align per doc:    {loop_lists_s / each_s:6.1f}x")
    print(f"2. align_batch / tokenize:                      {batch_s / tokenize_s:6.1%}   (target <= 5%)")
    print(f"3. (our offsets + align_batch) / tokenize:      {(ours_s + batch_s) / tokenize_s:6.1%}   (target <= 10%)")
    print(f"   (naive offsets + align_batch) / tokenize:    {(naive_s + batch_s) / tokenize_s:6.1%}")
    print(f"   naive offsets / our offsets:                 {naive_s / ours_s:6.1f}x")
    print()
    family_pairs(documents, args.repeats)


def tokenize_and_encode(tokenizer: Tokenizer, documents: list[str]) -> tuple[float, float]:
    """Seconds spent tokenizing the documents (ids as an array) and in `encode` (ids and spans), document by document
    in turn, so that what load there is on the machine weighs on both alike. Each goes first for every other
    document: the second to tokenize a document finds its words in the tokenizer's cache, and runs faster. (A
    pipeline tokenizes each document once, so tokenizing alone is slower there, and the ratio lower.)"""
    steps = (
        lambda document: np.array(tokenizer.encode(document, add_special_tokens=False).ids, dtype=np.int32),
        lambda document: encode(tokenizer, document),
    )
    seconds = [0.0, 0.0]
    for k, document in enumerate(documents):
        for step in (0, 1) if k % 2 == 0 else (1, 0):
            start = time.process_time()
            steps[step](document)
            seconds[step] += time.process_time() - start
    return seconds[0], seconds[1]


def family_pairs(documents: list[str], repeats: int) -> None:
    """(encode both sides + align_batch) / tokenize both sides, for each family as Qwen2.5's student and TinyLlama's
    teacher, from one set of timings: each family's tokenizing and `encode` once, each pair's alignment."""
    tokenizers = {path.name: load_tokenizer(path) for path in sorted(TOKENIZERS.iterdir()) if path.is_dir()}
    pairs = [(name, TEACHER.name) for name in tokenizers if name != TEACHER.name]
    pairs += [(STUDENT.name, name) for name in tokenizers if name not in (STUDENT.name, TEACHER.name)]
    offsets = {name: [encode(t, d)[1] for d in documents] for name, t in tokenizers.items()}
    tokenize_s, encode_s = dict.fromkeys(tokenizers, float("inf")), dict.fromkeys(tokenizers, float("inf"))
    align_s = dict.fromkeys(pairs, float("inf"))
    for _ in range(repeats):
        for name, tokenizer in tokenizers.items():
            tokenizing, encoding = tokenize_and_encode(tokenizer, documents)
            tokenize_s[name], encode_s[name] = min(tokenize_s[name], tokenizing), min(encode_s[name], encoding)
        for student, teacher in pairs:
            start = time.process_time()
            align_batch(offsets[student], offsets[teacher])
            align_s[student, teacher] = min(align_s[student, teacher], time.process_time() - start)
    print(
        f"{'student -> teacher':<47}{'tokenize s':>11}{'encode s':>10}{'align s':>9}"
        f"{'(encode + align) / tokenize':>29}{'mapped':>9}"
    )
    ratios = {}
    for student, teacher in pairs:
        ranges = np.concatenate(align_batch(offsets[student], offsets[teacher]))
        both = tokenize_s[student] + tokenize_s[teacher], encode_s[student] + encode_s[teacher]
        ratios[student, teacher] = (both[1] + align_s[student, teacher]) / both[0]
        print(
            f"{student + ' -> ' + teacher:<47}{both[0]:11.3f}{both[1]:10.3f}{align_s[student, teacher]:9.3f}"
            f"{ratios[student, teacher]:28.3f}x{(ranges[:, 0] < ranges[:, 1]).mean():9.2%}"
        )
    worst = max(ratios, key=ratios.get)
    print(
        f"(encode + align) / tokenize, worst pair:       {ratios[worst]:6.3f}x  {' -> '.join(worst)} (target <= 1.10x)"
    )


if __name__ == "__main__":
    main()
