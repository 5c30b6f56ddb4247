"""Aligned streams -> blocks: both tokenizations of a batch of documents back to back, cut into student blocks.

A batch of documents, in segments of at most `documents.SEGMENT_CHARS` characters, is tokenized by both tokenizers
(`encode_segments`), aligned (`lexical.align_batch`) and laid end to end as one `AlignedStream`, each document with
the BOS/EOS that LitGPT's own `Tokenizer` gives it on each side (`tokenizer_files.document_specials`: BOS where LitGPT
adds one, as for Llama, and always EOS, so that both sides see where documents meet). The student's EOS maps to the
teacher's EOS of the same document, where both sides hold some token of its text: each is its model's prediction that
the document ends, so the teacher's loss of its own EOS is the reference for the student's. The BOS is unmapped and
never a prediction target (it starts a document, so nothing of that document comes before it). No student token maps
into another document. `pack_blocks` cuts the streams into blocks of `block_tokens` student tokens (max_seq_length + 1:
inputs and shifted targets), each with its teacher window: the teacher tokens covering the same characters, at most
`teacher_max_length` of them.

A block, as stored (one LitData item; n <= block_tokens, shorter only for the last block of a work unit):
    student_ids    (n,) uint16, or uint32 for a vocabulary over 65536
    teacher_ids    (m,) uint16 or uint32: the teacher window, with the teacher's BOS/EOS at its documents' edges;
                   m <= teacher_max_length
    range_starts   (n,) uint16 (uint32 if teacher_max_length > 65536): first teacher token of each student token's
                   range, relative to the window
    range_lengths  (n,) uint8, the range's length; 0 = unmapped (the BOS, and tokens whose teacher tokens lie past
                   teacher_max_length or number more than 255)
    num_bytes      int, the UTF-8 bytes of the text that the block's target tokens (positions 1..n-1) cover
The alignment costs 3 bytes per student token. `prepared.decode_block` turns a block back into plain arrays.
"""

from typing import Any, Iterable, Iterator, NamedTuple, Optional, Sequence

import numpy as np
from tokenizers import Tokenizer

from litgpt_vocagnolm.alignment.lexical import align_batch, encode, encode_batch
from litgpt_vocagnolm.alignment.tokenizer_files import TokenizerInfo, load_tokenizer
from litgpt_vocagnolm.data.documents import Segment, Stats

BATCH_CHARS = 1 << 18  # text tokenized per `encode_batch` call
MAX_RANGE_LENGTH = 255  # range_lengths is uint8


class AlignedStream(NamedTuple):
    """Documents back to back, each with both tokenizers' added tokens: N student and M teacher tokens.

    Both sides hold the documents in the same order, so the teacher tokens covering any run of student tokens are one
    contiguous slice of `teacher_ids`, `[cover[p:q, 0].min(), cover[p:q, 1].max())`.
    """

    student_ids: np.ndarray
    """(N,) int32"""
    ranges: np.ndarray
    """(N, 2) int64 teacher ranges `[a, b)` into `teacher_ids`, within the token's own document; `(0, 0)` unmapped."""
    bos: np.ndarray
    """(N,) bool: the student's BOS, which starts a document and is never a prediction target."""
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
    firsts: Optional[Sequence[bool]] = None,
    lasts: Optional[Sequence[bool]] = None,
) -> AlignedStream:
    """Segments of documents back to back, each document with both sides' BOS/EOS added.

    Arguments: per segment, its text, the student's (ids, offsets) and the teacher's ids without added tokens, and
    `align`'s ranges between the two; the (BOS, EOS) ids each side adds (or None); whether each segment starts and
    ends its document (default: every segment is a whole document), so that a document cut into segments
    (`documents.segments`) gets one BOS and one EOS. The student's EOS maps to the teacher's where both sides add one
    and hold tokens of the document's last segment (a document's last segment is empty only if the document is).
    """
    firsts = np.ones(len(texts), dtype=bool) if firsts is None else np.asarray(firsts, dtype=bool)  # (D,)
    lasts = np.ones(len(texts), dtype=bool) if lasts is None else np.asarray(lasts, dtype=bool)  # (D,)
    s_head, s_tail = map(_added, student_specials)
    t_head, t_tail = map(_added, teacher_specials)
    no_ranges = np.zeros((len(s_head), 2), np.int64), np.zeros((len(s_tail), 2), np.int64)

    def back_to_back(parts: Iterable[np.ndarray], head: np.ndarray, tail: np.ndarray) -> np.ndarray:
        pieces = []
        for part, first, last in zip(parts, firsts, lasts):
            pieces += [head[: first * len(head)], part, tail[: last * len(tail)]]
        return np.concatenate(pieces)

    student_text = np.array([len(ids) for ids, _ in student])  # (D,) each segment's tokens of text
    teacher_text = np.array([len(ids) for ids in teacher_ids])  # (D,)
    student_counts = student_text + len(s_head) * firsts + len(s_tail) * lasts  # (D,)
    teacher_counts = teacher_text + len(t_head) * firsts + len(t_tail) * lasts  # (D,)
    segment = np.repeat(np.arange(len(texts)), student_counts)  # (N,) each token's segment
    teacher_start = (np.cumsum(teacher_counts) - teacher_counts)[segment]  # (N,) its segment's first teacher token
    last = np.cumsum(student_counts) - 1  # (D,) each segment's last token
    first = last - student_counts + 1  # (D,)
    stream_ranges = back_to_back(ranges, *no_ranges)  # (N, 2) into each segment's teacher tokens of text
    if len(s_tail) and len(t_tail):
        # The student's EOS -> the teacher's EOS, which follows the segment's teacher tokens of text.
        eos = lasts & (student_text > 0) & (teacher_text > 0)  # (D,)
        stream_ranges[last[eos]] = np.stack([teacher_text[eos], teacher_text[eos] + 1], axis=1)
    # Ranges move past the teacher tokens of the segments before and the teacher's BOS; the BOS is unmapped.
    mapped = stream_ranges[:, 0] < stream_ranges[:, 1]  # (N,)
    floor = teacher_start + (len(t_head) * firsts)[segment]  # (N,) the segment's first teacher token of its text
    stream_ranges[mapped] += floor[mapped, None]
    # An unmapped token sits after the teacher tokens of the earlier tokens of its segment. The running maximum may
    # run across segments: each one's teacher tokens come after the previous one's.
    ends = np.maximum.accumulate(np.where(mapped, stream_ranges[:, 1], floor))  # (N,)
    after = np.maximum(np.concatenate([[0], ends[:-1]]), floor)  # (N,)
    cover = np.where(mapped[:, None], stream_ranges, after[:, None])  # (N, 2)
    cover[first, 0] = teacher_start[first]
    cover[last, 1] = teacher_start[last] + teacher_counts
    # Added tokens get offsets (0, 0): they end where their segment starts, so they add no bytes. Bytes are counted per
    # segment: characters that no token covers at a segment's end would be lost (none with the tokenizers here).
    offsets = back_to_back((o for _, o in student), *no_ranges)  # (N, 2)
    characters = np.array([len(text) for text in texts])  # (D,)
    character_starts = (np.cumsum(characters) - characters)[segment]  # (N,)
    bos = np.zeros(len(stream_ranges), dtype=bool)  # (N,)
    if len(s_head):
        bos[first[firsts]] = True
    return AlignedStream(
        student_ids=back_to_back((ids for ids, _ in student), s_head, s_tail),
        ranges=stream_ranges,
        bos=bos,
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
    """The block of student tokens p..q-1 of `stream`: its teacher window, and ranges relative to it. Counts its
    prediction targets in `stats`: its tokens after the first (an input only), but the BOS."""
    cover, ranges = stream.cover[p:q], stream.ranges[p:q]  # (n, 2) each
    low, high = cover[:, 0].min(), cover[:, 1].max()
    starts, lengths = ranges[:, 0] - low, ranges[:, 1] - ranges[:, 0]  # (n,) each
    fits = (starts + lengths <= teacher_max_length) & (lengths <= MAX_RANGE_LENGTH)
    lost = (lengths > 0) & ~fits  # (n,)
    lengths = np.where(fits, lengths, 0)
    # Counts over positions 1.. (the targets); the BOS is never mapped, so only `targets` needs it left out.
    stats.targets += int((~stream.bos[p + 1 : q]).sum())
    stats.mapped += int((lengths[1:] > 0).sum())
    stats.overflow_unmapped += int(lost[1:].sum())
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
        bos=stream.bos[p:],
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
        bos=np.concatenate([first.bos, second.bos]),
        cover=np.concatenate([first.cover, second.cover + shift]),
        token_bytes=np.concatenate([first.token_bytes, second.token_bytes]),
        teacher_ids=np.concatenate([first.teacher_ids, second.teacher_ids]),
    )


def pack_blocks(
    streams: Iterable[AlignedStream], block_tokens: int, teacher_max_length: int, dtypes: BlockDtypes, stats: Stats
) -> Iterator[dict[str, Any]]:
    """Blocks of `block_tokens` student tokens, the streams back to back; the last block holds what is left."""
    rest = None
    for stream in streams:
        stream = stream if rest is None else joined(rest, stream)
        full = len(stream.student_ids) // block_tokens * block_tokens
        for p in range(0, full, block_tokens):
            yield make_block(stream, p, p + block_tokens, teacher_max_length, dtypes, stats)
        rest = rest_of(stream, full)
    if rest is not None and len(rest.student_ids):
        stats.padding += block_tokens - len(rest.student_ids)
        yield make_block(rest, 0, len(rest.student_ids), teacher_max_length, dtypes, stats)


def segment_batches(segments: Iterable[Segment], max_chars: int) -> Iterator[list[Segment]]:
    batch, num_chars = [], 0
    for segment in segments:
        batch.append(segment)
        num_chars += len(segment.text)
        if num_chars >= max_chars:
            yield batch
            batch, num_chars = [], 0
    if batch:
        yield batch


def encode_segments(tokenizer: Tokenizer, segments: list[Segment]) -> list[tuple[np.ndarray, np.ndarray]]:
    """`encode_batch` of the segments' texts, each tokenized after its context and without the context's tokens.

    A token that would cross from the context into the text (none does at the cuts `documents.segments` makes, with
    the tokenizers here) makes that segment be tokenized alone instead, so that every character stays covered once.
    """
    encodings = encode_batch(tokenizer, [segment.context + segment.text for segment in segments])
    for k, (segment, (ids, offsets)) in enumerate(zip(segments, encodings)):
        n = len(segment.context)
        if n:
            context = offsets[:, 0] < n  # (N,) the context's tokens: they come first
            crossing = (offsets[context, 1] > n).any()
            encodings[k] = encode(tokenizer, segment.text) if crossing else (ids[~context], offsets[~context] - n)
    return encodings


def aligned_streams(
    segments: Iterable[Segment], student: TokenizerInfo, teacher: TokenizerInfo, stats: Stats
) -> Iterator[AlignedStream]:
    """The documents' segments tokenized, aligned and streamed a batch at a time."""
    specials = (student.bos_id, student.eos_id), (teacher.bos_id, teacher.eos_id)
    student_tokenizer, teacher_tokenizer = load_tokenizer(student.path), load_tokenizer(teacher.path)
    for batch in segment_batches(segments, BATCH_CHARS):
        student_encodings = encode_segments(student_tokenizer, batch)
        teacher_encodings = encode_segments(teacher_tokenizer, batch)
        ranges = align_batch([o for _, o in student_encodings], [o for _, o in teacher_encodings])
        texts, firsts, lasts = [s.text for s in batch], [s.first for s in batch], [s.last for s in batch]
        teacher_ids = [ids for ids, _ in teacher_encodings]
        stream = aligned_stream(texts, student_encodings, teacher_ids, ranges, *specials, firsts, lasts)
        stats.student_tokens += len(stream.student_ids)
        stats.teacher_tokens += len(stream.teacher_ids)
        yield stream
