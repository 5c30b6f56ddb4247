"""Input documents: finding the input files, cutting them into work units, reading their records, the validation split.

`vocagnolm prepare` reads .txt files (one document each), .jsonl files (one record per line) and .parquet files (one
record per row, e.g. OpenWebMath); a record's document is its `--text_key` fields joined by a blank line. The input is
cut into about UNITS work units of whole lines, row groups or files (1 to 64 MB of text each, whatever the number of
workers, so that the data comes out the same), which `litdata.optimize` spreads over worker processes. A record that
can't be read is counted by reason in `Stats` and skipped, never dropped silently.

A document is tokenized in segments of at most SEGMENT_CHARS characters (`segments`), so that memory does not grow
with its length (tokenizers' encodings take over 100 bytes per character): a .txt file is read a chunk at a time, and
a 20 MB record costs its text, not 3 GB of encodings.
"""

import codecs
import hashlib
import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Iterator, NamedTuple, Optional, Union

import pyarrow as pa
import pyarrow.parquet as pq

from litgpt_vocagnolm.errors import InvalidArgument, PathMissing, given_by

SUFFIXES = (".txt", ".jsonl", ".parquet")
FIELD_SEPARATOR = "\n\n"  # joins the fields of `--text_key question,answer`, as paragraphs
UNITS = 256  # work units to cut the input into, so that many workers stay busy to the end
UNIT_BYTES = (1 << 20, 64 << 20)  # bounds on a unit's input; each unit ends in one padded block (0.4% of 1 MB)
SEGMENT_CHARS = 1 << 16  # a longer document is tokenized in segments of at most this many characters (see `segments`)
LINE_START = re.compile(r"[^\S\r\n]*\S")  # blanks but no line break, then a non-space character


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


class Document(NamedTuple):
    """One readable document: its text, a chunk at a time, and what the validation split and the counts need."""

    chunks: Iterable[str]
    """Its text in consecutive chunks of at most SEGMENT_CHARS characters; can be iterated again (a .txt file is read
    again)."""
    hash: int
    """Of its UTF-8 bytes (`hash_value`): the validation split's rule (`hash_threshold`)."""
    characters: int
    bytes: int


class Segment(NamedTuple):
    """At most SEGMENT_CHARS consecutive characters of one document, tokenized on their own (see `segments`)."""

    text: str
    context: str
    """The character before `text` where the cut lies at a line or word boundary: tokenized with `text` and its
    tokens dropped, so that a tokenizer that prepends "▁" to every text puts it there. "" at a document's start or a
    hard cut."""
    first: bool
    """Starts its document (gets its BOS)."""
    last: bool
    """Ends its document (gets its EOS)."""


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
    targets: int = 0
    """Student tokens the student is trained to predict: each block's but its first (an input only), the BOS left
    out (it starts a document, so nothing of its document comes before it)."""
    mapped: int = 0
    """Targets with a teacher range (the share `mapped / targets` is what prepare, inspect and training report)."""
    overflow_unmapped: int = 0
    """Targets left unmapped because their teacher tokens lay past teacher_max_length (or were over 255)."""
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
        raise InvalidArgument(f"--text_key {text_key!r}: give one field name, or several separated by commas.")
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
                raise InvalidArgument(f"{flag} {path}: no {', '.join(SUFFIXES)} files in this directory or below it.")
            unsupported = [p for p in found if p.suffix not in SUFFIXES]
            skipped += [(str(p), f"unsupported file type {p.suffix or '(none)'!r}") for p in unsupported]
        elif path.is_file():
            if path.suffix not in SUFFIXES:
                raise InvalidArgument(
                    f"{flag} {path}: unsupported file type {path.suffix!r}; use {', '.join(SUFFIXES)}."
                )
            candidates = [path]
        else:
            raise PathMissing(f"{flag} {path} does not exist.")
        for p in candidates:
            if p.resolve() in seen:
                raise InvalidArgument(f"{flag}: {p} is given twice (directly or inside a directory); give it once.")
            seen.add(p.resolve())
            if p.stat().st_size == 0:
                skipped.append((str(p), "empty file (0 bytes)"))
            else:
                files.append(p)
    if not files:
        raise InvalidArgument(f"{flag}: every file is empty ({', '.join(p for p, _ in skipped)}).")
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
            raise InvalidArgument(f"{flag} {path}: the first line is not a UTF-8 JSON record ({error}).") from None
        text, why = record_text(record, keys)
        if text is None:
            names = ", ".join(record) if isinstance(record, dict) else "none"
            raise InvalidArgument(f"{flag} {path}: the first record fails, {why} (its fields: {names}). {hint}")
    elif path.suffix == ".parquet":
        fix = "Give Parquet files (as pyarrow or pandas write them); name text files .txt or .jsonl."
        with given_by(f"{flag} {path}", fix):
            schema = pq.read_schema(path)
        for key in keys:
            if key not in schema.names:
                raise InvalidArgument(f"{flag} {path}: no column {key!r} (columns: {', '.join(schema.names)}). {hint}")
            if not (pa.types.is_string(schema.field(key).type) or pa.types.is_large_string(schema.field(key).type)):
                raise InvalidArgument(f"{flag} {path}: column {key!r} holds {schema.field(key).type}, not text. {hint}")


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


def new_digest() -> Any:
    """blake2b with 8-byte digests, to be fed a document's UTF-8 bytes: `hash_value` then gives the document's hash."""
    return hashlib.blake2b(digest_size=8)


def hash_value(digest: Any) -> int:
    return int.from_bytes(digest.digest(), "little")


def hash_threshold(val_fraction: float) -> int:
    """The hash rule: a document is in the val split iff its hash is below this, the same on every run and machine,
    duplicates included. `ceil` keeps it exact: `hash < val_fraction * 2**64` for every integer hash."""
    return math.ceil(val_fraction * 2**64)


class TextFile:
    """A .txt file's text, read SEGMENT_CHARS bytes at a time (so at most that many characters per chunk); iterating
    raises `Unreadable` where it is not UTF-8."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __iter__(self) -> Iterator[str]:
        decoder, position = codecs.getincrementaldecoder("utf-8")(), 0
        with open(self.path, "rb") as f:
            for block in iter(lambda: f.read(SEGMENT_CHARS), b""):
                pending = len(decoder.getstate()[0])  # bytes of a character cut by the previous block
                try:
                    yield decoder.decode(block)
                except UnicodeDecodeError as error:
                    raise Unreadable(f"not UTF-8 (byte {position - pending + error.start})") from None
                position += len(block)
            pending = len(decoder.getstate()[0])
            try:
                decoder.decode(b"", final=True)
            except UnicodeDecodeError:
                raise Unreadable(f"not UTF-8 (byte {position - pending}: the file ends inside a character)") from None


class Unreadable(Exception):
    """A whole input file can't be read; the message says why."""


def read_documents(piece: Piece, keys: list[str], stats: Stats) -> Iterator[Document]:
    """The documents of `piece`, in file order; records (and .txt files) that can't be read are counted in `stats`
    and skipped."""
    if piece.path.endswith(".txt"):  # read twice: here to check its encoding and hash it, again for its text
        texts: Iterable[tuple[str, Iterable[str]]] = [(piece.path, TextFile(piece.path))]
    else:
        texts = ((where, TextChunks(text, SEGMENT_CHARS)) for where, text in read_records(piece, keys, stats))
    for where, chunks in texts:
        digest, characters, size = new_digest(), 0, 0
        try:
            for chunk in chunks:
                data = chunk.encode("utf-8")
                digest.update(data)
                characters, size = characters + len(chunk), size + len(data)
        except Unreadable as error:
            stats.skipped_files.append((piece.path, str(error)))
        except UnicodeEncodeError:  # a lone surrogate from a JSON escape such as "\ud800"
            stats.skip(where, "not valid Unicode (lone surrogate)")
        else:
            yield Document(chunks, hash_value(digest), characters, size)


def read_records(piece: Piece, keys: list[str], stats: Stats) -> Iterator[tuple[str, str]]:
    """(where, text) of the records of a .jsonl or .parquet piece; those that can't be read are counted and skipped."""
    path = piece.path
    if path.endswith(".jsonl"):
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
                    yield where, text
    else:
        where = f"{path} row group {piece.start}"
        rows = pq.ParquetFile(path).iter_batches(batch_size=1024, row_groups=[piece.start], columns=keys)
        for batch in rows:
            for values in zip(*(batch.column(key).to_pylist() for key in keys)):
                text, why = record_text(dict(zip(keys, values)), keys)
                if text is None:
                    stats.skip(where, why)
                else:
                    yield where, text


class TextChunks:
    """`text` in consecutive slices of at most `size` characters (itself if no longer), each made when it is read."""

    def __init__(self, text: str, size: int) -> None:
        self.text, self.size = text, size

    def __iter__(self) -> Iterator[str]:
        return (self.text[i : i + self.size] for i in range(0, max(len(self.text), 1), self.size))


def segments(chunks: Iterable[str], max_chars: int) -> Iterator[Segment]:
    """A document's text, given in chunks of at most `max_chars` characters, as segments of at most `max_chars`.

    A text of at most `max_chars` is one segment. A longer one is cut, within the last half of each `max_chars`, after
    the last line break that a non-space character follows (after spaces or tabs, maybe, but no other line break: Qwen
    joins blank lines into one pre-token), else before the last space between two non-space characters, else (no such
    place in `max_chars / 2` characters) at `max_chars`. The first two end a token of every tokenizer here and start
    the next: Llama-family vocabularies (TinyLlama, Mistral, Llemma) have no token holding a
    line break or a "▁" after its start, and Qwen2.5's pre-tokenizer splits there. Tokenized after the character
    before the cut (`Segment.context`), each segment then gets the very tokens of the whole document
    (benchmarks/bench_prepare.py counts the tokens that change on the shipped data; tests/test_data.py checks that the
    blocks do not). A hard cut splits the token that crosses it in two, and with a tokenizer that prepends "▁" to
    every text the first word after it takes that form.
    """
    buffer, context, first = "", "", True
    for chunk in chunks:
        buffer += chunk  # less than 2 * max_chars: chunks are no longer than max_chars, and the loop leaves no more
        while len(buffer) > max_chars:
            cut, boundary = cut_position(buffer, max_chars)
            yield Segment(buffer[:cut], context, first, False)
            context, buffer, first = buffer[cut - 1] if boundary else "", buffer[cut:], False
    yield Segment(buffer, context, first, True)


def cut_position(text: str, max_chars: int) -> tuple[int, bool]:
    """Where `segments` cuts `text` (longer than `max_chars`), and whether that is a line or word boundary. It reads no
    further than `text[max_chars]`, so that how the text came in chunks changes nothing."""
    low = max_chars // 2
    line = text.rfind("\n", low, max_chars)
    while line >= low:
        if LINE_START.match(text, line + 1, max_chars + 1):
            return line + 1, True
        line = text.rfind("\n", low, line)
    space = text.rfind(" ", low + 1, max_chars)
    while space > low:
        if not text[space - 1].isspace() and not text[space + 1].isspace():
            return space, True
        space = text.rfind(" ", low + 1, space)
    return max_chars, False


def split_documents(
    unit: Unit, keys: list[str], split: str, val_threshold: Optional[int], stats: Stats
) -> Iterator[Segment]:
    """The segments of the documents of `unit` that belong to `split` by the hash rule (every document if
    `val_threshold` is None: val iff its hash is below it), counted in `stats`."""
    for piece in unit.pieces:
        for document in read_documents(piece, keys, stats):
            if val_threshold is not None and (document.hash < val_threshold) != (split == "val"):
                continue
            stats.documents += 1
            stats.characters += document.characters
            stats.bytes += document.bytes
            yield from segments(document.chunks, SEGMENT_CHARS)


def smallest_hash(units: list[Unit], keys: list[str], stats: Stats) -> tuple[Optional[int], int]:
    """The smallest document hash of `units` (None if no document can be read) and how many documents have it.

    One pass that reads and hashes every document (no tokenizing), counting them in `stats`: what the validation
    split falls back on when the hash rule leaves it empty, which only happens to small inputs.
    """
    smallest, count = None, 0
    for piece in (piece for unit in units for piece in unit.pieces):
        for document in read_documents(piece, keys, stats):
            stats.documents += 1
            if smallest is None or document.hash < smallest:
                smallest, count = document.hash, 0
            count += document.hash == smallest
    return smallest, count


def nothing_readable(flag: str, skipped_files: list[tuple[str, str]], stats: Stats) -> str:
    """Why no document of `flag`'s files could be read: each skipped file and the skipped records, by reason."""
    lines = [f"  {path}: {reason}" for path, reason in skipped_files + stats.skipped_files]
    if stats.skipped_records:
        counts = ", ".join(f"{reason}: {n:,}" for reason, n in stats.skipped_records.items())
        lines.append(f"  records skipped ({counts}), e.g. " + "; ".join(stats.examples[:3]))
    return (
        f"No document of {flag} could be read; every file or record was skipped:\n" + "\n".join(lines) + "\n"
        "Fix or remove these files (or name the text field(s) with --text_key)."
    )


def read_whole_files(paths: Union[list[Path], Path], keys: list[str], flag: str) -> dict[Path, list[str]]:
    """Every document of every input file (directories searched as for `prepare`), by file, for a command that must
    read all of them (`vocagnolm evaluate --bpb`): a file or record that can't be read is an error naming it."""
    files, skipped = find_input_files(paths, flag)
    if skipped:
        raise InvalidArgument(f"{flag}: can't read {', '.join(f'{path} ({why})' for path, why in skipped)}.")
    documents = {}
    for path in files:
        check_input_file(path, keys, flag)
        stats = Stats()
        pieces = file_pieces(path, path.stat().st_size)
        documents[path] = ["".join(d.chunks) for piece in pieces for d in read_documents(piece, keys, stats)]
        problems = [f"{path}: {why}" for path, why in stats.skipped_files] + stats.examples
        if problems:
            raise InvalidArgument(
                f"{flag}: {'; '.join(problems[:5])}. Fix or remove these records; nothing is skipped here."
            )
    return documents
