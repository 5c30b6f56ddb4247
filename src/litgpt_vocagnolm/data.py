"""Precomputed aligned data: `vocagnolm prepare` writes LitData shards once, `VocAgnoData` streams them to training.

Aligning inside the training loop would take CPU from the GPUs and redo the same work on every run, so `prepare`
tokenizes every document with both tokenizers, aligns the two (`alignment.align_batch`), packs the documents into
student blocks of `max_seq_length + 1` tokens and stores each block with its teacher window and ranges (DESIGN.md §4).
The input is cut into about 256 work units (1 to 64 MB of text each, whatever the number of workers, so the data comes
out the same) that `litdata.optimize` spreads over worker processes; each unit packs its own documents, so each ends
in one padded block (at most about 0.4% padding).

Documents. Each tokenizer adds BOS/EOS per document as its tokenizer_config.json says (`add_bos_token`,
`add_eos_token`; Llama adds BOS only). A tokenizer configured to add neither (Qwen2.5) ends each document with its EOS
instead, so that both sides still see where documents meet. Added tokens are unmapped, and no student token maps into
another document.

A block, as stored (one LitData item; n <= max_seq_length + 1, shorter only for the last block of a unit):
    student_ids    (n,) uint16, or uint32 for a vocabulary over 65536
    teacher_ids    (m,) uint16 or uint32: the teacher window, the teacher tokens covering the block's characters, with
                   the teacher's BOS/EOS at its documents' edges; m <= teacher_max_length
    range_starts   (n,) uint16 (uint32 if teacher_max_length > 65536): first teacher token of each student token's
                   range, relative to the window
    range_lengths  (n,) uint8, the range's length; 0 = unmapped (added tokens, and tokens whose teacher tokens lie
                   past teacher_max_length or number more than 255)
    num_bytes      int, the UTF-8 bytes of the text that the block's target tokens (positions 1..n-1) cover
The alignment costs 3 bytes per student token; manifest.json states what the shards cost per student token in all.
`iter_blocks` and the loaders decode blocks to the plain form: `ranges` (T + 1, 2) of `[a, b)` window positions.
"""

import dataclasses
import functools
import hashlib
import json
import math
import multiprocessing
import os
import shutil
import signal
import sys
from collections import Counter
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Iterator, Literal, NamedTuple, Optional, Union

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import litdata.helpers
from litdata import StreamingDataLoader, StreamingDataset, optimize
from litdata.streaming.sampler import ChunkedIndex
from litgpt.data import DataModule
from tokenizers import Tokenizer

from litgpt_vocagnolm.alignment import (
    align_batch,
    chunk_align,
    encode,
    encode_batch,
    find_tokenizer_file,
    load_tokenizer,
    read_tokenizer_json,
)

# LitData asks PyPI for a newer version of itself whenever a dataset is written or opened (30 s timeout): a network
# call in every run and loader worker, which stalls firewalled cluster nodes. Nothing here should reach the network.
litdata.helpers._get_newer_version = lambda version: None

FORMAT = "vocagnolm-blocks/1"
MANIFEST = "manifest.json"
PARTIAL = ".partial"  # where an unfinished `prepare` works; renamed into place at the end
SPLITS = ("val", "train")  # written in this order: the small split first, so an empty one fails fast
SUFFIXES = (".txt", ".jsonl", ".parquet")
FIELD_SEPARATOR = "\n\n"  # joins the fields of `--text_key question,answer`, as paragraphs
UNITS = 256  # work units to cut the input into, so that many workers stay busy to the end
UNIT_BYTES = (1 << 20, 64 << 20)  # bounds on a unit's input; each unit ends in one padded block (0.4% of 1 MB)
BATCH_CHARS = 1 << 18  # text tokenized per `encode_batch` call inside a unit
CHUNK_BYTES = "64MB"  # LitData chunk size; each worker holds one chunk in memory while it fills
RATIO_SAMPLE_CHARS = 1 << 16  # text encoded up front to measure the teacher/student token ratio
TEACHER_HEADROOM = 1.25  # default teacher_max_length = block size x measured token ratio x this
MAX_RANGE_LENGTH = 255  # range_lengths is uint8


# ----------------------------------------------------------------------------------------------------------------
# Tokenizers


@dataclass(frozen=True)
class TokenizerInfo:
    """What a prepared dataset records of one tokenizer."""

    path: str
    """The file `find_tokenizer_file` returns."""
    sha256: str
    vocab_size: int
    bos_id: Optional[int]
    """Added before each document, or None."""
    eos_id: Optional[int]
    """Added after each document, or None."""


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def tokenizer_sha256(file: Path) -> str:
    """sha256 of the tokenizer's JSON: a gzipped copy of a tokenizer hashes the same as the plain file."""
    return hashlib.sha256(read_tokenizer_json(file)).hexdigest()


def document_specials(tokenizer_file: Path, tokenizer: Tokenizer) -> tuple[Optional[int], Optional[int]]:
    """(BOS id or None, EOS id or None) that each document gets, as tokenizer_config.json next to the file says."""
    config_file = tokenizer_file.parent / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}

    def token_id(key: str) -> Optional[int]:
        token = config.get(key)
        content = token.get("content") if isinstance(token, dict) else token
        if content is None:
            return None
        id_ = tokenizer.token_to_id(content)
        if id_ is None:
            raise ValueError(f"{config_file}: {key} {content!r} is not in the vocabulary of {tokenizer_file}.")
        return id_

    bos_id, eos_id = token_id("bos_token"), token_id("eos_token")
    # Hugging Face's LlamaTokenizer adds BOS unless its config says otherwise; LitGPT's Tokenizer reads it the same way.
    add_bos = config.get("add_bos_token", config.get("tokenizer_class") == "LlamaTokenizer")
    add_eos = bool(config.get("add_eos_token"))
    if not add_bos and not add_eos:
        # Adds nothing (Qwen2.5): end each document with EOS, the separator such models saw in pretraining.
        add_eos, add_bos = eos_id is not None, eos_id is None and bos_id is not None
    wanted = ((add_bos, bos_id, "bos_token"), (add_eos, eos_id, "eos_token"))
    missing = [key for add, id_, key in wanted if add and id_ is None]
    if missing or not (add_bos or add_eos):
        raise ValueError(
            f"{tokenizer_file}: documents need a {' and '.join(missing) or 'bos_token or eos_token'} to keep them"
            f" apart, and {config_file} names none{'' if config_file.is_file() else ' (the file is missing)'}."
            " Put the tokenizer_config.json of this tokenizer next to it."
        )
    return (bos_id if add_bos else None), (eos_id if add_eos else None)


@functools.lru_cache(maxsize=4)
def cached_tokenizer(path: str) -> Tokenizer:
    """One load per process: LitData's forked workers inherit what `prepare` loaded."""
    return load_tokenizer(path)


def tokenizer_info(file: Path) -> TokenizerInfo:
    path = str(file.resolve())
    tokenizer = cached_tokenizer(path)
    bos_id, eos_id = document_specials(file, tokenizer)
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    return TokenizerInfo(path, tokenizer_sha256(file), vocab_size, bos_id, eos_id)


def same_vocabulary(student: TokenizerInfo, teacher: TokenizerInfo) -> bool:
    """Whether both map the same token strings to the same ids (what `rho1` and `kld` need)."""
    if student.vocab_size != teacher.vocab_size:
        return False
    vocabularies = (cached_tokenizer(info.path).get_vocab(with_added_tokens=True) for info in (student, teacher))
    return next(vocabularies) == next(vocabularies)


# ----------------------------------------------------------------------------------------------------------------
# Reading documents


class Piece(NamedTuple):
    """A part of one input file: a .jsonl byte range of whole lines, a .parquet row group, or a whole .txt file."""

    path: str
    start: int
    """First byte (.jsonl, .txt) or row group (.parquet)."""
    stop: int
    weight: int
    """Bytes of text, about: how work is shared out."""


class Unit(NamedTuple):
    """One `litdata.optimize` input: pieces packed into blocks together."""

    index: int
    pieces: tuple[Piece, ...]
    weight: int


@dataclass
class Stats:
    """Counts of one unit, split or dataset; units write theirs to JSON and `prepare` sums them."""

    documents: int = 0
    characters: int = 0
    bytes: int = 0
    student_tokens: int = 0
    """Added tokens included, padding not."""
    teacher_tokens: int = 0
    """Of the documents, added tokens included (windows overlap a little, so blocks hold a few more)."""
    mapped: int = 0
    """Student tokens with a teacher range."""
    overflow_unmapped: int = 0
    """Student tokens left unmapped because their teacher tokens lay past teacher_max_length (or were over 255)."""
    blocks: int = 0
    padding: int = 0
    """Student positions padded in the last block of each unit."""
    skipped_records: dict[str, int] = field(default_factory=dict)
    """Reason -> count."""
    skipped_files: list[tuple[str, str]] = field(default_factory=list)
    """(path, reason)."""
    examples: list[str] = field(default_factory=list)
    """Where the first few skipped records are."""

    def skip(self, where: str, reason: str) -> None:
        self.skipped_records[reason] = self.skipped_records.get(reason, 0) + 1
        if len(self.examples) < 10:
            self.examples.append(f"{where}: {reason}")

    def counts(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.type is int}

    def __add__(self, other: "Stats") -> "Stats":
        counts = {name: count + other.counts()[name] for name, count in self.counts().items()}
        return Stats(
            **counts,
            skipped_records=dict(Counter(self.skipped_records) + Counter(other.skipped_records)),
            skipped_files=self.skipped_files + other.skipped_files,
            examples=(self.examples + other.examples)[:10],
        )


def parse_text_key(text_key: str) -> list[str]:
    keys = [key.strip() for key in text_key.split(",")]
    if not all(keys):
        raise ValueError(f"--text_key {text_key!r}: give one field name, or several separated by commas.")
    return keys


def record_text(record: Any, keys: list[str]) -> tuple[Optional[str], str]:
    """The document of a JSON or Parquet record: its `keys` fields joined by FIELD_SEPARATOR, or (None, why not)."""
    if not isinstance(record, dict):
        return None, "record is not a JSON object"
    values = []
    for key in keys:
        if key not in record:
            return None, f"missing field {key!r}"
        if not isinstance(record[key], str):
            return None, f"field {key!r} is {'null' if record[key] is None else 'not a string'}"
        values.append(record[key])
    return FIELD_SEPARATOR.join(values), ""


def find_input_files(paths: Union[list[Path], Path], flag: str) -> tuple[list[Path], list[tuple[str, str]]]:
    """The supported, non-empty files of `paths` (directories searched recursively, sorted), and the skipped ones."""
    files, skipped, seen = [], [], set()
    for path in map(Path, [paths] if isinstance(paths, (str, Path)) else paths):
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file())
            candidates = [p for p in found if p.suffix in SUFFIXES]
            if not candidates:
                raise ValueError(f"{flag} {path}: no {', '.join(SUFFIXES)} files in this directory or below it.")
            unsupported = [p for p in found if p.suffix not in SUFFIXES]
            skipped += [(str(p), f"unsupported file type {p.suffix or '(none)'!r}") for p in unsupported]
        elif path.is_file():
            if path.suffix not in SUFFIXES:
                raise ValueError(f"{flag} {path}: unsupported file type {path.suffix!r}; use {', '.join(SUFFIXES)}.")
            candidates = [path]
        else:
            raise FileNotFoundError(f"{flag} {path} does not exist.")
        for p in candidates:
            if p.resolve() in seen:
                raise ValueError(f"{flag}: {p} is given twice (directly or inside a directory); give it once.")
            seen.add(p.resolve())
            if p.stat().st_size == 0:
                skipped.append((str(p), "empty file (0 bytes)"))
            else:
                files.append(p)
    if not files:
        raise ValueError(f"{flag}: every file is empty ({', '.join(p for p, _ in skipped)}).")
    return files, skipped


def check_input_file(path: Path, keys: list[str], flag: str) -> None:
    """Fails fast when `--text_key` fields are not in the file's first record (.jsonl) or columns (.parquet)."""
    hint = "Name the document field(s) with --text_key, comma-separated to join several (e.g. question,answer)."
    if path.suffix == ".jsonl":
        with open(path, "rb") as f:
            line = next((line for line in f if line.strip()), b"")
        try:
            record = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ValueError(f"{flag} {path}: the first line is not a UTF-8 JSON record ({error}).") from None
        text, why = record_text(record, keys)
        if text is None:
            names = ", ".join(record) if isinstance(record, dict) else "none"
            raise ValueError(f"{flag} {path}: the first record fails, {why} (its fields: {names}). {hint}")
    elif path.suffix == ".parquet":
        schema = pq.read_schema(path)
        for key in keys:
            if key not in schema.names:
                raise ValueError(f"{flag} {path}: no column {key!r} (columns: {', '.join(schema.names)}). {hint}")
            if not (pa.types.is_string(schema.field(key).type) or pa.types.is_large_string(schema.field(key).type)):
                raise ValueError(f"{flag} {path}: column {key!r} holds {schema.field(key).type}, not text. {hint}")


def file_pieces(path: Path, unit_bytes: int) -> list[Piece]:
    if path.suffix == ".parquet":
        metadata = pq.read_metadata(path)
        return [
            Piece(str(path), g, g + 1, metadata.row_group(g).total_byte_size) for g in range(metadata.num_row_groups)
        ]
    size = path.stat().st_size
    if path.suffix == ".txt":  # one document
        return [Piece(str(path), 0, size, size)]
    # .jsonl: cut near every `unit_bytes`, at the start of the next line.
    cuts = [0]
    with open(path, "rb") as f:
        while cuts[-1] + unit_bytes < size:
            f.seek(cuts[-1] + unit_bytes - 1)
            f.readline()
            if f.tell() >= size:
                break
            cuts.append(f.tell())
    cuts.append(size)
    return [Piece(str(path), a, b, b - a) for a, b in zip(cuts, cuts[1:])]


def plan_units(files: list[Path]) -> list[Unit]:
    """Consecutive pieces of the input grouped into about UNITS units, each within UNIT_BYTES but the last."""
    unit_bytes = min(max(sum(path.stat().st_size for path in files) // UNITS, UNIT_BYTES[0]), UNIT_BYTES[1])
    units, pieces, weight = [], [], 0
    for piece in (piece for path in files for piece in file_pieces(path, unit_bytes)):
        pieces.append(piece)
        weight += piece.weight
        if weight >= unit_bytes:
            units.append(Unit(len(units), tuple(pieces), weight))
            pieces, weight = [], 0
    if pieces:
        units.append(Unit(len(units), tuple(pieces), weight))
    return units


def read_documents(piece: Piece, keys: list[str], stats: Stats) -> Iterator[str]:
    """The documents of `piece`, in file order; records that can't be read are counted in `stats` and skipped."""
    path = piece.path
    if path.endswith(".txt"):
        data = Path(path).read_bytes()
        try:
            yield data.decode("utf-8")
        except UnicodeDecodeError as error:
            stats.skipped_files.append((path, f"not UTF-8 (byte {error.start})"))
    elif path.endswith(".jsonl"):
        with open(path, "rb") as f:
            f.seek(piece.start)
            position = piece.start
            for line in f:
                if position >= piece.stop:
                    break
                where, position = f"{path}@{position}", position + len(line)
                if not line.strip():
                    continue
                try:
                    record = json.loads(line.decode("utf-8"))
                except UnicodeDecodeError:
                    stats.skip(where, "not UTF-8")
                    continue
                except json.JSONDecodeError:
                    stats.skip(where, "invalid JSON")
                    continue
                text, why = record_text(record, keys)
                if text is None:
                    stats.skip(where, why)
                else:
                    yield text
    else:
        rows = pq.ParquetFile(path).iter_batches(batch_size=1024, row_groups=[piece.start], columns=keys)
        for batch in rows:
            for values in zip(*(batch.column(key).to_pylist() for key in keys)):
                text, why = record_text(dict(zip(keys, values)), keys)
                if text is None:
                    stats.skip(f"{path} row group {piece.start}", why)
                else:
                    yield text


def in_val_split(data: bytes, val_fraction: float) -> bool:
    """Hash rule: the same text lands in the same split on every run and machine, duplicates included."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") < val_fraction * 2**64


# ----------------------------------------------------------------------------------------------------------------
# Aligned documents and blocks


class AlignedStream(NamedTuple):
    """Documents back to back, each with both tokenizers' added tokens: N student and M teacher tokens.

    Both sides hold the documents in the same order, so the teacher tokens covering any run of student tokens are one
    contiguous slice of `teacher_ids`, `[cover[p:q, 0].min(), cover[p:q, 1].max())`.
    """

    student_ids: np.ndarray
    """(N,) int32"""
    ranges: np.ndarray
    """(N, 2) int64 teacher ranges `[a, b)` into `teacher_ids`, within the token's own document; `(0, 0)` unmapped."""
    cover: np.ndarray
    """(N, 2) int64 where each token sits among the teacher tokens: its range if mapped, else the empty range after
    the teacher tokens of the tokens before it; a document's first and last token stretch to its edges, so that
    windows hold the teacher's added tokens."""
    token_bytes: np.ndarray
    """(N,) int64 UTF-8 bytes each token adds (see `token_bytes`)."""
    teacher_ids: np.ndarray
    """(M,) int32"""


def utf8_lengths(text: str) -> np.ndarray:
    """(L,) int64 UTF-8 length of each character (code point) of `text`."""
    if text.isascii():
        return np.ones(len(text), dtype=np.int64)
    code_points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)  # (L,)
    return 1 + (code_points >= 0x80).astype(np.int64) + (code_points >= 0x800) + (code_points >= 0x10000)


def token_bytes(text: str, offsets: np.ndarray, starts: Optional[np.ndarray] = None) -> np.ndarray:
    """(N,) int64 UTF-8 bytes of the characters each token ends that no earlier token of its document ended.

    Overlapping spans (the byte-fallback pieces of one character) count once, and a document's tokens sum to the bytes
    of its text up to its last token's end: summed over target tokens, the denominator of bits per byte. `text` may
    hold several documents back to back, `starts` (N,) giving the first character of each token's document; offsets
    are then relative to it.
    """
    starts = np.zeros(len(offsets), dtype=np.int64) if starts is None else starts
    ends = np.maximum.accumulate(offsets[:, 1] + starts)  # (N,) documents never overlap, so this stays per document
    before = np.maximum(np.concatenate([[0], ends[:-1]]), starts)  # (N,) end of the earlier tokens of the document
    cumulative = np.concatenate([[0], np.cumsum(utf8_lengths(text))])  # (L + 1,) bytes before each character
    return cumulative[ends] - cumulative[before]


def _added(token_id: Optional[int]) -> np.ndarray:
    return np.array([] if token_id is None else [token_id], dtype=np.int32)


def aligned_stream(
    texts: list[str],
    student: list[tuple[np.ndarray, np.ndarray]],
    teacher_ids: list[np.ndarray],
    ranges: list[np.ndarray],
    student_specials: tuple[Optional[int], Optional[int]],
    teacher_specials: tuple[Optional[int], Optional[int]],
) -> AlignedStream:
    """Documents back to back, each with both sides' BOS/EOS added.

    Arguments: per document, its text, the student's (ids, offsets) and the teacher's ids without added tokens, and
    `align`'s ranges between the two; the (BOS, EOS) ids each side adds (or None).
    """
    s_head, s_tail = map(_added, student_specials)
    t_head, t_tail = map(_added, teacher_specials)
    no_ranges = np.zeros((len(s_head), 2), np.int64), np.zeros((len(s_tail), 2), np.int64)

    def back_to_back(parts: Iterable[np.ndarray], head: np.ndarray, tail: np.ndarray) -> np.ndarray:
        return np.concatenate([piece for part in parts for piece in (head, part, tail)])

    student_counts = np.array([len(ids) for ids, _ in student]) + len(s_head) + len(s_tail)  # (D,)
    teacher_counts = np.array([len(ids) for ids in teacher_ids]) + len(t_head) + len(t_tail)  # (D,)
    document = np.repeat(np.arange(len(texts)), student_counts)  # (N,) each token's document
    teacher_start = (np.cumsum(teacher_counts) - teacher_counts)[document]  # (N,) its document's first teacher token
    # Ranges move past the teacher tokens of the documents before and the teacher's BOS; added tokens are unmapped.
    stream_ranges = back_to_back(ranges, *no_ranges)  # (N, 2)
    mapped = stream_ranges[:, 0] < stream_ranges[:, 1]  # (N,)
    stream_ranges[mapped] += (teacher_start + len(t_head))[mapped, None]
    # An unmapped token sits after the teacher tokens of the earlier tokens of its document. The running maximum may
    # run across documents: each one's teacher tokens come after the previous one's.
    floor = teacher_start + len(t_head)  # (N,)
    ends = np.maximum.accumulate(np.where(mapped, stream_ranges[:, 1], floor))  # (N,)
    after = np.maximum(np.concatenate([[0], ends[:-1]]), floor)  # (N,)
    cover = np.where(mapped[:, None], stream_ranges, after[:, None])  # (N, 2)
    last = np.cumsum(student_counts) - 1  # (D,) each document's last token
    first = last - student_counts + 1  # (D,)
    cover[first, 0] = teacher_start[first]
    cover[last, 1] = teacher_start[last] + teacher_counts
    # Added tokens get offsets (0, 0): they end where their document starts, so they add no bytes.
    offsets = back_to_back((o for _, o in student), *no_ranges)  # (N, 2)
    characters = np.array([len(text) for text in texts])  # (D,)
    character_starts = (np.cumsum(characters) - characters)[document]  # (N,)
    return AlignedStream(
        student_ids=back_to_back((ids for ids, _ in student), s_head, s_tail),
        ranges=stream_ranges,
        cover=cover,
        token_bytes=token_bytes("".join(texts), offsets, character_starts),
        teacher_ids=back_to_back(teacher_ids, t_head, t_tail),
    )


class BlockDtypes(NamedTuple):
    """What a dataset stores its arrays as: LitData needs every item to use the same dtypes."""

    student: str
    teacher: str
    starts: str

    @classmethod
    def fitting(cls, student_vocab_size: int, teacher_vocab_size: int, teacher_max_length: int) -> "BlockDtypes":
        limits = (student_vocab_size, teacher_vocab_size, teacher_max_length)
        return cls(*("uint16" if limit <= 1 << 16 else "uint32" for limit in limits))


def make_block(
    stream: AlignedStream, p: int, q: int, teacher_max_length: int, dtypes: BlockDtypes, stats: Stats
) -> dict[str, Any]:
    """The block of student tokens p..q-1 of `stream`: its teacher window, and ranges relative to it."""
    cover, ranges = stream.cover[p:q], stream.ranges[p:q]  # (n, 2) each
    low, high = cover[:, 0].min(), cover[:, 1].max()
    starts, lengths = ranges[:, 0] - low, ranges[:, 1] - ranges[:, 0]  # (n,) each
    fits = (starts + lengths <= teacher_max_length) & (lengths <= MAX_RANGE_LENGTH)
    stats.overflow_unmapped += int(((lengths > 0) & ~fits).sum())
    lengths = np.where(fits, lengths, 0)
    stats.mapped += int((lengths > 0).sum())
    stats.blocks += 1
    return {
        "student_ids": stream.student_ids[p:q].astype(dtypes.student),
        "teacher_ids": stream.teacher_ids[low : min(high, low + teacher_max_length)].astype(dtypes.teacher),
        "range_starts": np.where(lengths > 0, starts, 0).astype(dtypes.starts),
        "range_lengths": lengths.astype(np.uint8),
        "num_bytes": int(stream.token_bytes[p + 1 : q].sum()),
    }


def rest_of(stream: AlignedStream, p: int) -> AlignedStream:
    """Student tokens p.. of `stream` and the teacher tokens from the first they cover on."""
    low = stream.cover[p:, 0].min(initial=len(stream.teacher_ids))
    mapped = stream.ranges[p:, 0] < stream.ranges[p:, 1]
    return AlignedStream(
        student_ids=stream.student_ids[p:],
        ranges=np.where(mapped[:, None], stream.ranges[p:] - low, 0),
        cover=stream.cover[p:] - low,
        token_bytes=stream.token_bytes[p:],
        teacher_ids=stream.teacher_ids[low:],
    )


def joined(first: AlignedStream, second: AlignedStream) -> AlignedStream:
    shift = len(first.teacher_ids)
    mapped = second.ranges[:, 0] < second.ranges[:, 1]
    return AlignedStream(
        student_ids=np.concatenate([first.student_ids, second.student_ids]),
        ranges=np.concatenate([first.ranges, np.where(mapped[:, None], second.ranges + shift, 0)]),
        cover=np.concatenate([first.cover, second.cover + shift]),
        token_bytes=np.concatenate([first.token_bytes, second.token_bytes]),
        teacher_ids=np.concatenate([first.teacher_ids, second.teacher_ids]),
    )


def pack_blocks(
    streams: Iterable[AlignedStream], block_size: int, teacher_max_length: int, dtypes: BlockDtypes, stats: Stats
) -> Iterator[dict[str, Any]]:
    """Blocks of `block_size` student tokens, the streams back to back; the last block holds what is left."""
    rest = None
    for stream in streams:
        stream = stream if rest is None else joined(rest, stream)
        full = len(stream.student_ids) // block_size * block_size
        for p in range(0, full, block_size):
            yield make_block(stream, p, p + block_size, teacher_max_length, dtypes, stats)
        rest = rest_of(stream, full)
    if rest is not None and len(rest.student_ids):
        stats.padding += block_size - len(rest.student_ids)
        yield make_block(rest, 0, len(rest.student_ids), teacher_max_length, dtypes, stats)


# ----------------------------------------------------------------------------------------------------------------
# `vocagnolm prepare`


@dataclass(frozen=True)
class UnitJob:
    """What every work unit of a split needs (pickled to LitData's workers)."""

    student: TokenizerInfo
    teacher: TokenizerInfo
    keys: tuple[str, ...]
    block_size: int
    teacher_max_length: int
    dtypes: BlockDtypes
    val_fraction: Optional[float]
    """Keep the documents the hash rule puts in `split`; None keeps every document (`--val_input`)."""
    split: str = ""
    stats_dir: str = ""


def split_documents(unit: Unit, job: UnitJob, stats: Stats) -> Iterator[str]:
    for piece in unit.pieces:
        for text in read_documents(piece, list(job.keys), stats):
            try:
                data = text.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate from a JSON escape such as "\ud800"
                stats.skip(piece.path, "not valid Unicode (lone surrogate)")
                continue
            if job.val_fraction is not None and in_val_split(data, job.val_fraction) != (job.split == "val"):
                continue
            stats.documents += 1
            stats.characters += len(text)
            stats.bytes += len(data)
            yield text


def text_batches(texts: Iterable[str], max_chars: int) -> Iterator[list[str]]:
    batch, num_chars = [], 0
    for text in texts:
        batch.append(text)
        num_chars += len(text)
        if num_chars >= max_chars:
            yield batch
            batch, num_chars = [], 0
    if batch:
        yield batch


def aligned_streams(texts: Iterable[str], job: UnitJob, stats: Stats) -> Iterator[AlignedStream]:
    """The documents tokenized, aligned and streamed a batch at a time."""
    student, teacher = cached_tokenizer(job.student.path), cached_tokenizer(job.teacher.path)
    specials = (job.student.bos_id, job.student.eos_id), (job.teacher.bos_id, job.teacher.eos_id)
    for batch in text_batches(texts, BATCH_CHARS):
        student_encodings, teacher_encodings = encode_batch(student, batch), encode_batch(teacher, batch)
        ranges = align_batch([o for _, o in student_encodings], [o for _, o in teacher_encodings])
        stream = aligned_stream(batch, student_encodings, [ids for ids, _ in teacher_encodings], ranges, *specials)
        stats.student_tokens += len(stream.student_ids)
        stats.teacher_tokens += len(stream.teacher_ids)
        yield stream


def unit_blocks(unit: Unit, job: UnitJob) -> Iterator[dict[str, Any]]:
    """The blocks of one work unit: the function `litdata.optimize` runs. Writes the unit's Stats when done."""
    stats = Stats()
    streams = aligned_streams(split_documents(unit, job, stats), job, stats)
    yield from pack_blocks(streams, job.block_size, job.teacher_max_length, job.dtypes, stats)
    write_json(Path(job.stats_dir) / f"unit-{unit.index:06d}.json", asdict(stats))


def write_json(path: Path, data: Any) -> None:
    """Whole or not at all: a run killed while writing leaves no half file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2), encoding="utf-8")
    os.replace(tmp, path)


def read_stats(path: Path) -> Stats:
    data = json.loads(path.read_text(encoding="utf-8"))
    return Stats(**{**data, "skipped_files": [tuple(f) for f in data["skipped_files"]]})


# spawn re-imports torch in every worker and in each of its uploader processes: about 6 s per split here, against
# 0.2 s for fork. Fork is safe: the parent has only loaded tokenizers, never run their thread pool.
START_METHOD = "fork" if sys.platform == "linux" else None


@contextmanager
def optimize_environment(cache: Path) -> Iterator[None]:
    """What `litdata.optimize` needs around it.

    Its chunk cache is one machine-wide folder that it empties at start, so two runs at once would destroy each
    other's chunks: each split gets its own. Its workers are the parallelism, so each tokenizes on one thread. And it
    leaves the process with its start method and SIGINT handler (which exits 0): restore both.
    """
    environment = {
        "DATA_OPTIMIZER_CACHE_FOLDER": str(cache / "chunks"),
        "DATA_OPTIMIZER_DATA_CACHE_FOLDER": str(cache / "data"),
        "TOKENIZERS_PARALLELISM": "false",
    }
    saved = {key: os.environ.get(key) for key in environment}
    start_method, handler = multiprocessing.get_start_method(allow_none=True), signal.getsignal(signal.SIGINT)
    os.environ.update(environment)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        multiprocessing.set_start_method(start_method, force=True)
        signal.signal(signal.SIGINT, handler)


def write_split(split: str, units: list[Unit], job: UnitJob, partial: Path, num_workers: int) -> Stats:
    """Runs `litdata.optimize` over `units` into `partial/split`, then marks the split done with its Stats."""
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
                chunk_bytes=CHUNK_BYTES,
                reorder_files=False,
                start_method=START_METHOD,
            )
        except Exception:
            split_stats(split, units, stats_dir)  # LitData fails to write an index for an empty split: say that
            raise
    stats = split_stats(split, units, stats_dir)
    if stats is None:
        raise RuntimeError(f"Some work units of the {split} split did not write their counts to {stats_dir}.")
    shutil.rmtree(cache, ignore_errors=True)
    write_json(partial / f"{split}.json", asdict(stats))
    return stats


def split_stats(split: str, units: list[Unit], stats_dir: Path) -> Optional[Stats]:
    """The sum of the units' Stats (None if some unit did not finish), or a clear error if the split is empty."""
    files = sorted(stats_dir.glob("unit-*.json"))
    if len(files) < len(units):
        return None
    stats = sum(map(read_stats, files), Stats())
    if stats.documents == 0:
        skipped = f" ({sum(stats.skipped_records.values())} records skipped)" if stats.skipped_records else ""
        hint = " Raise --val_fraction, or give --val_input files." if split == "val" else ""
        raise ValueError(f"The {split} split is empty: no input document fell in it{skipped}.{hint}")
    return stats


def _differences(recorded: dict, settings: dict) -> str:
    def show(value: Any) -> str:
        text = json.dumps(value)
        return text if len(text) <= 60 else "..."

    keys = [key for key in settings if recorded.get(key) != settings[key]]
    return "; ".join(f"{key}: {show(recorded.get(key))} there, {show(settings[key])} now" for key in keys)


def output_state(output: Path, settings: dict) -> Literal["new", "done", "resume"]:
    """What `--output` holds: nothing, this very dataset, or an unfinished run of it. Refuses anything else."""
    if output.exists() and not output.is_dir():
        raise FileExistsError(f"--output {output} is a file; give a directory.")
    entries = sorted(p.name for p in output.iterdir()) if output.is_dir() else []
    if not entries:
        return "new"
    if MANIFEST in entries:
        recorded = json.loads((output / MANIFEST).read_text(encoding="utf-8"))["settings"]
        if recorded == settings:
            return "done"
        raise FileExistsError(
            f"--output {output} holds data prepared with other settings ({_differences(recorded, settings)})."
            f" Give another --output, or delete {output} to prepare it again."
        )
    if PARTIAL in entries and set(entries) <= {PARTIAL, *SPLITS}:
        settings_file = output / PARTIAL / "settings.json"
        recorded = json.loads(settings_file.read_text(encoding="utf-8"))["settings"] if settings_file.is_file() else {}
        if recorded == settings:
            return "resume"
        if not any((output / PARTIAL / f"{split}.json").is_file() for split in SPLITS):
            return "new"  # an unfinished run that finished no split (it failed, or was killed early): start over
        raise FileExistsError(
            f"--output {output} holds an unfinished `vocagnolm prepare` with other settings"
            f" ({_differences(recorded, settings)}). Re-run that command to finish it, give another --output, or"
            f" delete {output}."
        )
    raise FileExistsError(
        f"--output {output} is not empty and holds no prepared data (it has: {', '.join(entries[:5])}"
        f"{', ...' if len(entries) > 5 else ''}). Give a new or empty directory."
    )


def measure_token_ratio(units: list[Unit], keys: list[str], student: TokenizerInfo, teacher: TokenizerInfo) -> float:
    """Teacher tokens per student token over the first RATIO_SAMPLE_CHARS characters of the input."""
    student_tokenizer, teacher_tokenizer = cached_tokenizer(student.path), cached_tokenizer(teacher.path)
    num_student = num_teacher = num_chars = 0
    for piece in (piece for unit in units for piece in unit.pieces):
        for text in read_documents(piece, keys, Stats()):
            text = text[: RATIO_SAMPLE_CHARS - num_chars].encode("utf-8", "replace").decode("utf-8")
            num_student += len(encode(student_tokenizer, text)[0])
            num_teacher += len(encode(teacher_tokenizer, text)[0])
            num_chars += len(text)
            if num_chars >= RATIO_SAMPLE_CHARS:
                return num_teacher / max(num_student, 1)
    return num_teacher / num_student if num_student else 1.0


def block_settings(
    units: list[Unit],
    keys: list[str],
    student: TokenizerInfo,
    teacher: TokenizerInfo,
    block_size: int,
    teacher_max_length: Optional[int],
) -> dict:
    """The teacher window's cap (from the measured token ratio unless given) and the dtypes the blocks are stored as."""
    ratio = measure_token_ratio(units, keys, student, teacher)
    cap = teacher_max_length or math.ceil(block_size * ratio * TEACHER_HEADROOM)
    dtypes = BlockDtypes.fitting(student.vocab_size, teacher.vocab_size, cap)
    return {"token_ratio": ratio, "teacher_max_length": cap, "dtypes": dtypes._asdict()}


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
        output: A new or empty directory.
        max_seq_length: Student tokens per training sequence; blocks hold one more (inputs and shifted targets).
        teacher_max_length: Teacher tokens per block at most; student tokens whose teacher tokens lie beyond are
            unmapped (counted in the manifest). Default: max_seq_length + 1 times the teacher/student token ratio
            measured on the input, plus 25%.
        num_workers: Worker processes. Default: one per CPU.
        text_key: The field holding the text in .jsonl and .parquet records; several, comma-separated (e.g.
            question,answer), are joined with a blank line between them.
        val_fraction: Share of the documents for validation, chosen by a hash of their text (so the same on every
            run). Default: 0.01, unless --val_input is given.
        val_input: Files or directories (as --input) for validation instead of a share of --input.
    """
    # Every check before any work.
    if max_seq_length < 1:
        raise ValueError(f"--max_seq_length must be at least 1, got {max_seq_length}.")
    if teacher_max_length is not None and teacher_max_length < 1:
        raise ValueError(f"--teacher_max_length must be at least 1, got {teacher_max_length}.")
    if val_input and val_fraction is not None:
        raise ValueError("Give --val_fraction or --val_input, not both.")
    if not val_input:
        val_fraction = 0.01 if val_fraction is None else val_fraction
        if not 0 < val_fraction < 1:
            raise ValueError(f"--val_fraction must lie between 0 and 1, got {val_fraction}.")
    num_workers = num_workers or os.cpu_count() or 1
    keys = parse_text_key(text_key)
    files, skipped_files = find_input_files(input, "--input")
    val_files, val_skipped = find_input_files(val_input, "--val_input") if val_input else ([], [])
    if {f.resolve() for f in files} & {f.resolve() for f in val_files}:
        raise ValueError("A file is in both --input and --val_input; validation text must not be trained on.")
    for path in files:
        check_input_file(path, keys, "--input")
    for path in val_files:
        check_input_file(path, keys, "--val_input")
    student_file, teacher_file = find_tokenizer_file(student), find_tokenizer_file(teacher)
    settings = {
        "format": FORMAT,
        "student": {"path": str(student_file.resolve()), "sha256": tokenizer_sha256(student_file)},
        "teacher": {"path": str(teacher_file.resolve()), "sha256": tokenizer_sha256(teacher_file)},
        "input": [[str(p.resolve()), p.stat().st_size] for p in files],
        "val_input": [[str(p.resolve()), p.stat().st_size] for p in val_files],
        "max_seq_length": max_seq_length,
        "teacher_max_length": teacher_max_length,
        "text_key": keys,
        "val_fraction": val_fraction,
    }
    output = Path(output)
    state = output_state(output, settings)
    if state == "done":
        print(f"{output} already holds this data, prepared with the same settings: nothing to do.")
        return
    student_info, teacher_info = tokenizer_info(student_file), tokenizer_info(teacher_file)

    partial = output / PARTIAL
    block_size = max_seq_length + 1
    units = {"train": plan_units(files)}
    units["val"] = plan_units(val_files) if val_input else units["train"]
    if state == "resume":
        derived = json.loads((partial / "settings.json").read_text(encoding="utf-8"))["derived"]
        print(f"Finishing the interrupted run in {partial}.")
    else:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        derived = block_settings(units["train"], keys, student_info, teacher_info, block_size, teacher_max_length)
        write_json(partial / "settings.json", {"settings": settings, "derived": derived})
    cap = derived["teacher_max_length"]
    print(
        f"{len(files) + len(val_files)} input files ({sum(p.stat().st_size for p in files + val_files) / 1e6:.1f} MB),"
        f" {len(skipped_files) + len(val_skipped)} skipped. Blocks of {block_size} student tokens with teacher windows"
        f" of at most {cap} tokens (measured {derived['token_ratio']:.3f} teacher tokens per student token)."
    )
    for path, reason in skipped_files + val_skipped:
        print(f"  skipped {path}: {reason}")

    job = UnitJob(
        student=student_info,
        teacher=teacher_info,
        keys=tuple(keys),
        block_size=block_size,
        teacher_max_length=cap,
        dtypes=BlockDtypes(**derived["dtypes"]),
        val_fraction=None if val_input else val_fraction,
    )
    for split in SPLITS:
        if (partial / f"{split}.json").is_file():
            print(f"The {split} split was written before the interruption.")
        else:
            write_split(split, units[split], job, partial, num_workers)
    stats = {split: read_stats(partial / f"{split}.json") for split in SPLITS}

    # Publish: each rename is atomic, and the manifest comes last; a run killed in between is finished by the next.
    for split in SPLITS:
        if (partial / split).exists():
            os.replace(partial / split, output / split)
    skipped = skipped_files + val_skipped
    manifest = build_manifest(output, settings, derived, student_info, teacher_info, stats, skipped, bool(val_input))
    write_json(partial / MANIFEST, manifest)
    os.replace(partial / MANIFEST, output / MANIFEST)
    shutil.rmtree(partial)
    print_summary(output, manifest)


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
            "mapped_share": counts.mapped / max(counts.student_tokens, 1),
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
        "same_vocabulary": same_vocabulary(student, teacher),
        "max_seq_length": settings["max_seq_length"],
        "block_size": settings["max_seq_length"] + 1,
        "teacher_max_length": derived["teacher_max_length"],
        "token_ratio": derived["token_ratio"],
        "dtypes": dtypes._asdict(),
        "alignment_bytes_per_student_token": np.dtype(dtypes.starts).itemsize + 1,
        "bytes_per_student_token": sum(s["shard_bytes"] for s in splits.values()) / max(total.student_tokens, 1),
        "mapped_share": total.mapped / max(total.student_tokens, 1),
        "splits": splits,
        "skipped_files": [list(f) for f in skipped_files + skips.skipped_files],
        "skipped_records": skips.skipped_records,
        "skipped_examples": skips.examples,
    }


def print_summary(output: Path, manifest: dict) -> None:
    for split, s in manifest["splits"].items():
        print(
            f"{split}: {s['documents']:,} documents, {s['characters']:,} characters, {s['student_tokens']:,} student"
            f" and {s['teacher_tokens']:,} teacher tokens in {s['blocks']:,} blocks; {s['mapped_share']:.2%} of student"
            f" tokens mapped, {s['overflow_unmapped']:,} unmapped for lack of room in the teacher window."
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


# ----------------------------------------------------------------------------------------------------------------
# Reading back


def load_manifest(path: Path) -> dict:
    path = Path(path)
    if not (path / MANIFEST).is_file():
        unfinished = " An interrupted run left it unfinished: run it again." if (path / PARTIAL).exists() else ""
        raise FileNotFoundError(
            f"No prepared data in {path} (no {MANIFEST}). Make it with `vocagnolm prepare ... --output {path}`."
            + unfinished
        )
    manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path / MANIFEST} is format {manifest.get('format')!r}; this version reads {FORMAT!r}.")
    return manifest


class BlockDataset(StreamingDataset):
    """A split's stored blocks; with a teacher loss cache, each item also carries its block's cached `teacher_loss`
    (looked up by the block's index in the split, in the loader's worker processes)."""

    def __init__(self, path: Path, split: str, shuffle: bool, seed: int, teacher_cache: Optional[Path] = None) -> None:
        super().__init__(input_dir=str(Path(path) / split), shuffle=shuffle, seed=seed)
        from litgpt_vocagnolm.teacher import TeacherLossCache  # teacher.py imports this module

        self.teacher_losses = None if teacher_cache is None else TeacherLossCache(teacher_cache, split)

    def __getitem__(self, index: Any) -> Any:
        item = super().__getitem__(index)
        if self.teacher_losses is not None:
            item["teacher_loss"] = self.teacher_losses[index.index if isinstance(index, ChunkedIndex) else index]
        return item


def open_split(
    path: Path, split: str, manifest: dict, shuffle: bool = False, seed: int = 42, teacher_cache: Optional[Path] = None
) -> BlockDataset:
    """The split's blocks, after checking its index is the one the manifest recorded."""
    index = Path(path) / split / "index.json"
    if not index.is_file() or file_sha256(index) != manifest["splits"][split]["index_sha256"]:
        raise ValueError(
            f"{index} is missing or not the one {Path(path) / MANIFEST} recorded: the folder mixes two preparations."
            " Prepare the data again into a new --output."
        )
    return BlockDataset(path, split, shuffle=shuffle, seed=seed, teacher_cache=teacher_cache)


def decode_block(item: dict[str, Any], block_size: int) -> dict[str, Any]:
    """A stored block in plain form, padded to `block_size` (padding: id 0, ranges `(0, 0)`).

    Returns: `student_ids` (T + 1,) int64, `teacher_ids` (M,) int64, `ranges` (T + 1, 2) int64 `[a, b)` into
    `teacher_ids` (`a == b` unmapped), `num_tokens` (the student tokens that are not padding), `num_bytes`.
    """
    n = len(item["student_ids"])
    student_ids = np.zeros(block_size, dtype=np.int64)
    student_ids[:n] = item["student_ids"]
    ranges = np.zeros((block_size, 2), dtype=np.int64)
    ranges[:n, 0] = item["range_starts"]
    ranges[:n, 1] = ranges[:n, 0] + item["range_lengths"]
    return {
        "student_ids": student_ids,
        "teacher_ids": item["teacher_ids"].astype(np.int64),
        "ranges": ranges,
        "num_tokens": n,
        "num_bytes": int(item["num_bytes"]),
    }


def iter_blocks(path: Path, split: Literal["train", "val"] = "train") -> Iterator[dict[str, Any]]:
    """The blocks of a prepared dataset's split in stored order, decoded (see `decode_block`)."""
    manifest = load_manifest(path)
    for item in open_split(path, split, manifest):
        yield decode_block(item, manifest["block_size"])


def collate_blocks(
    items: list[dict[str, Any]], block_size: int, chunks: Optional[int] = None
) -> dict[str, torch.Tensor]:
    """Stored blocks -> a batch; see `VocAgnoData` for the shapes. `chunks` replaces the ranges by chunk alignment."""
    blocks = [decode_block(item, block_size) for item in items]
    if chunks is not None:
        for block in blocks:
            n = block["num_tokens"]
            block["ranges"][:] = 0
            block["ranges"][:n] = chunk_align(n, len(block["teacher_ids"]), chunks)
    student_ids = torch.from_numpy(np.stack([block["student_ids"] for block in blocks]))  # (B, T + 1)
    padding = torch.arange(block_size) >= torch.tensor([block["num_tokens"] for block in blocks])[:, None]
    width = max(1, max(len(block["teacher_ids"]) for block in blocks))  # M >= 1 keeps the teacher's forward defined
    teacher_ids = torch.zeros(len(blocks), width, dtype=torch.long)  # (B, M)
    teacher_valid = torch.zeros(len(blocks), width, dtype=torch.bool)  # (B, M)
    for row, block in enumerate(blocks):
        teacher_ids[row, : len(block["teacher_ids"])] = torch.from_numpy(block["teacher_ids"])
        teacher_valid[row, : len(block["teacher_ids"])] = True
    batch = {
        "input_ids": student_ids[:, :-1],
        "targets": student_ids[:, 1:].masked_fill(padding[:, 1:], -100),
        "teacher_ids": teacher_ids,
        "teacher_valid": teacher_valid,
        "ranges": torch.from_numpy(np.stack([block["ranges"][1:] for block in blocks])),  # (B, T, 2)
        "num_bytes": torch.tensor([block["num_bytes"] for block in blocks]),
    }
    if "teacher_loss" in items[0]:  # from a teacher loss cache
        batch["teacher_loss"] = torch.full((len(blocks), width), float("nan"))  # (B, M)
        for row, item in enumerate(items):
            batch["teacher_loss"][row, : len(item["teacher_loss"])] = torch.from_numpy(item["teacher_loss"])
    return batch


@dataclass
class VocAgnoData(DataModule):
    """Blocks prepared by `vocagnolm prepare`, streamed with LitData: `--data VocAgnoData --data.path DIR`.

    Loaders yield dicts (B = batch size, T = max_seq_length, M = longest teacher window in the batch, at least 1):
        input_ids      (B, T) long    student tokens
        targets        (B, T) long    the next student tokens, -100 on padding
        teacher_ids    (B, M) long    teacher windows, padded with 0
        teacher_valid  (B, M) bool    False on that padding
        ranges         (B, T, 2) long for each target token, the range `[a, b)` of teacher positions in its row
                                      whose characters cover it; `a == b`: unmapped
        num_bytes      (B,) long      UTF-8 bytes of the text the targets cover (for bits per byte)
        teacher_loss   (B, M) float32 with `teacher_cache` set: the cached teacher losses, NaN where unavailable
    The loaders are stateful (`state_dict` / `load_state_dict`), so a resumed run continues mid-epoch.
    """

    path: Path
    """Output directory of `vocagnolm prepare` (manifest.json, train/, val/)."""
    num_workers: int = 4
    """Loader worker processes."""
    seed: int = 42
    """Seed of the training data's shuffle."""
    chunks: Optional[int] = None
    """Replace each block's ranges by chunk alignment into this many chunks (the `chunk` baseline)."""
    batch_size: int = field(default=1, init=False, repr=False)
    teacher_cache: Optional[Path] = field(default=None, init=False, repr=False)
    """Set by the recipe from --teacher.cache: attach the cached teacher losses to each batch."""

    def __post_init__(self) -> None:
        super().__init__()
        if self.chunks is not None and self.chunks < 1:
            raise ValueError(f"--data.chunks must be at least 1, got {self.chunks}.")

    @functools.cached_property
    def manifest(self) -> dict:
        return load_manifest(self.path)

    def connect(self, tokenizer: Any = None, batch_size: int = 1, max_seq_length: Optional[int] = None) -> None:
        self.batch_size = batch_size
        prepared = self.manifest["max_seq_length"]
        if max_seq_length is not None and max_seq_length != prepared:
            raise ValueError(
                f"{self.path} holds blocks for max_seq_length {prepared}, but training asks for {max_seq_length}."
                f" Prepare it again with `vocagnolm prepare --max_seq_length {max_seq_length}`, or train with"
                f" --train.max_seq_length {prepared}."
            )

    def prepare_data(self) -> None:
        self.manifest  # fails now, with how to make the data, rather than in a loader worker

    def check_tokenizers(self, student_dir: Path, teacher_dir: Optional[Path]) -> None:
        """Fails unless the tokenizers in these dirs are the files the data was prepared with."""
        for side, given in (("student", student_dir), ("teacher", teacher_dir)):
            if given is None:
                continue
            recorded, file = self.manifest[side], find_tokenizer_file(given)
            sha256 = tokenizer_sha256(file)
            if sha256 != recorded["sha256"]:
                raise ValueError(
                    f"The {side} tokenizer is not the one {self.path} was prepared with:\n"
                    f"  prepared with {recorded['path']} (sha256 {recorded['sha256']})\n"
                    f"  given         {file} (sha256 {sha256})\n"
                    f"Prepare the data again with this {side}, or train with the {side} it was prepared for."
                )

    def same_vocabulary(self) -> bool:
        """Whether student and teacher share one vocabulary (what `rho1` and `kld` need)."""
        return self.manifest["same_vocabulary"]

    def _loader(self, split: str, shuffle: bool) -> StreamingDataLoader:
        dataset = open_split(self.path, split, self.manifest, shuffle, self.seed, self.teacher_cache)
        return StreamingDataLoader(
            dataset,
            batch_size=self.batch_size,
            num_workers=self.num_workers,
            collate_fn=functools.partial(collate_blocks, block_size=self.manifest["block_size"], chunks=self.chunks),
            pin_memory=torch.cuda.is_available(),
        )

    def train_dataloader(self) -> StreamingDataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> StreamingDataLoader:
        return self._loader("val", shuffle=False)
