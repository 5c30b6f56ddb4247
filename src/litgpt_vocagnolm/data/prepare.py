"""`vocagnolm prepare`: tokenize text with both tokenizers, align, and write LitData shards, once.

Aligning inside the training loop would take CPU from the GPUs and redo the same work on every run, so `prepare`
tokenizes every document with both tokenizers, aligns them and packs them into student blocks with their teacher
windows (packing.py), written by `litdata.optimize` over work units (documents.py) into OUTPUT/val and OUTPUT/train,
then OUTPUT/manifest.json with the format version, the tokenizers' hashes, the settings and the counts
(docs/design.md, "Prepared data"). Each unit ends in one padded block (at most about 0.4% padding).

Resumable: an unfinished run works in OUTPUT/.partial and each finished split is recorded there (with its index's
hash); a run with the same settings finishes the work, a run with other settings is refused, and the data appears
(split by split, the manifest last) only once complete. The settings hold each input file's size and content hash
(`files.file_fingerprint`), so an edited file is seen. Ctrl-C stops the workers and exits 130 (cli.py), leaving
.partial to the next run. OUTPUT is held for the run (`files.hold_folder`): a second `prepare` into it is refused; a
full disk ends in one line (`errors.failed_writes`) and the next run keeps the finished splits.

Stages: the checks (`check_numbers`, `find_inputs`), the run's start (`start_run`), its splits (`write_splits`), the
publishing (`publish`), the summary (`print_summary`).
"""

import dataclasses
import functools
import json
import math
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Union

import numpy as np

from litgpt_vocagnolm.alignment.lexical import encode, token_byte_lengths
from litgpt_vocagnolm.alignment.tokenizer_files import (
    TokenizerInfo,
    find_tokenizer_file,
    load_tokenizer,
    same_vocabulary,
    tokenizer_info,
    tokenizer_sha256,
)
from litgpt_vocagnolm.data.documents import (
    Stats,
    Unit,
    check_input_file,
    find_input_files,
    hash_threshold,
    nothing_readable,
    parse_text_key,
    plan_units,
    read_documents,
    smallest_hash,
    split_documents,
)
from litgpt_vocagnolm.data.dry_run import Packing, format_dry_run, measure_prepare
from litgpt_vocagnolm.data.manifest import FORMAT, MANIFEST, PARTIAL, SPLITS, output_progress
from litgpt_vocagnolm.data.packing import BlockDtypes, aligned_streams, pack_blocks
from litgpt_vocagnolm.errors import InvalidArgument, at_least, check_writable, failed_writes
from litgpt_vocagnolm.files import file_fingerprint, file_sha256, hold_folder, write_json

LITDATA_CHUNK_BYTES = "64MB"  # LitData's chunk (file) size; each worker holds one in memory while it fills it
RATIO_SAMPLE_CHARS = 1 << 16  # text encoded up front to measure the teacher/student token ratio
TEACHER_HEADROOM = 1.25  # default teacher_max_length = block tokens x measured token ratio x this


@dataclass(frozen=True)
class UnitJob:
    """What every work unit of a split needs (pickled to LitData's workers)."""

    student: TokenizerInfo
    teacher: TokenizerInfo
    keys: tuple[str, ...]
    block_tokens: int
    """Student tokens per block: max_seq_length + 1."""
    teacher_max_length: int
    dtypes: BlockDtypes
    val_threshold: Optional[int]
    """Keep the documents the hash rule puts in `split` (val: hash below this); None keeps every one (`--val_input`)."""
    split: str = ""
    stats_dir: str = ""


def unit_blocks(unit: Unit, job: UnitJob) -> Iterator[dict[str, Any]]:
    """The blocks of one work unit: the function `litdata.optimize` runs. Writes the unit's Stats when done."""
    stats = Stats()
    segments = split_documents(unit, list(job.keys), job.split, job.val_threshold, stats)
    streams = aligned_streams(segments, job.student, job.teacher, stats)
    yield from pack_blocks(streams, job.block_tokens, job.teacher_max_length, job.dtypes, stats)
    write_json(Path(job.stats_dir) / f"unit-{unit.index:06d}.json", asdict(stats))


def read_stats(path: Path) -> Stats:
    """A unit's or a split's counts (a split's record also holds its index's hash: `split_finished`)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    data.pop("index_sha256", None)
    return Stats(**{**data, "skipped_files": [tuple(f) for f in data["skipped_files"]]})


def write_split(split: str, units: list[Unit], job: UnitJob, partial: Path, num_workers: int) -> Stats:
    """Runs `litdata.optimize` over `units` into `partial/split`; returns the split's Stats (no documents: the caller
    says why)."""
    # LitData, and torch with it (2-3 s of CPU), loads only here: `prepare`'s checks and refusals answer without it.
    from litdata import optimize

    from litgpt_vocagnolm.data.workers import START_METHOD, optimize_environment

    shards, stats_dir, cache = partial / split, partial / "stats" / split, partial / "cache"
    for folder in (shards, stats_dir, cache):
        shutil.rmtree(folder, ignore_errors=True)
    stats_dir.mkdir(parents=True)
    job = dataclasses.replace(job, split=split, stats_dir=str(stats_dir))
    print(f"Writing the {split} split: {len(units)} work units, {sum(u.weight for u in units) / 1e6:.1f} MB of input.")
    with optimize_environment(cache):
        try:
            optimize(
                fn=functools.partial(unit_blocks, job=job),
                inputs=units,
                output_dir=str(shards),
                weights=[unit.weight for unit in units],
                num_workers=min(num_workers, len(units)),
                chunk_bytes=LITDATA_CHUNK_BYTES,
                reorder_files=False,
                start_method=START_METHOD,
            )
        except Exception:
            stats = split_stats(units, stats_dir)
            if stats is not None and stats.documents == 0:
                return stats  # LitData fails to write an index for an empty split
            raise
    stats = split_stats(units, stats_dir)
    if stats is None:
        raise RuntimeError(f"Some work units of the {split} split did not write their counts to {stats_dir}.")
    shutil.rmtree(cache, ignore_errors=True)
    return stats


def split_stats(units: list[Unit], stats_dir: Path) -> Optional[Stats]:
    """The sum of the units' Stats, or None if some unit did not finish."""
    files = sorted(stats_dir.glob("unit-*.json"))
    return sum(map(read_stats, files), Stats()) if len(files) == len(units) else None


def measure_token_ratio(units: list[Unit], keys: list[str], student: TokenizerInfo, teacher: TokenizerInfo) -> float:
    """Teacher tokens per student token over the first RATIO_SAMPLE_CHARS characters of the input."""
    student_tokenizer, teacher_tokenizer = load_tokenizer(student.path), load_tokenizer(teacher.path)
    num_student = num_teacher = num_chars = 0
    for piece in (piece for unit in units for piece in unit.pieces):
        for document in read_documents(piece, keys, Stats()):
            text = ""
            for chunk in document.chunks:  # no more of a long document than the sample needs
                text += chunk
                if len(text) >= RATIO_SAMPLE_CHARS - num_chars:
                    break
            text = text[: RATIO_SAMPLE_CHARS - num_chars]
            num_student += len(encode(student_tokenizer, text)[0])
            num_teacher += len(encode(teacher_tokenizer, text)[0])
            num_chars += len(text)
            if num_chars >= RATIO_SAMPLE_CHARS:
                return num_teacher / max(num_student, 1)
    return num_teacher / num_student if num_student else 1.0


def smallest_hash_threshold(units: list[Unit], keys: list[str], skipped_files: list, val_fraction: float) -> int:
    """A hash threshold for a val split that the hash rule left empty: the document with the smallest hash (and its
    copies) goes there, the same on every run, and the splits still share no text. Needs two different documents."""
    stats = Stats()
    smallest, copies = smallest_hash(units, keys, stats)
    if smallest is None:
        raise InvalidArgument(nothing_readable("--input", skipped_files, stats))
    if copies == stats.documents:
        raise InvalidArgument(
            f"--input holds {stats.documents} readable document{'s, all the same text' if copies > 1 else ''}: give"
            " two different documents at least (one is kept for validation), or --val_input."
        )
    print(
        f"--val_fraction {val_fraction} put none of the {stats.documents} documents in the val split: it gets the one"
        f" with the smallest hash{f' (and its {copies - 1} copies)' if copies > 1 else ''}."
    )
    return smallest + 1


def block_settings(
    units: list[Unit],
    keys: list[str],
    student: TokenizerInfo,
    teacher: TokenizerInfo,
    block_tokens: int,
    teacher_max_length: Optional[int],
) -> dict:
    """The teacher window's cap (from the measured token ratio unless given) and the dtypes the blocks are stored as."""
    ratio = measure_token_ratio(units, keys, student, teacher)
    cap = teacher_max_length or math.ceil(block_tokens * ratio * TEACHER_HEADROOM)
    dtypes = BlockDtypes.fitting(student.vocab_size, teacher.vocab_size, cap)
    return {"token_ratio": ratio, "teacher_max_length": cap, "dtypes": dtypes._asdict()}


def usable_teacher_max_length(teacher_max_length: int, block_tokens: int, student_file: Path) -> int:
    """`--teacher_max_length`, or, with a note, the most teacher tokens a block's text can hold: block_tokens times one
    more than the student's longest token in bytes (every teacher token covers a byte or more, but for one special
    token per student token at most). A larger window is padding that every batch of every run would carry."""
    most = block_tokens * (int(token_byte_lengths(load_tokenizer(student_file)).max()) + 1)
    if teacher_max_length > most:
        print(
            f"--teacher_max_length {teacher_max_length:,} capped at {most:,}: the most teacher tokens a block of"
            f" {block_tokens:,} student tokens can hold."
        )
    return min(teacher_max_length, most)


def prepare(
    *,
    student: Path,
    teacher: Path,
    input: Union[list[Path], Path],
    output: Path,
    max_seq_length: int = 2048,
    teacher_max_length: Optional[int] = None,
    num_workers: Optional[int] = None,
    text_key: str = "text",
    val_fraction: Optional[float] = None,
    val_input: Optional[Union[list[Path], Path]] = None,
    dry_run: bool = False,
) -> None:
    """Tokenize text with both tokenizers, align them and pack it into LitData shards for `--data VocAgnoData`.

    Writes OUTPUT/train and OUTPUT/val (LitData shards of student blocks with teacher windows and ranges) and
    OUTPUT/manifest.json (tokenizer hashes, settings, counts). Running it again with the same settings does nothing;
    after an interruption it finishes the work.

    Arguments:
        student: The student's LitGPT checkpoint dir, tokenizer dir or tokenizer.json.
        teacher: The teacher's LitGPT checkpoint dir, tokenizer dir or tokenizer.json.
        input: A file or directory, or a list of them (`--input [a,b]`); directories are searched recursively for .txt
            (one document per file), .jsonl (one per line) and .parquet (one per row, e.g. OpenWebMath) files.
            Documents of any length: long ones are tokenized in segments (`documents.segments`).
        output: A new or empty directory, writable.
        max_seq_length: Student tokens per training sequence, at least 1; blocks hold one more (inputs and shifted
            targets).
        teacher_max_length: Teacher tokens per block at most, at least 1; student tokens whose teacher tokens lie
            beyond are unmapped (counted in the manifest). Above what a block's text can hold (max_seq_length + 1
            times one more than the student's longest token in bytes) it is capped there, with a note. Default:
            max_seq_length + 1 times the teacher/student token ratio measured on the input, plus 25%.
        num_workers: Worker processes, at least 1. Default: one per CPU.
        text_key: The field holding the text in .jsonl and .parquet records; several, comma-separated (e.g.
            question,answer), are joined with a blank line between them.
        val_fraction: Share of the documents for validation, above 0 and below 1, chosen by a hash of their text (so
            the same on every run); if that leaves none, the document with the smallest hash. Default: 0.01, unless
            --val_input is given.
        val_input: Files or directories (as --input) for validation instead of a share of --input.
        dry_run: Write nothing: prepare the input's first 2M characters in this process, time it, and print what the
            whole input will take (hours at --num_workers, tokens, passes 15B tokens make, disk for the shards and
            the teacher loss cache).
    """
    val_fraction = check_numbers(max_seq_length, teacher_max_length, num_workers, val_fraction, bool(val_input))
    if not dry_run:
        check_writable(output, "--output")
    inputs = find_inputs(input, val_input, parse_text_key(text_key), student, teacher)
    if teacher_max_length is not None:
        teacher_max_length = usable_teacher_max_length(teacher_max_length, max_seq_length + 1, inputs.student_file)
    num_workers = num_workers or os.cpu_count() or 1
    if dry_run:
        return print_dry_run(inputs, max_seq_length, teacher_max_length, val_fraction, num_workers, teacher)
    settings = recorded_settings(inputs, max_seq_length, teacher_max_length, val_fraction)
    output = Path(output)
    rerun = f"run the same command again: it keeps what {output / PARTIAL} holds of the finished splits"
    with failed_writes(output, None, rerun), hold_folder(output, "vocagnolm prepare"):
        progress = output_progress(output, settings)
        if progress == "done":
            print(f"{output} already holds this data, prepared with the same settings: nothing to do.")
            return
        run = start_run(output, settings, inputs, progress == "resume", num_workers)
        write_splits(run)
        manifest = publish(run)
    print_summary(output, manifest)


@dataclass(frozen=True)
class Inputs:
    """The files `prepare` reads, found and checked before any work (`find_inputs`)."""

    files: list[Path]
    skipped: list[tuple[str, str]]
    val_files: list[Path]
    val_skipped: list[tuple[str, str]]
    separate_val: bool
    """--val_input was given: the val split is its files, not a share of --input."""
    keys: list[str]
    student_file: Path
    teacher_file: Path


@dataclass
class Run:
    """One `prepare` into OUTPUT/.partial (`start_run`): what its splits are written with (`write_splits`)."""

    output: Path
    settings: dict
    derived: dict
    inputs: Inputs
    units: dict[str, list[Unit]]
    job: UnitJob
    num_workers: int

    @property
    def partial(self) -> Path:
        return self.output / PARTIAL


def check_numbers(
    max_seq_length: int,
    teacher_max_length: Optional[int],
    num_workers: Optional[int],
    val_fraction: Optional[float],
    separate_val: bool,
) -> Optional[float]:
    """Refuses a number out of range; returns the val fraction (its default without --val_input, else None)."""
    at_least("--max_seq_length", max_seq_length, 1)
    if teacher_max_length is not None:
        at_least("--teacher_max_length", teacher_max_length, 1)
    if num_workers is not None:
        at_least("--num_workers", num_workers, 1)
    if separate_val and val_fraction is not None:
        raise InvalidArgument("Give --val_fraction or --val_input, not both.")
    if separate_val:
        return None
    val_fraction = 0.01 if val_fraction is None else val_fraction
    if not 0 < val_fraction < 1:
        raise InvalidArgument(f"--val_fraction must lie between 0 and 1, got {val_fraction}.")
    return val_fraction


def find_inputs(
    input: Union[list[Path], Path],
    val_input: Optional[Union[list[Path], Path]],
    keys: list[str],
    student: Path,
    teacher: Path,
) -> Inputs:
    """The input files (each checked to hold `keys`) and the tokenizer files; refuses a file in both splits."""
    files, skipped = find_input_files(input, "--input")
    val_files, val_skipped = find_input_files(val_input, "--val_input") if val_input else ([], [])
    if {f.resolve() for f in files} & {f.resolve() for f in val_files}:
        raise InvalidArgument("A file is in both --input and --val_input; validation text must not be trained on.")
    for path in files:
        check_input_file(path, keys, "--input")
    for path in val_files:
        check_input_file(path, keys, "--val_input")
    student_file, teacher_file = find_tokenizer_file(student), find_tokenizer_file(teacher)
    return Inputs(files, skipped, val_files, val_skipped, bool(val_input), keys, student_file, teacher_file)


def print_dry_run(
    inputs: Inputs,
    max_seq_length: int,
    teacher_max_length: Optional[int],
    val_fraction: Optional[float],
    num_workers: int,
    teacher: Path,
) -> None:
    """`--dry_run`: prepares the input's start in this process, times it, and prints what the whole will take."""
    student_info, teacher_info = tokenizer_info(inputs.student_file), tokenizer_info(inputs.teacher_file)
    units, block_tokens = plan_units(inputs.files), max_seq_length + 1
    derived = block_settings(units, inputs.keys, student_info, teacher_info, block_tokens, teacher_max_length)
    dtypes, cap = BlockDtypes(**derived["dtypes"]), derived["teacher_max_length"]
    packing = Packing(student_info, teacher_info, block_tokens, cap, dtypes)
    figures = measure_prepare(
        inputs.files, inputs.keys, packing, val_fraction=val_fraction, num_workers=num_workers, teacher_dir=teacher
    )
    print(format_dry_run(figures))


def recorded_settings(
    inputs: Inputs, max_seq_length: int, teacher_max_length: Optional[int], val_fraction: Optional[float]
) -> dict:
    """What the output records it was prepared from: a rerun with other settings is refused (`output_progress`)."""
    return {
        "format": FORMAT,
        "student": {"path": str(inputs.student_file.resolve()), "sha256": tokenizer_sha256(inputs.student_file)},
        "teacher": {"path": str(inputs.teacher_file.resolve()), "sha256": tokenizer_sha256(inputs.teacher_file)},
        "input": [file_fingerprint(p) for p in inputs.files],
        "val_input": [file_fingerprint(p) for p in inputs.val_files],
        "max_seq_length": max_seq_length,
        "teacher_max_length": teacher_max_length,
        "text_key": inputs.keys,
        "val_fraction": val_fraction,
    }


def start_run(output: Path, settings: dict, inputs: Inputs, resume: bool, num_workers: int) -> Run:
    """Starts a run in OUTPUT/.partial (the teacher window and dtypes measured, then recorded), or, with `resume`,
    reads the interrupted one's record; prints what it will write."""
    partial, block_tokens = output / PARTIAL, settings["max_seq_length"] + 1
    student_info, teacher_info = tokenizer_info(inputs.student_file), tokenizer_info(inputs.teacher_file)
    units = {"train": plan_units(inputs.files)}
    units["val"] = plan_units(inputs.val_files) if inputs.separate_val else units["train"]
    if resume:
        derived = json.loads((partial / "settings.json").read_text(encoding="utf-8"))["derived"]
        print(f"Finishing the interrupted run in {partial}.")
    else:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        derived = block_settings(
            units["train"], inputs.keys, student_info, teacher_info, block_tokens, settings["teacher_max_length"]
        )
        derived["val_threshold"] = None if inputs.separate_val else hash_threshold(settings["val_fraction"])
        write_json(partial / "settings.json", {"settings": settings, "derived": derived})
    files, skipped = inputs.files + inputs.val_files, inputs.skipped + inputs.val_skipped
    print(
        f"{len(files)} input files ({sum(p.stat().st_size for p in files) / 1e6:.1f} MB), {len(skipped)} skipped."
        f" Blocks of {block_tokens} student tokens with teacher windows of at most {derived['teacher_max_length']}"
        f" tokens (measured {derived['token_ratio']:.3f} teacher tokens per student token)."
    )
    for path, reason in skipped:
        print(f"  skipped {path}: {reason}")
    job = UnitJob(
        student=student_info,
        teacher=teacher_info,
        keys=tuple(inputs.keys),
        block_tokens=block_tokens,
        teacher_max_length=derived["teacher_max_length"],
        dtypes=BlockDtypes(**derived["dtypes"]),
        val_threshold=derived["val_threshold"],
    )
    return Run(output, settings, derived, inputs, units, job, num_workers)


def write_splits(run: Run) -> None:
    """Writes each split not yet finished (`split_finished`) into OUTPUT/.partial and records its counts there."""
    try:
        for split in SPLITS:
            if split_finished(run.output, split):
                print(f"The {split} split was written before the interruption.")
                continue
            stats = write_checked_split(run, split)
            index_sha256 = file_sha256(run.partial / split / "index.json")
            write_json(run.partial / f"{split}.json", {**asdict(stats), "index_sha256": index_sha256})
    except KeyboardInterrupt:
        print(f"Interrupted. The finished splits are kept in {run.partial}: run the same command again to finish.")
        raise


def write_checked_split(run: Run, split: str) -> Stats:
    """Writes `split` (`write_split`); an empty val split is written again with the document of the smallest hash;
    an empty split is refused, saying why."""
    inputs, val_fraction = run.inputs, run.settings["val_fraction"]
    stats = write_split(split, run.units[split], run.job, run.partial, run.num_workers)
    if stats.documents == 0 and split == "val" and not inputs.separate_val:
        run.derived["val_threshold"] = smallest_hash_threshold(
            run.units["val"], inputs.keys, inputs.skipped, val_fraction
        )
        write_json(run.partial / "settings.json", {"settings": run.settings, "derived": run.derived})
        run.job = dataclasses.replace(run.job, val_threshold=run.derived["val_threshold"])
        stats = write_split(split, run.units[split], run.job, run.partial, run.num_workers)
    if stats.documents == 0 and split == "train" and not inputs.separate_val:
        raise InvalidArgument(
            f"The train split is empty: --val_fraction {val_fraction} put all"
            f" {read_stats(run.partial / 'val.json').documents} documents in the val split. Lower it."
        )
    if stats.documents == 0:
        flag, skipped = ("--val_input", inputs.val_skipped) if split == "val" else ("--input", inputs.skipped)
        raise InvalidArgument(nothing_readable(flag, skipped, stats))
    return stats


def split_finished(output: Path, split: str) -> bool:
    """Whether a split was written whole: its counts recorded in OUTPUT/.partial with the hash of the index it wrote,
    and that index (in .partial, or published) unchanged. A split whose shards another run replaced or deleted (two
    runs at once, before folders were locked) is written again, not published without its index."""
    record, folder = output / PARTIAL / f"{split}.json", output / PARTIAL / split
    index = (folder if folder.exists() else output / split) / "index.json"
    if not record.is_file() or not index.is_file():
        return False
    return json.loads(record.read_text(encoding="utf-8")).get("index_sha256") == file_sha256(index)


def publish(run: Run) -> dict:
    """Moves the splits out of OUTPUT/.partial, then writes the manifest: each rename is atomic and the manifest comes
    last, so a run killed in between is finished by the next. Returns the manifest."""
    output, partial, inputs = run.output, run.partial, run.inputs
    stats = {split: read_stats(partial / f"{split}.json") for split in SPLITS}
    for split in SPLITS:
        if (partial / split).exists():
            shutil.rmtree(output / split, ignore_errors=True)  # an older copy (two runs at once, before locks)
            os.replace(partial / split, output / split)
    student, teacher = run.job.student, run.job.teacher
    skipped = inputs.skipped + inputs.val_skipped
    manifest = build_manifest(output, run.settings, run.derived, student, teacher, stats, skipped, inputs.separate_val)
    write_json(partial / MANIFEST, manifest)
    os.replace(partial / MANIFEST, output / MANIFEST)
    shutil.rmtree(partial)
    return manifest


def build_manifest(
    output: Path,
    settings: dict,
    derived: dict,
    student: TokenizerInfo,
    teacher: TokenizerInfo,
    stats: dict[str, Stats],
    skipped_files: list[tuple[str, str]],
    separate_val_input: bool,
) -> dict:
    splits = {}
    for split, counts in stats.items():
        shard_bytes = sum(p.stat().st_size for p in (output / split).glob("*.bin"))
        splits[split] = {
            **counts.counts(),
            "mapped_share": counts.mapped / max(counts.targets, 1),
            "shard_bytes": shard_bytes,
            "bytes_per_student_token": shard_bytes / max(counts.student_tokens, 1),
            "index_sha256": file_sha256(output / split / "index.json"),
        }
    # Both passes read every --input file when the split is by hash: count its skipped records once.
    skips = stats["train"] + stats["val"] if separate_val_input else stats["train"]
    dtypes = BlockDtypes(**derived["dtypes"])
    total = stats["train"] + stats["val"]
    return {
        "format": FORMAT,
        "settings": settings,
        "student": asdict(student),
        "teacher": asdict(teacher),
        "same_vocabulary": same_vocabulary(load_tokenizer(student.path), load_tokenizer(teacher.path)),
        "max_seq_length": settings["max_seq_length"],
        "block_size": settings["max_seq_length"] + 1,
        "teacher_max_length": derived["teacher_max_length"],
        "token_ratio": derived["token_ratio"],
        "dtypes": dtypes._asdict(),
        "alignment_bytes_per_student_token": np.dtype(dtypes.starts).itemsize + 1,
        "bytes_per_student_token": sum(s["shard_bytes"] for s in splits.values()) / max(total.student_tokens, 1),
        "mapped_share": total.mapped / max(total.targets, 1),
        "splits": splits,
        "skipped_files": [list(f) for f in skipped_files + skips.skipped_files],
        "skipped_records": skips.skipped_records,
        "skipped_examples": skips.examples,
    }


def print_summary(output: Path, manifest: dict) -> None:
    for split, s in manifest["splits"].items():
        print(
            f"{split}: {s['documents']:,} documents, {s['characters']:,} characters, {s['student_tokens']:,} student"
            f" and {s['teacher_tokens']:,} teacher tokens in {s['blocks']:,} blocks; {s['mapped_share']:.2%} of its"
            f" {s['targets']:,} prediction targets (every token but the BOS and each block's first) mapped to teacher"
            f" tokens, {s['overflow_unmapped']:,} unmapped for lack of room in the teacher window."
        )
    skipped = sum(manifest["skipped_records"].values())
    print(
        f"{len(manifest['skipped_files'])} files and {skipped:,} records skipped"
        + "".join(f"\n  {reason}: {n:,}" for reason, n in manifest["skipped_records"].items())
    )
    print(
        f"{manifest['bytes_per_student_token']:.2f} bytes per student token on disk"
        f" ({manifest['alignment_bytes_per_student_token']} for the alignment). Wrote {output / MANIFEST}."
    )
