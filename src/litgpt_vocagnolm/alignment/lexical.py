"""Token-level Lexical Alignment (the paper's Algorithm 1) and its metrics.

Each student token is mapped to the contiguous range of teacher tokens whose character spans overlap its own. Both
tokenizers report spans into the same text, so merging the student's sorted span starts (and ends) with the teacher's
sorted span ends (and starts) finds every range at once: O(N + M), vectorized, exact (docs/design.md, "Alignment").
A NumPy call costs microseconds whatever its size, more than a Python loop spends on a short document: `align_batch`
aligns many documents in one call.

Special tokens: the BOS/EOS that the data pipeline adds carry empty spans (e.g. `(0, 0)`, or `(len(text), len(text))`
for EOS). An empty student span is unmapped (`a == b`) and an empty teacher span never starts or ends a range, wherever
it sits in the sequence. Unmapped rows are `(0, 0)`. (The data pipeline then maps the student's EOS to the teacher's
EOS itself: `packing.aligned_stream`.)

Tokenizers' offsets may skip characters (GPT-NeoX trims the spaces out of its offsets); `encode` gives them back to
the tokens that hold them, so that both sides' spans tile the text (`tiling_spans`) and every student token with
characters overlaps some teacher token.

Getting offsets out of a tokenizer costs more than aligning them: `Encoding.offsets` builds a Python list of tuples,
about a quarter of the tokenization time. `encode` derives them from the token ids instead: a per-vocabulary table of
how many bytes of the text each token covers, a cumulative sum, and a byte -> character map. This holds for byte-level
BPE (Qwen2.5) and Metaspace SentencePiece BPE (Llama 2, Mistral) wherever the normalizer leaves the text as it is;
`encode` checks that per text (byte total, NFC) and otherwise reads the tokenizer's own offsets.
"""

import functools
import json
import unicodedata
from itertools import chain
from pathlib import Path
from typing import Iterable, NamedTuple, Optional, Sequence, Union

import numpy as np
from tokenizers import Encoding, Tokenizer

from litgpt_vocagnolm.alignment.tokenizer_files import load_tokenizer

METASPACE = "\u2581"  # "▁", SentencePiece's space marker
# Byte length given to unknown and added tokens (but a byte-level tokenizer's non-special ones): any text holding one
# fails the byte-total check of the derived offsets, so it falls back to the tokenizer's own offsets (added tokens
# match text outside the model's vocabulary).
NO_FAST_PATH = 1 << 40
# Whether each code point up to U+3001 is whitespace; none above U+3000 is.
WHITESPACE = np.array([chr(c).isspace() for c in range(0x3002)])


class _OffsetTable(NamedTuple):
    """What `encode` needs to derive character offsets from token ids for one tokenizer."""

    byte_lengths: np.ndarray
    """(V + 1,) int64: bytes of the original text each token id covers; NO_FAST_PATH where that is not known, and
    last, for the ids that tokens added to the tokenizer after the table was made may take."""
    prepend: str
    """Metaspace's "▁" put before the text: "never", "always", or "unless_space" (not before a leading space)."""
    needs_nfc: bool
    """The normalizer is NFC: the table holds only for text that NFC leaves unchanged."""


def _state(component: object) -> list[dict]:
    """A tokenizer component (normalizer, pre-tokenizer, post-processor) as a flat list of JSON dicts."""
    if component is None:
        return []
    state = json.loads(component.__getstate__())
    members = state.get("normalizers", state.get("pretokenizers", state.get("processors")))
    if state["type"] == "Sequence" and members is not None:
        return members
    return [state]


@functools.lru_cache(maxsize=16)
def _offset_table(tokenizer: Tokenizer) -> Optional[_OffsetTable]:
    """The table for tokenizers whose offsets follow from the ids alone, else None. Made once per tokenizer object
    (Qwen's takes ~0.1 s; even `vocab_size` takes 0.2 ms for Codestral's 771 added tokens, half a document's
    tokenizing)."""
    model = tokenizer.model
    if type(model).__name__ != "BPE":
        return None
    normalizer = [s["type"] for s in _state(tokenizer.normalizer)]
    pre_tokenizer = _state(tokenizer.pre_tokenizer)
    for processor in _state(tokenizer.post_processor):
        # Templates only add tokens. The ByteLevel post-processor may trim spaces out of the offsets it reports: the
        # derived spans keep them, with the token that holds them (what `tiling_spans` makes of the reported ones).
        if processor["type"] not in ("ByteLevel", "TemplateProcessing"):
            return None
    vocab = tokenizer.get_vocab(with_added_tokens=False)
    byte_lengths = np.full(vocab_size(tokenizer) + 1, NO_FAST_PATH, dtype=np.int64)
    ids = np.fromiter(vocab.values(), dtype=np.int64, count=len(vocab))

    byte_level = [p for p in pre_tokenizer if p["type"] == "ByteLevel"]
    if byte_level and normalizer in ([], ["NFC"]):
        if any(p.get("add_prefix_space") for p in byte_level):
            return None
        # Each character of a byte-level token stands for one byte.
        byte_lengths[ids] = np.fromiter(map(len, vocab), dtype=np.int64, count=len(vocab))
        prepend, needs_nfc = "never", normalizer == ["NFC"]
    elif normalizer == ["Prepend", "Replace"] and not pre_tokenizer:
        prepend_step, replace_step = _state(tokenizer.normalizer)
        if (prepend_step["prepend"], replace_step["pattern"], replace_step["content"]) != (
            METASPACE,
            {"String": " "},
            METASPACE,
        ):
            return None
        byte_lengths[ids] = _metaspace_lengths(vocab, model.byte_fallback)
        prepend, needs_nfc = "always", False
    elif not normalizer and [p["type"] for p in pre_tokenizer] == ["Metaspace"]:
        if pre_tokenizer[0]["replacement"] != METASPACE:
            return None
        byte_lengths[ids] = _metaspace_lengths(vocab, model.byte_fallback)
        # "first" and "always" differ only after added tokens, which take the fallback anyway.
        prepend = "never" if pre_tokenizer[0]["prepend_scheme"] == "never" else "unless_space"
        needs_nfc = False
    else:
        return None
    added = tokenizer.get_added_tokens_decoder()
    byte_lengths[list(added)] = NO_FAST_PATH
    if byte_level:
        # The NFC check leaves the text as it is, so a non-special added token (GPT-NeoX's runs of spaces) covers its
        # content. Special ones are encoded as text (`load_tokenizer`), or else take the fallback.
        text_tokens = {i: token.content for i, token in added.items() if not token.special}
        byte_lengths[list(text_tokens)] = [len(content.encode("utf-8")) for content in text_tokens.values()]
    if model.unk_token is not None and model.unk_token in vocab:
        byte_lengths[vocab[model.unk_token]] = NO_FAST_PATH
    return _OffsetTable(byte_lengths, prepend, needs_nfc)


def _metaspace_lengths(vocab: dict[str, int], byte_fallback: bool) -> np.ndarray:
    """Bytes of the original text covered by each SentencePiece piece: "▁" is one space, "<0xAB>" one byte."""

    def length(piece: str) -> int:
        if byte_fallback and len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            return 1
        return len(piece.replace(METASPACE, " ").encode("utf-8"))

    return np.fromiter(map(length, vocab), dtype=np.int64, count=len(vocab))


def _derived_offsets(table: _OffsetTable, ids: np.ndarray, text: str) -> Optional[np.ndarray]:
    """(N, 2) character offsets computed from `ids` (N,), or None where the tokenizer changed the text."""
    if table.needs_nfc and not text.isascii() and not unicodedata.is_normalized("NFC", text):
        return None
    prepended = int(table.prepend == "always" or (table.prepend == "unless_space" and not text.startswith(" ")))
    if len(ids) == 0:
        return np.zeros((0, 2), dtype=np.int64)
    # Few NumPy calls, and ufuncs rather than their wrappers (np.cumsum costs 2 us, np.add.accumulate 0.6): this runs
    # once per document.
    lengths = table.byte_lengths.take(ids, mode="clip")  # (N,); ids past the table take its last entry
    lengths[0] -= prepended  # the prepended "▁" is not in the text
    offsets = np.empty((len(ids), 2), dtype=np.int64)  # byte offsets into the text, then character offsets
    ends = np.add.accumulate(lengths, out=offsets[:, 1])
    data = text if text.isascii() else text.encode("utf-8")
    if ends[-1] != len(data):
        return None
    np.subtract(ends, lengths, out=offsets[:, 0])
    if offsets[0, 1] == 0:  # a first token of only the prepended "▁": aligned with the first character
        offsets[0, 1] = 1
    if isinstance(data, bytes):
        # Characters begun before each byte: count the UTF-8 lead bytes. A token that holds part of a character (byte
        # fallback, byte-level BPE) spans the whole character, as in the tokenizer's own offsets.
        chars_before = np.zeros(len(data) + 1, dtype=np.int64)  # (bytes + 1,)
        lead = np.frombuffer(data, dtype=np.int8) >= -0x40  # (bytes,) not 0x80-0xBF, as int8
        np.add.accumulate(lead, dtype=np.int64, out=chars_before[1:])
        offsets[:, 0] += 1
        offsets = chars_before[offsets]
        offsets[:, 0] -= 1
    return offsets


def vocab_size(tokenizer: Tokenizer) -> int:
    """One more than the largest token id, added tokens included, without building the vocabulary: tokenizers 0.22
    does for `get_vocab_size(with_added_tokens=True)`, 0.06 s for TinyLlama's and 0.4 s for Qwen2.5's here, far more
    than tokenizing a document."""
    added = tokenizer.get_added_tokens_decoder()
    return max(tokenizer.get_vocab_size(with_added_tokens=False), max(added, default=-1) + 1)


def token_byte_lengths(tokenizer: Tokenizer) -> np.ndarray:
    """(V,) int64: the UTF-8 bytes of text that each token id covers; 0 for added and special tokens (they cover none)
    and for the unknown token (it covers any).

    What the per-byte comparison of teachers divides by (`selection.teacher_reference`). The byte-level and Metaspace
    BPE tokenizers of `encode`'s fast path count exactly (a byte-level character or a `<0x..>` piece is one byte, "▁"
    the space it stands for); any other tokenizer counts the bytes of each token decoded alone.
    """
    size = vocab_size(tokenizer)
    table = _offset_table(tokenizer)
    vocab = tokenizer.get_vocab(with_added_tokens=False)
    if table is not None:
        lengths = np.where(table.byte_lengths == NO_FAST_PATH, 0, table.byte_lengths)[:size]
    else:
        lengths = np.zeros(size, dtype=np.int64)
        for token_id in vocab.values():
            lengths[token_id] = len(tokenizer.decode([token_id], skip_special_tokens=False).encode("utf-8"))
    lengths[list(tokenizer.get_added_tokens_decoder())] = 0
    unknown = getattr(tokenizer.model, "unk_token", None)  # stands for text of any length
    if unknown in vocab:
        lengths[vocab[unknown]] = 0
    return lengths


def tiling_spans(offsets: np.ndarray, text: str) -> np.ndarray:
    """(N, 2) int64: a tokenizer's (N, 2) character `offsets` into `text`, stretched to tile it.

    Tiling spans follow one another without gaps and cover the whole text, as the tokens' bytes do; they overlap only
    where tokens share a character (the byte tokens of one character, or SentencePiece's "▁" put before the first
    one). Tokenizers report spans that skip characters: GPT-NeoX's ByteLevel post-processor (`trim_offsets`) trims the
    spaces out of "Ġword" and gives a token of only spaces an empty span at their end; NFC folds "e" + U+0301 into
    "é" and reports the token without the combining mark. Each run of characters that no token reports is split where
    its whitespace begins: what comes before goes to the token before it (the mark, to "é"), the rest to the token
    after it (the space, to "Ġword"; the spaces, to the empty span). The first token starts the text and the last one
    ends it.
    """
    spans = np.array(offsets, dtype=np.int64).reshape(-1, 2)  # (N, 2), a copy
    if len(spans) == 0:
        return spans
    before = np.zeros(len(spans), dtype=np.int64)  # (N,) where the tokens before each one end
    np.maximum.accumulate(spans[:-1, 1], out=before[1:])
    after_gap = np.flatnonzero(spans[:, 0] > before)  # (G,) the tokens that unreported characters come before
    if after_gap.size:
        gap_starts, gap_stops = before[after_gap], spans[after_gap, 0]  # (G,) each
        spaces = np.append(np.flatnonzero(_whitespace(text)), len(text))  # (S + 1,)
        splits = np.minimum(spaces[np.searchsorted(spaces, gap_starts)], gap_stops)  # (G,) first space of each gap
        splits[after_gap == 0] = 0
        previous = after_gap[after_gap > 0] - 1
        spans[previous, 1] = np.maximum(spans[previous, 1], splits[after_gap > 0])
        spans[after_gap, 0] = splits
    spans[-1, 1] = max(spans[-1, 1], len(text))
    return spans


def _whitespace(text: str) -> np.ndarray:
    """(L,) bool: which characters of `text` are whitespace (`str.isspace`)."""
    code_points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)  # (L,)
    return WHITESPACE[np.minimum(code_points, len(WHITESPACE) - 1)]


def token_offsets(tokenizer: Tokenizer, text: str, encoding: Encoding, ids: np.ndarray) -> np.ndarray:
    """(N, 2) int64 character spans of `encoding`, the encoding of `text` without special tokens, tiling the text.

    `tiling_spans` of `encoding.offsets`, derived from `ids` ((N,), the encoding's ids as an array) where the tokenizer
    allows, which costs a fraction of reading `encoding.offsets` (see the module docstring). Derived spans tile the
    text by construction, and give a character the tokenizer does not report to the very token that holds it, where
    `tiling_spans` can only give it to the next token (the two differ only after a token that ends in spaces, such
    as GPT-NeoX's "ĊĠ" before "Ġword").
    """
    table = _offset_table(tokenizer)
    offsets = None if table is None else _derived_offsets(table, ids, text)
    if offsets is None:
        offsets = np.fromiter(chain.from_iterable(encoding.offsets), dtype=np.int64, count=2 * len(ids))
        offsets = tiling_spans(offsets.reshape(-1, 2), text)
    return offsets


def encode(tokenizer: Tokenizer, text: str) -> tuple[np.ndarray, np.ndarray]:
    """Token ids (N,) int32 and character offsets (N, 2) int64 of `text`, without special tokens.

    The offsets equal `tokenizer.encode(text, add_special_tokens=False).offsets` (see `token_offsets`).
    """
    encoding = tokenizer.encode(text, add_special_tokens=False)
    ids = np.array(encoding.ids, dtype=np.int32)  # (N,)
    return ids, token_offsets(tokenizer, text, encoding, ids)


def encode_batch(tokenizer: Tokenizer, texts: Iterable[str]) -> list[tuple[np.ndarray, np.ndarray]]:
    """`encode` for many texts, tokenized in parallel by the tokenizer's Rust thread pool."""
    texts = list(texts)
    encodings = tokenizer.encode_batch(texts, add_special_tokens=False)
    ids = [np.array(encoding.ids, dtype=np.int32) for encoding in encodings]
    return [(i, token_offsets(tokenizer, text, e, i)) for i, text, e in zip(ids, texts, encodings)]


def _check_offsets(offsets: np.ndarray, name: str) -> np.ndarray:
    """`offsets` as an (N, 2) integer array of spans in text order; a clear error otherwise."""
    offsets = np.asarray(offsets)
    if offsets.size == 0:
        offsets = offsets.reshape(-1, 2).astype(np.int64)
    if offsets.ndim != 2 or offsets.shape[1] != 2:
        raise ValueError(f"{name} must have shape (N, 2), [start, end) character spans; got shape {offsets.shape}.")
    if not np.issubdtype(offsets.dtype, np.integer):
        raise ValueError(f"{name} must hold integer character offsets; got dtype {offsets.dtype}.")
    starts, ends = offsets[:, 0], offsets[:, 1]
    if starts.min(initial=0) < 0 or (starts > ends).any():
        i = np.flatnonzero((starts < 0) | (starts > ends))[0]
        raise ValueError(f"{name}[{i}] = {offsets[i].tolist()} is not a span: need 0 <= start <= end.")
    # Empty spans (special tokens) may sit anywhere; the others must advance through the text.
    spans = offsets[starts < ends] if (starts == ends).any() else offsets  # (N', 2)
    backwards = spans[1:] < spans[:-1]  # (N' - 1, 2)
    if backwards.any():
        k = np.flatnonzero(backwards.any(axis=1))[0]
        i, j = np.flatnonzero(starts < ends)[[k, k + 1]]
        raise ValueError(
            f"{name} go backwards: token {j} spans {offsets[j].tolist()} after token {i} spans {offsets[i].tolist()}."
            " Offsets must come from one encoding of one text, in token order; shift each document's offsets by its"
            " start when concatenating documents."
        )
    return offsets


def align(student_offsets: np.ndarray, teacher_offsets: np.ndarray) -> np.ndarray:
    """Token-level Lexical Alignment: for each student token, the range of teacher tokens covering its characters.

    Arguments:
        student_offsets: (N, 2) character spans `[start, end)` of the student tokens.
        teacher_offsets: (M, 2) character spans of the teacher tokens of the same text.

    Returns:
        (N, 2) int64: row `i` is the half-open range `[a, b)` of the teacher tokens whose spans overlap student span
        `i`. A teacher token with an empty span never starts or ends a range (special tokens at a document's edges
        are never inside one); one between two overlapping tokens is inside it. An empty student span, or one that
        overlaps no teacher token, is unmapped: `(0, 0)`.
    """
    student = _check_offsets(student_offsets, "student_offsets")
    teacher = _check_offsets(teacher_offsets, "teacher_offsets")
    starts, ends = teacher[:, 0], teacher[:, 1]  # (M,) each, non-decreasing over the tokens with characters
    special = (starts == ends).any()
    if special:
        kept = np.append(np.flatnonzero(starts < ends), len(teacher))  # (M' + 1,): tokens with characters, then M
        starts, ends = starts[kept[:-1]], ends[kept[:-1]]
    # Teacher token j overlaps [s, e) iff ends[j] > s and starts[j] < e. Both columns are sorted, so the overlapping
    # tokens are the run [first, stop): first = #(ends <= s), stop = #(starts < e) = #(starts <= e - 1).
    empty = student[:, 0] == student[:, 1]  # (N,)
    keys = student  # (N, 2), sorted over the tokens with characters
    if empty.any():
        # Empty spans are unmapped wherever they sit: each takes the keys of the last token with characters before it
        # (zeros before the first), so that the keys are sorted.
        last = np.maximum.accumulate(np.where(empty, -1, np.arange(len(student))))  # (N,)
        keys = np.where(last[:, None] >= 0, student[last], 0)
    first, stop = _count_at_most(ends, keys[:, 0]), _count_at_most(starts, keys[:, 1] - 1)  # (N,) each
    unmapped = (first >= stop) | empty  # (N,)
    if special:
        # Back to indices into all teacher tokens: a range runs from its first to its last token with characters.
        first, stop = kept[first], kept[stop - 1] + 1
    ranges = np.stack([first, stop], axis=1)  # (N, 2)
    ranges[unmapped] = 0
    return ranges


def _count_at_most(values: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """(K,) int64: how many of `values` (V,) are at most each of `keys` (K,); both sorted.

    `np.searchsorted(values, keys, side="right")`, as one stable merge of the two sorted runs (timsort's), which reads
    both in order: a binary search per key misses the cache at each probe, 2-3 times slower on a million tokens.
    """
    merged = np.concatenate([values, keys]).argsort(kind="stable")  # (V + K,) a value before a key equal to it
    return np.flatnonzero(merged >= len(values)) - np.arange(len(keys))  # position among all, less the keys before


def align_batch(student_offsets: Sequence[np.ndarray], teacher_offsets: Sequence[np.ndarray]) -> list[np.ndarray]:
    """`align` for many documents in one vectorized call: ranges[d] == align(student_offsets[d], teacher_offsets[d]).

    One `align` call costs tens of microseconds of NumPy overhead whatever its size, more than a Python loop takes for
    a short document; this pays it once. Each document's ranges index its own teacher tokens.
    """
    if len(student_offsets) != len(teacher_offsets):
        raise ValueError(
            f"Got {len(student_offsets)} student and {len(teacher_offsets)} teacher offset arrays; need one pair per"
            " document."
        )
    if not student_offsets:
        return []
    student_counts = np.fromiter(map(len, student_offsets), dtype=np.int64, count=len(student_offsets))  # (D,)
    teacher_counts = np.fromiter(map(len, teacher_offsets), dtype=np.int64, count=len(teacher_offsets))  # (D,)
    try:
        student, teacher = np.concatenate(student_offsets), np.concatenate(teacher_offsets)  # (N, 2), (M, 2)
        if student.dtype.kind not in "iu" or teacher.dtype.kind not in "iu":
            raise ValueError("offsets must be integers")
        if min(student.min(initial=0), teacher.min(initial=0)) < 0:
            raise ValueError("offsets must be non-negative")
        # Moving document d to characters [d * stride, (d + 1) * stride) keeps the documents apart and in order. In
        # int32 where they fit (a fifth faster than int64: half the memory to read), else int64.
        stride = int(max(student.max(initial=0), teacher.max(initial=0))) + 1
        dtype = np.int32 if len(student_counts) * stride < 2**31 else np.int64
        student, teacher = student.astype(dtype, copy=False), teacher.astype(dtype, copy=False)
        doc_starts = np.arange(len(student_counts)) * stride
        student += np.repeat(doc_starts, student_counts)[:, None]
        teacher += np.repeat(doc_starts, teacher_counts)[:, None]
        ranges = align(student, teacher)  # (N, 2) into all M teacher tokens
    except (ValueError, IndexError):
        # Name the document at fault: align it alone.
        for d, (s, t) in enumerate(zip(student_offsets, teacher_offsets)):
            try:
                align(s, t)
            except ValueError as error:
                raise ValueError(f"Document {d}: {error}") from None
        raise
    # Each document's ranges index its own teacher tokens; unmapped rows stay (0, 0).
    teacher_firsts = np.repeat(np.cumsum(teacher_counts) - teacher_counts, student_counts)  # (N,)
    ranges -= (teacher_firsts * (ranges[:, 0] < ranges[:, 1]))[:, None]
    bounds = np.cumsum(student_counts).tolist()
    return [ranges[start:stop] for start, stop in zip([0] + bounds[:-1], bounds)]


def chunk_align(num_student: int, num_teacher: int, num_chunks: int) -> np.ndarray:
    """Chunk alignment, the paper's Table 2 baseline: both sequences cut into `num_chunks` chunks of equal token count.

    Chunk c holds tokens `[c * n // C, (c + 1) * n // C)` of a sequence of n tokens (sizes differ by at most one).

    Returns:
        (num_student, 2) int64: student tokens of chunk c map to all teacher tokens of chunk c (`a == b` where that
        teacher chunk is empty, when there are fewer teacher tokens than chunks).
    """
    if num_chunks < 1:
        raise ValueError(f"num_chunks must be at least 1, got {num_chunks}.")
    if num_student < 0 or num_teacher < 0:
        raise ValueError(f"Token counts must be non-negative; got {num_student} student, {num_teacher} teacher.")
    teacher_bounds = np.arange(num_chunks + 1) * num_teacher // num_chunks  # (C + 1,)
    chunk = token_chunks(num_student, num_chunks)  # (N,)
    return np.stack([teacher_bounds[chunk], teacher_bounds[chunk + 1]], axis=1)


def token_chunks(num_tokens: int, num_chunks: int) -> np.ndarray:
    """(num_tokens,) int64: the chunk of each token, chunk c holding tokens `[c * n // C, (c + 1) * n // C)`."""
    bounds = np.arange(num_chunks + 1) * num_tokens // num_chunks  # (C + 1,)
    return np.searchsorted(bounds, np.arange(num_tokens), side="right") - 1


def chunk_span_ios_iou(
    student_offsets: np.ndarray, teacher_offsets: np.ndarray, num_chunks: int
) -> tuple[float, float]:
    """Chunk alignment's overlap as chunk spans (the paper's Figure 3): the characters of student chunk c against those
    of teacher chunk c, chunks as in `chunk_align`.

    A chunk's characters are those inside the spans of its tokens. Per chunk, IoS = |S_c ∩ T_c| / |S_c| and
    IoU = |S_c ∩ T_c| / |S_c ∪ T_c|; both fall as chunks get finer, since the two sequences' chunk boundaries fall
    on different characters. (`token_ios_iou` over `chunk_align` ranges measures something else: each student token
    against its whole teacher chunk, whose IoU rises as chunks shrink towards tokens.)

    Arguments:
        student_offsets: (N, 2) character spans of the student tokens.
        teacher_offsets: (M, 2) character spans of the teacher tokens of the same text.
        num_chunks: C, chunks per sequence.

    Returns:
        ios, iou: the means over chunks whose student (IoS) or either (IoU) side holds characters; NaN if none does.
    """
    student = _check_offsets(student_offsets, "student_offsets")
    teacher = _check_offsets(teacher_offsets, "teacher_offsets")
    if num_chunks < 1:
        raise ValueError(f"num_chunks must be at least 1, got {num_chunks}.")
    length = int(max(student[:, 1].max(initial=0), teacher[:, 1].max(initial=0)))

    def chunk_bounds(offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(length,) each: the first and last chunk of the tokens covering a character; (C, -1) where none does."""
        chunk = token_chunks(len(offsets), num_chunks)  # (n,)
        lengths = offsets[:, 1] - offsets[:, 0]  # (n,)
        # Every (character, chunk) pair a token covers: a token split inside a character (byte-level BPE) shares it
        # with its neighbour, which may sit in the next chunk.
        chars = np.repeat(offsets[:, 0] - np.cumsum(lengths) + lengths, lengths) + np.arange(lengths.sum())
        chunks = np.repeat(chunk, lengths)
        first, last = np.full(length, num_chunks), np.full(length, -1)
        np.minimum.at(first, chars, chunks)
        np.maximum.at(last, chars, chunks)
        return first, last

    def count(first: np.ndarray, last: np.ndarray) -> np.ndarray:
        """(C,): characters whose chunk range [first, last] holds chunk c."""
        kept = first <= last
        size = num_chunks + 1
        depth = np.bincount(first[kept], minlength=size) - np.bincount(last[kept] + 1, minlength=size)  # (C + 1,)
        return np.cumsum(depth)[:num_chunks]

    s_first, s_last = chunk_bounds(student)
    t_first, t_last = chunk_bounds(teacher)
    s_size, t_size = count(s_first, s_last), count(t_first, t_last)  # (C,) each
    inter = count(np.maximum(s_first, t_first), np.minimum(s_last, t_last))  # (C,)
    union = s_size + t_size - inter
    ios = inter[s_size > 0] / s_size[s_size > 0]
    iou = inter[union > 0] / union[union > 0]
    return (float(ios.mean()) if ios.size else float("nan"), float(iou.mean()) if iou.size else float("nan"))


def token_ios_iou(
    student_offsets: np.ndarray, teacher_offsets: np.ndarray, ranges: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per-token IoS and IoU of each student span with its mapped teacher span.

    The mapped teacher span of a range `[a, b)` runs from the start of its first to the end of its last token with
    characters. IoS = |student ∩ teacher| / |student|, IoU = |∩| / |∪|.

    Returns:
        ios, iou: (N,) float64 each; 0 for unmapped tokens, NaN for empty student spans (they are not measured).
    """
    student = _check_offsets(student_offsets, "student_offsets")
    teacher = _check_offsets(teacher_offsets, "teacher_offsets")
    ranges = np.asarray(ranges)
    if ranges.shape != (len(student), 2):
        raise ValueError(
            f"ranges must have shape ({len(student)}, 2), one row per student token; got shape {ranges.shape}."
        )
    if np.any(ranges[:, 0] < 0) or np.any(ranges[:, 0] > ranges[:, 1]) or np.any(ranges[:, 1] > len(teacher)):
        raise ValueError(f"ranges must be [a, b) with 0 <= a <= b <= {len(teacher)} (the number of teacher tokens).")
    has_chars = teacher[:, 0] < teacher[:, 1]
    kept_before = np.concatenate([[0], np.cumsum(has_chars)])  # (M + 1,): teacher tokens with characters before j
    starts, ends = teacher[has_chars, 0], teacher[has_chars, 1]
    first, stop = kept_before[ranges[:, 0]], kept_before[ranges[:, 1]]  # (N,) each: the range within starts / ends
    measured = student[:, 0] < student[:, 1]
    ios = np.where(measured, 0.0, np.nan)  # (N,)
    iou = ios.copy()
    mapped = measured & (first < stop)
    s, e = student[mapped, 0], student[mapped, 1]
    t_start, t_end = starts[first[mapped]], ends[stop[mapped] - 1]
    inter = np.clip(np.minimum(e, t_end) - np.maximum(s, t_start), 0, None)
    ios[mapped] = inter / (e - s)
    iou[mapped] = inter / ((e - s) + (t_end - t_start) - inter)
    return ios, iou


def ios_iou(student_offsets: np.ndarray, teacher_offsets: np.ndarray, ranges: np.ndarray) -> tuple[float, float]:
    """Mean IoS and IoU over the student tokens with non-empty spans (NaN if there are none). See `token_ios_iou`."""
    ios, iou = token_ios_iou(student_offsets, teacher_offsets, ranges)
    measured = ~np.isnan(ios)
    if not measured.any():
        return float("nan"), float("nan")
    return float(ios[measured].mean()), float(iou[measured].mean())


def vocab_overlap(student: Tokenizer, teacher: Tokenizer) -> float:
    """|V_S ∩ V_T| / |V_T| over raw token strings, added tokens included (the paper's Figure 1)."""
    student_vocab = student.get_vocab(with_added_tokens=True)
    teacher_vocab = teacher.get_vocab(with_added_tokens=True)
    return len(student_vocab.keys() & teacher_vocab.keys()) / len(teacher_vocab)


class TextAlignment(NamedTuple):
    """Both encodings of one text and the alignment between them."""

    student_ids: np.ndarray
    """(N,) int32"""
    student_offsets: np.ndarray
    """(N, 2) int64 character spans"""
    teacher_ids: np.ndarray
    """(M,) int32"""
    teacher_offsets: np.ndarray
    """(M, 2) int64 character spans"""
    ranges: np.ndarray
    """(N, 2) int64: `align(student_offsets, teacher_offsets)`"""


def align_text(student: Union[Tokenizer, str, Path], teacher: Union[Tokenizer, str, Path], text: str) -> TextAlignment:
    """Encodes `text` with both tokenizers (or tokenizer / LitGPT checkpoint dirs), no special tokens, and aligns."""
    student = student if isinstance(student, Tokenizer) else load_tokenizer(student)
    teacher = teacher if isinstance(teacher, Tokenizer) else load_tokenizer(teacher)
    student_ids, student_offsets = encode(student, text)
    teacher_ids, teacher_offsets = encode(teacher, text)
    return TextAlignment(
        student_ids, student_offsets, teacher_ids, teacher_offsets, align(student_offsets, teacher_offsets)
    )
