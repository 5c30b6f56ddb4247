"""`vocagnolm prepare --dry_run`: what preparing the input (and then scoring it with the teacher) will cost, before any
of it runs.

`prepare`'s own per-worker work (read, tokenize with both tokenizers, align, pack into blocks: `unit_blocks` without
LitData's writing) runs in this process on the first SAMPLE_CHARS characters of the input. Its throughput, student
tokens per input byte and block bytes per student token are then extrapolated to the input's size: a .txt file's size,
a .jsonl file's size scaled by the share of its bytes the sample's records' text took, a .parquet file's text columns'
uncompressed size from its metadata (no rows read). Printed: the input's student and teacher tokens, prepare's hours
at --num_workers, the passes a token budget makes over the train split, the disk of the shards and of
`score-teacher`'s loss cache, and the teacher's forward FLOPs when the teacher is a checkpoint with its config.
"""

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Optional

import numpy as np
import pyarrow.parquet as pq

from litgpt_vocagnolm.alignment.tokenizer_files import TokenizerInfo
from litgpt_vocagnolm.data.documents import FIELD_SEPARATOR, Segment, Stats, Unit, file_pieces, split_documents
from litgpt_vocagnolm.data.packing import BlockDtypes, aligned_streams, pack_blocks
from litgpt_vocagnolm.errors import InvalidArgument

SAMPLE_CHARS = 2 << 20  # characters of the input that the dry run prepares and times
PAPER_TOKENS = 15e9  # the paper's training budget (train.max_tokens in the paper recipes), in student tokens
LOSS_BYTES = 2  # float16 per teacher window position but the first (teacher_cache.py)
OFFSET_BYTES = 4  # uint32 per block (teacher_cache.py)
# score-teacher's GPU-hours at its measured pace: 60.7% of an H100's dense bf16 peak, Qwen2.5-Math-7B's forward
# compiled (`score-teacher`'s default on a GPU) at batch 8 and window 2560 (`benchmarks/bench_mfu.py --device cuda
# --compile`, docs/performance.md); 48.7% eager.
SCORING_FLOPS = 0.607 * 989e12


def limited(segments: Iterable[Segment], max_chars: int, sampled: list[int]) -> Iterator[Segment]:
    """`segments` until they hold `max_chars` characters (the segment that crosses it included); adds the UTF-8 bytes
    of their text to `sampled[0]` (a document may be cut: its whole size would overstate the sample)."""
    chars = 0
    for segment in segments:
        yield segment
        chars += len(segment.text)
        sampled[0] += len(segment.text.encode("utf-8"))
        if chars >= max_chars:
            return


def jsonl_text_share(path: Path, keys: list[str], max_bytes: int) -> float:
    """UTF-8 bytes of the records' text per byte of line, over the first `max_bytes` of a .jsonl file."""
    text = lines = 0
    with open(path, "rb") as f:
        for line in f:
            lines += len(line)
            try:
                record = json.loads(line)
                text += len(FIELD_SEPARATOR.join(str(record[key]) for key in keys if key in record).encode("utf-8"))
            except (ValueError, TypeError):
                pass  # prepare skips it too
            if lines >= max_bytes:
                break
    return text / max(lines, 1)


def text_bytes(path: Path, keys: list[str]) -> int:
    """About how many UTF-8 bytes of document text `path` holds, read from its size or its metadata."""
    if path.suffix == ".parquet":
        metadata = pq.read_metadata(path)
        columns = [metadata.schema.names.index(key) for key in keys]
        size = sum(
            metadata.row_group(g).column(c).total_uncompressed_size
            for g in range(metadata.num_row_groups)
            for c in columns
        )
        # PLAIN encoding puts a 4-byte length before each string; page headers and statistics (a page's smallest and
        # largest string, whole) stay in: 0.5% more than the text in row groups of 200 math documents (3 KB each),
        # 3.5% in groups of 25.
        return size - 4 * len(columns) * metadata.num_rows
    if path.suffix == ".jsonl":
        return round(path.stat().st_size * jsonl_text_share(path, keys, SAMPLE_CHARS))
    return path.stat().st_size


def teacher_flops_per_token(teacher: Path) -> Optional[float]:
    """2 x the teacher's matrix parameters (its head included, its embedding table not), from a LitGPT checkpoint's
    model_config.yaml; None without one."""
    import torch  # with LitGPT, only for this count: the rest of the dry run, and `prepare`, need neither
    from litgpt.config import Config
    from litgpt.model import GPT

    config_file = Path(teacher) / "model_config.yaml"
    if not config_file.is_file():
        return None
    with torch.device("meta"):  # shapes only, no memory
        model = GPT(Config.from_file(config_file))
    return 2.0 * sum(p.numel() for name, p in model.named_parameters() if p.ndim == 2 and "wte" not in name)


@dataclass(frozen=True)
class Packing:
    """How `vocagnolm prepare` packs blocks: both tokenizers, the block's student tokens (max_seq_length + 1), the
    teacher window's cap and the arrays' dtypes (`packing.pack_blocks`)."""

    student: TokenizerInfo
    teacher: TokenizerInfo
    block_tokens: int
    teacher_max_length: int
    dtypes: BlockDtypes


def measure_prepare(
    files: list[Path],
    keys: list[str],
    packing: Packing,
    *,
    val_fraction: Optional[float] = None,
    num_workers: int = 1,
    teacher_dir: Optional[Path] = None,
    max_tokens: float = PAPER_TOKENS,
) -> dict:
    """Measures prepare's work on the first SAMPLE_CHARS characters of `files` and extrapolates it to all of them.

    Returns:
        The measured and extrapolated figures, by name (what `format_dry_run` prints).
    """
    student, teacher, block_tokens = packing.student, packing.teacher, packing.block_tokens
    sample = Unit(0, tuple(piece for path in files for piece in file_pieces(path, 1 << 62)), 0)
    stats, sampled, block_bytes, window_tokens = Stats(), [0], 0, 0
    start = time.perf_counter()
    segments = limited(split_documents(sample, keys, "train", None, stats), SAMPLE_CHARS, sampled)
    streams = aligned_streams(segments, student, teacher, stats)
    for block in pack_blocks(streams, block_tokens, packing.teacher_max_length, packing.dtypes, stats):
        block_bytes += sum(value.nbytes for value in block.values() if isinstance(value, np.ndarray)) + 8  # + num_bytes
        window_tokens += len(block["teacher_ids"])
    seconds = time.perf_counter() - start
    if stats.student_tokens == 0:
        raise InvalidArgument("--dry_run found no readable document in the input: nothing to measure.")
    input_bytes = sum(text_bytes(path, keys) for path in files)
    scale = input_bytes / sampled[0]  # the input per sampled byte of text
    student_tokens = stats.student_tokens * scale
    train_share = 1 - (val_fraction or 0)
    trained_tokens = student_tokens * train_share * (block_tokens - 1) / block_tokens  # inputs, not the extra target
    cache_bytes = (LOSS_BYTES * (window_tokens - stats.blocks) + OFFSET_BYTES * stats.blocks) * scale
    flops = None if teacher_dir is None else teacher_flops_per_token(teacher_dir)
    return {
        "sample_documents": stats.documents,
        "sample_bytes": sampled[0],
        "sample_student_tokens": stats.student_tokens,
        "sample_seconds": seconds,
        "tokens_per_second_per_worker": stats.student_tokens / seconds,
        "bytes_per_student_token": sampled[0] / stats.student_tokens,
        "teacher_per_student_token": stats.teacher_tokens / stats.student_tokens,
        "shard_bytes_per_student_token": block_bytes / stats.student_tokens,
        "input_text_bytes": input_bytes,
        "student_tokens": student_tokens,
        "teacher_window_tokens": window_tokens * scale,
        "prepare_hours": seconds * scale / num_workers / 3600,
        "num_workers": num_workers,
        "max_tokens": max_tokens,
        "passes": max_tokens / trained_tokens,
        "shard_bytes": block_bytes * scale,
        "cache_bytes": cache_bytes,
        "teacher_flops": None if flops is None else flops * window_tokens * scale,
    }


def scaled(value: float, unit: str) -> str:
    """`value` with the SI prefix that keeps it below 1000: scaled(2.5e9, "B") == "2.50 GB"."""
    for power, prefix in reversed(list(enumerate("kMGTPE", 1))):
        if value >= 1000**power:
            return f"{value / 1000**power:.2f} {prefix}{unit}"
    return f"{value:.0f} {unit}"


def tokens(value: float, what: str) -> str:
    """A token count: tokens(1.5e10, "student") == "15.00B student tokens"."""
    for factor, suffix in ((1e9, "B"), (1e6, "M")):
        if value >= factor:
            return f"{value / factor:.2f}{suffix} {what} tokens"
    return f"{value:,.0f} {what} tokens"


def hours(value: float) -> str:
    return f"{value:,.1f} h" if value >= 1 else f"{60 * value:.1f} min"


def format_dry_run(figures: dict) -> str:
    f = figures
    per_gb = 1e9 / f["input_text_bytes"]
    lines = [
        f"Measured on the input's first {scaled(f['sample_bytes'], 'B')} of text ({f['sample_documents']:,} documents,"
        f" {f['sample_student_tokens']:,} student tokens) in {f['sample_seconds']:.1f} s, one worker:",
        f"  {f['tokens_per_second_per_worker']:,.0f} student tokens/s per worker (read, tokenize both, align, pack)",
        f"  {f['bytes_per_student_token']:.2f} bytes of text per student token,"
        f" {f['teacher_per_student_token']:.3f} teacher tokens per student token",
        f"  {f['shard_bytes_per_student_token']:.2f} bytes of shards per student token",
        f"  per GB of text: {tokens(per_gb * f['student_tokens'], 'student')},"
        f" {per_gb * f['prepare_hours'] * f['num_workers']:.2f} worker-hours, {scaled(per_gb * f['shard_bytes'], 'B')}"
        f" of shards, {scaled(per_gb * f['cache_bytes'], 'B')} of loss cache",
        f"The whole input, about {scaled(f['input_text_bytes'], 'B')} of text:",
        f"  {tokens(f['student_tokens'], 'student')}, {tokens(f['teacher_window_tokens'], 'teacher')} in the blocks'"
        " windows",
        f"  prepare: {hours(f['prepare_hours'])} with {f['num_workers']} workers"
        f" ({hours(f['prepare_hours'] * f['num_workers'])} on one; LitData's writing comes on top)",
        f"  disk: {scaled(f['shard_bytes'], 'B')} of shards, {scaled(f['cache_bytes'], 'B')} of `score-teacher`'s"
        " loss cache",
        f"  {tokens(f['max_tokens'], 'training')} (the paper's budget) make {f['passes']:.2f} passes over the train"
        " split",
    ]
    if f["teacher_flops"] is not None:
        lines.append(
            f"  `score-teacher`: one teacher forward over every window, {scaled(f['teacher_flops'], 'FLOP')}"
            f" (2 x its matrix parameters per token): {hours(f['teacher_flops'] / SCORING_FLOPS / 3600)} of one GPU at"
            f" {scaled(SCORING_FLOPS, 'FLOP/s')} (measured on an H100, compiled as by default:"
            " docs/performance.md)"
        )
    return "\n".join(lines)
