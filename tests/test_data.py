import hashlib
import json
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import BIN, LLEMMA, MISTRAL, QWEN, ROOT, TINYLLAMA, tiny_config, typed_here
from hypothesis import given, settings
from hypothesis import strategies as st

import litgpt_vocagnolm.data.documents as documents_module
import litgpt_vocagnolm.data.packing as packing_module
import litgpt_vocagnolm.files as files_module
from litgpt_vocagnolm.alignment.lexical import align, chunk_align, encode, tiling_spans
from litgpt_vocagnolm.alignment.tokenizer_files import (
    document_specials,
    find_tokenizer_file,
    load_tokenizer,
    same_vocabulary,
    tokenizer_info,
)
from litgpt_vocagnolm.data import prepare as prepare_module
from litgpt_vocagnolm.data.documents import Stats, find_input_files, plan_units
from litgpt_vocagnolm.data.packing import BlockDtypes, aligned_stream, aligned_streams, pack_blocks
from litgpt_vocagnolm.data.prepare import prepare
from litgpt_vocagnolm.data.prepared import SPLITS, VocAgnoData, iter_blocks, padded_window
from litgpt_vocagnolm.errors import InvalidArgument
from litgpt_vocagnolm.files import file_sha256
from litgpt_vocagnolm.training.checks import tokenizer_pair_summary

STUDENT, TEACHER = TINYLLAMA, QWEN
# Documents as LitGPT's Tokenizer frames them: TinyLlama's <s> ... </s>, Qwen2.5's ... <|endoftext|>
BOS, STUDENT_EOS, EOS = 1, 2, 151643
MAX_SEQ_LENGTH = 64

UNICODE_DOCS = [
    "Ελληνικά: ∀ε>0 ∃δ>0, |x−a|<δ ⇒ |f(x)−f(a)|<ε",
    "日本語の数学: 二次方程式 x² + 2x + 1 = 0 の解は x = −1 です。",
    "Emoji 🧮🔢, astral 𝔽_p and 𝒪(n log n); combining e\u0301 and n\u0303.",
    "العربية: ٣ + ٤ = ٧\twith a tab\r\nand CRLF",
    "  leading spaces, trailing spaces  ",
    "\n\n",
]


def small_units(monkeypatch):
    # Units of 4 KB, so that the small corpus spreads over many units (and files over several) and both workers;
    # segments of 1,000 characters, so that long.txt is read and tokenized in pieces.
    monkeypatch.setattr(documents_module, "UNIT_BYTES", (4096, 4096))
    monkeypatch.setattr(documents_module, "SEGMENT_CHARS", 1000)


@pytest.fixture(autouse=True)
def environment(monkeypatch):
    small_units(monkeypatch)


@pytest.fixture(scope="module")
def tokenizers():
    return load_tokenizer(STUDENT), load_tokenizer(TEACHER)


def gsm8k(n):
    with open(ROOT / "data" / "gsm8k" / "train.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for _, line in zip(range(n), f)]


def stackexchange(n):
    with open(ROOT / "data" / "stackexchange" / "math_stackexchange_33votes.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for _, line in zip(range(n), f)]


def write_corpus(root: Path) -> tuple[list[str], dict[str, int], set[str]]:
    """Real and Unicode-heavy documents in every format, with bad records and files among them.

    Returns the documents `prepare` must keep, the skipped-record reasons with counts, and the skipped files.
    """
    root.mkdir(parents=True)
    qa = [f"{r['question']}\n\n{r['answer']}" for r in gsm8k(30)]
    lines = [json.dumps({"text": text}) for text in qa[:15] + UNICODE_DOCS[:3] + [""]]
    lines[3:3] = ['{"title": "no text field"}', "{not json", '{"text": "a lone \\ud800 surrogate"}', ""]
    (root / "docs.jsonl").write_bytes("\n".join(lines).encode() + b'\n{"text": "caf\xe9"}\n' + lines[-1].encode())
    table = pa.table({"text": qa[15:] + UNICODE_DOCS[3:] + ["", None]})
    pq.write_table(table, root / "rows.parquet", row_group_size=4)
    long_document = "\n\n".join(f"{r['input']}\n{r['output']}" for r in stackexchange(3))
    (root / "long.txt").write_text(long_document, encoding="utf-8", newline="")
    (root / "sub").mkdir()
    (root / "sub" / "crlf.txt").write_bytes("Windows line ends\r\nand ünïcödé\r\n".encode())
    (root / "sub" / "latin1.txt").write_bytes("café".encode("latin-1"))
    (root / "sub" / "empty.jsonl").write_bytes(b"")
    (root / "README.md").write_text("not a document\n")
    documents = qa[:15] + UNICODE_DOCS[:3] + ["", ""] + qa[15:] + UNICODE_DOCS[3:] + [""]
    documents += [long_document, "Windows line ends\r\nand ünïcödé\r\n"]
    reasons = {
        "missing field 'text'": 1,
        "invalid JSON": 1,
        "not valid Unicode (lone surrogate)": 1,
        "not UTF-8": 1,
        "field 'text' is null": 1,
    }
    return documents, reasons, {"latin1.txt", "empty.jsonl", "README.md"}


def prepare_args(root: Path, output: Path) -> dict:
    return dict(
        student=STUDENT,
        teacher=TEACHER,
        input=[root],
        output=output,
        max_seq_length=MAX_SEQ_LENGTH,
        num_workers=2,
        val_fraction=0.25,
    )


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus") / "in"
    return root, *write_corpus(root)


@pytest.fixture(scope="module")
def prepared(corpus, tmp_path_factory):
    root = corpus[0]
    output = tmp_path_factory.mktemp("prepared") / "out"
    with pytest.MonkeyPatch.context() as monkeypatch:
        small_units(monkeypatch)
        prepare(**prepare_args(root, output))
    return output


def all_blocks(output):
    return {split: list(iter_blocks(output, split)) for split in ("train", "val")}


def documents_of(blocks):
    """Splits the stream of a split's student tokens at BOS: [(ids, [(block, position), ...]), ...]."""
    documents = []
    for b, block in enumerate(blocks):
        for position in range(block["num_tokens"]):
            token = int(block["student_ids"][position])
            if token == BOS:
                documents.append(([], []))
            documents[-1][0].append(token)
            documents[-1][1].append((b, position))
    return documents


def brute_token_bytes(text, offsets):
    """UTF-8 bytes of the characters each token ends that no earlier token ended."""
    out, done = [], 0
    for _, end in offsets:
        out.append(len(text[done : max(done, end)].encode("utf-8")))
        done = max(done, end)
    return out


def test_nothing_lost_and_every_range_covers_its_token(prepared, corpus, tokenizers):
    root, expected, reasons, skipped_files = corpus
    student, teacher = tokenizers
    manifest = json.loads((prepared / "manifest.json").read_text())
    blocks = all_blocks(prepared)
    decoded = []
    for split, split_blocks in blocks.items():
        counts = manifest["splits"][split]
        assert len(split_blocks) == counts["blocks"] > 0
        # Full blocks, but the last of each work unit.
        padding = [MAX_SEQ_LENGTH + 1 - block["num_tokens"] for block in split_blocks]
        short = [p for p in padding if p > 0]
        assert 1 <= len(short) <= len(plan_units(find_input_files([root], "--input")[0]))
        assert sum(short) == counts["padding"]
        block_bytes = [0] * len(split_blocks)
        first_token_bytes = overflow = mapped = 0
        documents = documents_of(split_blocks)
        assert len(documents) == counts["documents"]
        for ids, places in documents:
            assert ids[-1] == STUDENT_EOS
            text = student.decode(ids[1:-1], skip_special_tokens=False)
            decoded.append(text)
            encoding = student.encode(text, add_special_tokens=False)
            assert encoding.ids == ids[1:-1]  # the blocks hold exactly the student's own encoding
            t = teacher.encode(text, add_special_tokens=False)
            t_offsets = tiling_spans(t.offsets, text).tolist()  # as `encode` gives them: every character in a token
            b, position = places[0]
            assert split_blocks[b]["ranges"][position].tolist() == [0, 0]  # BOS: unmapped
            token_bytes = brute_token_bytes(text, encoding.offsets)
            first = 0  # the first teacher token ending after the student token's start (both go left to right)
            for (start, end), (b, position), nbytes in zip(encoding.offsets, places[1:], token_bytes):
                if position == 0:
                    first_token_bytes += nbytes
                else:
                    block_bytes[b] += nbytes
                while first < len(t_offsets) and t_offsets[first][1] <= start:
                    first += 1
                stop = first
                while stop < len(t_offsets) and t_offsets[stop][0] < end:
                    stop += 1
                a, e = split_blocks[b]["ranges"][position].tolist()
                assert first < stop  # the teacher's spans tile the text (Qwen's NFC "e\u0301" -> "é" included)
                if position > 0:  # a prediction target
                    overflow, mapped = overflow + (a == e), mapped + (a < e)
                if a < e:  # else no room left in the window
                    # The range is this document's run of teacher tokens overlapping the student token's characters,
                    # and they cover them.
                    assert split_blocks[b]["teacher_ids"][a:e].tolist() == t.ids[first:stop]
                    assert t_offsets[first][0] <= start and end <= t_offsets[stop - 1][1], text[start:end]
            # The EOS maps to the teacher's EOS where both sides hold some token of the text (if the window has room).
            b, position = places[-1]
            a, e = split_blocks[b]["ranges"][position].tolist()
            assert split_blocks[b]["teacher_ids"][a:e].tolist() == ([EOS] if a < e else [])
            assert a == e or (encoding.ids and t.ids)
            if position > 0 and encoding.ids and t.ids:
                overflow, mapped = overflow + (a == e), mapped + (a < e)
        assert overflow == counts["overflow_unmapped"]
        # Prediction targets: every token but each block's first, and the BOS.
        bos_targets = sum(places[0][1] > 0 for _, places in documents)
        targets = sum(block["num_tokens"] - 1 for block in split_blocks) - bos_targets
        assert (targets, mapped) == (counts["targets"], counts["mapped"])
        assert counts["mapped_share"] == mapped / targets
        assert block_bytes == [block["num_bytes"] for block in split_blocks]
        assert sum(block_bytes) + first_token_bytes == counts["bytes"]

    assert Counter(decoded) == Counter(expected)  # every document exactly once, across both splits
    assert manifest["skipped_records"] == reasons
    assert {Path(path).name for path, _ in manifest["skipped_files"]} == skipped_files
    assert manifest["splits"]["train"]["documents"] + manifest["splits"]["val"]["documents"] == len(expected)
    assert manifest["alignment_bytes_per_student_token"] <= 4
    assert manifest["student"]["sha256"] == file_sha256(STUDENT / "tokenizer.json")
    assert manifest["teacher"]["path"] == str((TEACHER / "tokenizer.json.gz").resolve())


def test_prepare_and_training_report_the_mapped_share_of_prediction_targets(prepared, capsys):
    """`prepare`'s summary and the line training starts with give the share of prediction targets mapped (the counts
    are checked against the blocks above)."""
    manifest = json.loads((prepared / "manifest.json").read_text())
    splits = manifest["splits"].values()
    assert manifest["mapped_share"] == sum(s["mapped"] for s in splits) / sum(s["targets"] for s in splits)
    prepare_module.print_summary(prepared, manifest)
    out = capsys.readouterr().out
    for s in splits:
        assert f"; {s['mapped_share']:.2%} of its {s['targets']:,} prediction targets (every token but the BOS" in out
    line = tokenizer_pair_summary(VocAgnoData(prepared), STUDENT, TEACHER)
    assert line.startswith(f"Tokenizer pair: {manifest['mapped_share']:.2%} of the prepared prediction targets (")


def test_long_document_spans_many_blocks(prepared, corpus, tokenizers):
    long_document = corpus[1][-2]
    ids = [BOS] + tokenizers[0].encode(long_document, add_special_tokens=False).ids + [STUDENT_EOS]
    assert len(ids) > 10 * (MAX_SEQ_LENGTH + 1)
    documents = [d for blocks in all_blocks(prepared).values() for d in documents_of(blocks) if d[0] == ids]
    assert len(documents) == 1
    assert len({b for b, _ in documents[0][1]}) > 10


def test_document_specials_follow_tokenizer_config(tokenizers, tmp_path):
    student, teacher = tokenizers
    assert document_specials(STUDENT / "tokenizer.json", student) == (BOS, STUDENT_EOS)
    assert document_specials(TEACHER / "tokenizer.json.gz", teacher) == (None, EOS)
    with pytest.raises(ValueError, match="tokenizer_config.json"):
        document_specials(tmp_path / "tokenizer.json", student)  # no config next to it


texts = st.text(alphabet=list("ab 1+=\n\té日😀∑\u0301"), max_size=30)


@settings(max_examples=30, deadline=None)
@given(
    documents=st.lists(texts, min_size=1, max_size=6),
    cuts=st.lists(st.booleans(), min_size=6, max_size=6),
    block_size=st.integers(2, 20),
    cap=st.integers(1, 30),
)
def test_pack_blocks_keeps_every_token_and_its_teacher_tokens(tokenizers, documents, cuts, block_size, cap):
    """Blocks hold each document as BOS, text, EOS; each text token maps to its own teacher tokens, the student's EOS to
    the teacher's EOS (where both sides hold text) with the teacher's prediction of it in the window, the BOS to none;
    and the counts are of prediction targets."""
    student, teacher = tokenizers
    encoded = [(encode(student, text), encode(teacher, text)) for text in documents]
    doc_ranges = [align(s_offsets, t_offsets) for (_, s_offsets), (_, t_offsets) in encoded]
    doc_teacher = [t_ids.tolist() + [EOS] for _, (t_ids, _) in encoded]  # Qwen's tokens with the EOS prepare adds
    # The documents in batches, as `prepare` tokenizes them: a new batch after document d where cuts[d].
    batches = [[]]
    for d in range(len(documents)):
        batches[-1].append(d)
        if cuts[d] and d < len(documents) - 1:
            batches.append([])
    streams = []
    for batch in batches:
        texts, ranges = [documents[d] for d in batch], [doc_ranges[d] for d in batch]
        student_encodings, teacher_ids = [encoded[d][0] for d in batch], [encoded[d][1][0] for d in batch]
        streams.append(aligned_stream(texts, student_encodings, teacher_ids, ranges, (BOS, STUDENT_EOS), (None, EOS)))
        expected_bytes = [[0] + brute_token_bytes(documents[d], encoded[d][0][1].tolist()) + [0] for d in batch]
        assert streams[-1].token_bytes.tolist() == sum(expected_bytes, [])
    dtypes = BlockDtypes.fitting(32000, 151665, cap)
    full, capped = Stats(), Stats()
    uncapped_blocks = list(pack_blocks(streams, block_size, 10**6, dtypes, full))
    blocks = list(pack_blocks(streams, block_size, cap, dtypes, capped))

    stream = sum(([BOS] + s_ids.tolist() + [STUDENT_EOS] for (s_ids, _), _ in encoded), [])
    assert np.concatenate([b["student_ids"] for b in blocks]).tolist() == stream
    assert [len(b["student_ids"]) for b in blocks[:-1]] == [block_size] * (len(blocks) - 1)
    # Where each stream position comes from: (document, token); token 0 is the BOS, the last the EOS.
    origin = [(d, k) for d, ((s_ids, _), _) in enumerate(encoded) for k in range(len(s_ids) + 2)]
    overflow = mapped = targets = position = 0
    for big, small in zip(uncapped_blocks, blocks):
        n = len(big["student_ids"])
        window = big["teacher_ids"].tolist()
        # The window: per document in the block, the teacher tokens overlapping the block's characters of it, and
        # the teacher's EOS where the block holds the document's end, its EOS.
        expected_window = []
        held = origin[position : position + n]
        for d in dict.fromkeys(d for d, _ in held):
            (_, s_offsets), (_, t_offsets) = encoded[d]
            tokens = [k - 1 for dd, k in held if dd == d and 0 < k <= len(s_offsets)]
            if tokens:
                lo, hi = s_offsets[tokens[0], 0], s_offsets[tokens[-1], 1]
                overlapping = (t_offsets[:, 1] > lo) & (t_offsets[:, 0] < hi)
                expected_window += [token for token, keep in zip(doc_teacher[d], overlapping) if keep]
            if (d, len(s_offsets) + 1) in held:
                expected_window.append(EOS)
        assert window == expected_window
        assert small["teacher_ids"].tolist() == window[:cap]
        for i in range(n):
            d, k = origin[position + i]
            a, b = big["range_starts"][i], big["range_starts"][i] + big["range_lengths"][i]
            text_tokens, teacher_tokens = len(encoded[d][0][0]), len(encoded[d][1][0])
            if 0 < k <= text_tokens:
                doc_a, doc_b = doc_ranges[d][k - 1]
            elif k > text_tokens and text_tokens and teacher_tokens:  # the EOS
                doc_a, doc_b = teacher_tokens, teacher_tokens + 1
            else:  # the BOS, or the EOS of a document one side holds no token of
                doc_a, doc_b = 0, 0
            assert window[a:b] == doc_teacher[d][doc_a:doc_b]  # the same teacher tokens
            assert (a < b) == (doc_a < doc_b)
            kept = b <= cap and b - a <= 255
            expected = (a, b) if a < b and kept else (0, 0)
            assert (small["range_starts"][i], small["range_starts"][i] + small["range_lengths"][i]) == expected
            if i > 0:  # a prediction target, unless the BOS
                targets += k > 0
                overflow += a < b and not kept
                mapped += a < b and kept
                if k > text_tokens and a < b:
                    assert a > 0  # the teacher's loss of its EOS, predicted from its window's token before it
        position += n
    assert capped.targets == full.targets == targets
    assert capped.overflow_unmapped == overflow and full.overflow_unmapped == 0
    assert capped.mapped == mapped and capped.mapped + overflow == full.mapped


def line_or_word_boundary(text: str, c: int, end: int) -> str:
    """Whether a cut before text[c] lies after a line break that blanks and a non-space follow ("line") or before a
    space between words ("word")."""
    visible = text[c : end + 1]  # `segments` looks one character past the window
    blanks = len(visible) - len(visible.lstrip())
    if text[c - 1] == "\n" and blanks < len(visible) and not {"\r", "\n"} & set(visible[:blanks]):
        return "line"
    if c < end and text[c] == " " and not text[c - 1].isspace() and not text[c + 1].isspace():
        return "word"
    return ""


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet=list("ab \n\r\té😀"), max_size=60), max_chars=st.integers(2, 12), data=st.data())
def test_segments_cover_the_text_once_and_cut_at_the_last_boundary(text, max_chars, data):
    chunks = documents_module.TextChunks(text, data.draw(st.integers(1, max_chars)))
    segments = list(documents_module.segments(chunks, max_chars))
    assert segments == list(documents_module.segments([text], max_chars))  # however the text comes in chunks
    assert "".join(s.text for s in segments) == text
    assert [(s.first, s.last) for s in segments] == [(k == 0, k == len(segments) - 1) for k in range(len(segments))]
    start = 0
    for previous, segment in zip(segments, segments[1:]):
        assert 0 < len(previous.text) <= max_chars
        # Brute force: the window is the second half of max_chars; line boundaries come first, then word ones.
        window = range(start + max_chars // 2 + 1, start + max_chars + 1)
        kinds = {c: line_or_word_boundary(text, c, start + max_chars) for c in window}
        lines, words = [c for c in window if kinds[c] == "line"], [c for c in window if kinds[c] == "word"]
        cut = start + len(previous.text)
        assert cut == (lines or words or [start + max_chars])[-1]
        assert segment.context == (text[cut - 1] if lines or words else "")
        start = cut
    assert len(segments[-1].text) <= max_chars and (segments[-1].text or text == "")


def long_documents() -> list[str]:
    """Real text: four documents of ten Stack Exchange posts each (up to 41,000 characters), and short GSM8K ones."""
    answers = [f"{r['input']}\n\n{r['output']}" for r in stackexchange(40)]
    qa = [f"{r['question']}\n\n{r['answer']}" for r in gsm8k(40)]
    return ["\n\n".join(answers[k : k + 10]) for k in range(0, 40, 10)] + qa


def pack(texts: list[str], teacher: Path, max_chars: int) -> tuple[list[dict], Stats]:
    chunks = (documents_module.TextChunks(text, max_chars) for text in texts)
    segments = (segment for text in chunks for segment in documents_module.segments(text, max_chars))
    student_info, teacher_info = (tokenizer_info(find_tokenizer_file(path)) for path in (STUDENT, teacher))
    stats = Stats()
    streams = aligned_streams(segments, student_info, teacher_info, stats)
    return list(pack_blocks(streams, MAX_SEQ_LENGTH + 1, 150, BlockDtypes.fitting(32000, 151665, 150), stats)), stats


@pytest.mark.parametrize("teacher", [TEACHER, MISTRAL])
def test_long_documents_in_segments_give_the_blocks_of_whole_documents(teacher):
    texts = long_documents()
    assert max(map(len, texts)) > 20 * 2000
    whole, whole_stats = pack(texts, teacher, 10**6)
    cut, cut_stats = pack(texts, teacher, 2000)
    assert cut_stats == whole_stats
    _assert_same_blocks({"train": cut}, {"train": whole})


def test_a_hard_cut_splits_only_the_tokens_next_to_it(tokenizers):
    # A 3,000-character URL has no line or word boundary: cut into segments of 1,000 characters, it gets hard cuts.
    text = long_documents()[0][:5000] + " https://example.org/" + "abc123-" * 430 + " and then\nmore text. " * 50
    segments = list(documents_module.segments(documents_module.TextChunks(text, 1000), 1000))
    starts = np.cumsum([0] + [len(s.text) for s in segments])[:-1]
    hard = [start for start, s in zip(starts, segments) if not s.first and not s.context]
    assert len(hard) >= 2
    for name, tokenizer in zip(("student", "teacher"), tokenizers):
        encoded = packing_module.encode_segments(tokenizer, segments)
        ids = np.concatenate([i for i, _ in encoded])
        offsets = np.concatenate([o + start for (_, o), start in zip(encoded, starts)])
        # Every character covered, in order, once (byte-fallback pieces of one character share its span).
        assert offsets[0, 0] == 0 and offsets[-1, 1] == len(text)
        assert ((offsets[1:, 0] == offsets[:-1, 1]) | (offsets[1:] == offsets[:-1]).all(axis=1)).all(), name
        whole_ids, whole_offsets = encode(tokenizer, text)
        tokens = set(zip(ids.tolist(), map(tuple, offsets.tolist())))
        whole = set(zip(whole_ids.tolist(), map(tuple, whole_offsets.tolist())))
        near = lambda span: any(span[0] - 16 < c < span[1] + 16 for c in hard)  # noqa: E731
        assert {t for t in whole if not near(t[1])} == {t for t in tokens if not near(t[1])}, name
        # A token across the context ("the" is one), which the cuts `segments` makes never have: tokenized alone.
        crossing = documents_module.Segment("he cat", "t", False, True)
        ((ids, offsets),) = packing_module.encode_segments(tokenizer, [crossing])
        np.testing.assert_array_equal(ids, encode(tokenizer, "he cat")[0])
        np.testing.assert_array_equal(offsets, encode(tokenizer, "he cat")[1])


def test_txt_files_are_read_a_bounded_chunk_at_a_time(tmp_path, monkeypatch):
    monkeypatch.setattr(documents_module, "SEGMENT_CHARS", 5)
    text = "é日😀 ab\r\n" * 7
    (tmp_path / "a.txt").write_bytes(text.encode())
    chunks = list(documents_module.TextFile(str(tmp_path / "a.txt")))
    assert "".join(chunks) == text and max(map(len, chunks)) <= 5
    piece = documents_module.file_pieces(tmp_path / "a.txt", 1 << 20)[0]
    (document,) = documents_module.read_documents(piece, ["text"], Stats())
    assert document.hash == int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
    assert (document.characters, document.bytes) == (len(text), len(text.encode()))
    bad = piece._replace(path=str(tmp_path / "b.txt"))
    cut_short = "abcdef日".encode()[:-1]
    for data, reason in ((b"abcdefg\xffh", "not UTF-8 (byte 7)"), (cut_short, "ends inside a character")):
        (tmp_path / "b.txt").write_bytes(data)
        stats = Stats()
        assert list(documents_module.read_documents(bad, ["text"], stats)) == []
        assert reason in stats.skipped_files[0][1]
    assert "(byte 6:" in stats.skipped_files[0][1]


def test_rerun_is_a_noop_and_other_settings_are_refused(prepared, corpus, capsys):
    stamps = {p: p.stat().st_mtime_ns for p in prepared.rglob("*")}
    prepare(**prepare_args(corpus[0], prepared))
    assert "nothing to do" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in prepared.rglob("*")} == stamps
    with pytest.raises(FileExistsError, match="max_seq_length: 64 there, 32 now"):
        prepare(**{**prepare_args(corpus[0], prepared), "max_seq_length": 32})
    assert {p: p.stat().st_mtime_ns for p in prepared.rglob("*")} == stamps


def test_an_input_file_edited_to_the_same_size_is_seen_and_named(tmp_path, capsys):
    records = gsm8k(8)
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    args = dict(
        student=STUDENT,
        teacher=TEACHER,
        input=path,
        output=tmp_path / "out",
        num_workers=1,
        text_key="question,answer",
        max_seq_length=MAX_SEQ_LENGTH,
    )
    prepare(**args)
    stamp = path.stat()
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 10**9))  # touched, not changed: still the same data
    prepare(**args)
    assert "nothing to do" in capsys.readouterr().out
    path.write_text(path.read_text().replace("Natalia", "Natasha", 1))  # same size, and the same time again
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert path.stat().st_size == stamp.st_size
    changed = rf"prepared with other settings \(--input: {path.resolve()} changed \(sha256\)\)"
    with pytest.raises(FileExistsError, match=changed):
        prepare(**args)

    # Data prepared before input files had content hashes still trains, and a rerun says why it starts over.
    manifest_path = tmp_path / "out" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["settings"]["input"] = [[str(path.resolve()), stamp.st_size]]
    manifest_path.write_text(json.dumps(manifest))
    assert sum(block["num_tokens"] for block in iter_blocks(tmp_path / "out", "train")) > 0
    VocAgnoData(tmp_path / "out").check_files()
    with pytest.raises(FileExistsError, match="recorded without its content hash"):
        prepare(**args)


def test_large_input_files_are_fingerprinted_by_samples_and_time(tmp_path, monkeypatch):
    monkeypatch.setattr(files_module, "WHOLE_HASH_BYTES", 1000)
    monkeypatch.setattr(files_module, "SAMPLE_BYTES", 10)
    path = tmp_path / "big.txt"
    path.write_bytes(bytes(range(256)) * 16)  # 4,096 bytes: 16 samples of 10 bytes, the first at 0, the last at 4,086
    record = files_module.file_fingerprint(path)
    assert set(record) == {"path", "bytes", "mtime_ns", "sampled_sha256"}
    samples = [path.read_bytes()[k * 4086 // 15 :][:10] for k in range(16)]
    assert record["sampled_sha256"] == hashlib.sha256(b"".join(samples)).hexdigest()
    stamp = path.stat()
    data = bytearray(path.read_bytes())
    data[4095] ^= 1  # the last byte, in the last sample
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert files_module.file_fingerprint(path)["sampled_sha256"] != record["sampled_sha256"]
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 1))
    assert files_module.file_fingerprint(path)["mtime_ns"] != record["mtime_ns"]


def _prepare_and_die_mid_train(kwargs):
    os.setpgrp()  # the run and its LitData workers in one group, killed together
    unit_blocks = prepare_module.unit_blocks

    def dying(unit, job):
        for k, block in enumerate(unit_blocks(unit, job)):
            if job.split == "train" and k == 3:
                os.killpg(0, signal.SIGKILL)
            yield block

    prepare_module.unit_blocks = dying  # the forked workers see it
    prepare(**kwargs)


def test_killed_run_is_finished_by_the_next(prepared, corpus, tmp_path):
    output = tmp_path / "out"
    kwargs = prepare_args(corpus[0], output)
    process = multiprocessing.get_context("fork").Process(target=_prepare_and_die_mid_train, args=(kwargs,))
    process.start()
    process.join(timeout=120)
    assert process.exitcode == -signal.SIGKILL
    assert not (output / "manifest.json").exists()
    assert (output / ".partial" / "val.json").exists() and not (output / ".partial" / "train.json").exists()

    prepare(**kwargs)
    assert sorted(p.name for p in output.iterdir()) == ["manifest.json", "train", "val"]
    _assert_same_blocks(all_blocks(output), all_blocks(prepared))


def _prepare_with_a_worker_killed(kwargs, log):
    os.setpgrp()  # the run and its LitData workers in one group, found by its id
    unit_blocks = prepare_module.unit_blocks

    def dying(unit, job):
        for k, block in enumerate(unit_blocks(unit, job)):
            if job.split == "train" and unit.index == 0 and k == 3:
                os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer ends a worker
            yield block

    prepare_module.unit_blocks = dying  # the forked workers see it
    try:
        prepare(**kwargs)
    except RuntimeError as error:
        Path(log).write_text(str(error))


def living_members(group: int) -> list[str]:
    """The processes of process group `group` that have not ended, each as "pid state command" (from /proc): a
    zombie has ended, though it holds its group until its parent, or init, reaps it."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            command, rest = stat.read_text().split(" (", 1)[1].rsplit(") ", 1)
        except (OSError, IndexError, ValueError):  # ended while read
            continue
        state, _, pgrp = rest.split()[:3]
        if int(pgrp) == group and state != "Z":
            members.append(f"{stat.parent.name} {state} {command}")
    return members


def test_a_dead_worker_stops_the_run_and_the_next_run_finishes(prepared, corpus, tmp_path):
    output, log = tmp_path / "out", tmp_path / "log"
    kwargs = prepare_args(corpus[0], output)
    process = multiprocessing.get_context("fork").Process(target=_prepare_with_a_worker_killed, args=(kwargs, log))
    process.start()
    process.join(timeout=300)  # LitData < 0.2.49 alone waits for the dead worker forever
    assert process.exitcode == 0, "prepare did not stop"
    assert re.fullmatch(r"LitData worker \d \(pid \d+\) was killed by SIGKILL \(out of memory\? .*", log.read_text())
    for _ in range(600):  # the other worker and the uploaders are stopped
        if not (alive := living_members(process.pid)):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"Workers of the stopped run are still alive: {alive}")

    prepare(**kwargs)
    _assert_same_blocks(all_blocks(output), all_blocks(prepared))


@pytest.mark.slow
def test_ctrl_c_exits_130_stops_the_workers_and_the_next_run_finishes(tmp_path, monkeypatch):
    """Ctrl-C to `vocagnolm prepare` once its one worker has written the first of the train split's two units: exit
    status 130, its workers stopped, the val split kept; the same command again (in this process) finishes."""
    monkeypatch.undo()  # the command's own units of 1 MB here too, as in its process (not `small_units`)
    output, log, corpus = tmp_path / "out", tmp_path / "log", tmp_path / "gsm8k.jsonl"
    records = (ROOT / "data/gsm8k/train.jsonl").read_text(encoding="utf-8").splitlines(True)[:3700]
    corpus.write_text("".join(records), encoding="utf-8")  # 2.0 MB: two work units of 1 MB each
    assert len(plan_units([corpus])) == 2
    command = [
        str(BIN / "vocagnolm"),
        "prepare",
        "--student",
        str(STUDENT),
        "--teacher",
        str(TEACHER),
        "--input",
        str(corpus),
        "--text_key",
        "question,answer",
        "--output",
        str(output),
        "--max_seq_length",
        "64",
        "--num_workers",
        "1",
    ]
    with open(log, "w") as f:  # a session of its own: whatever it leaves running is found by its group id
        process = subprocess.Popen(command, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    finished_units = output / ".partial" / "stats" / "train"
    deadline = time.monotonic() + 600
    while not any(finished_units.glob("unit-*.json")) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.poll() is None, log.read_text()[-3000:]  # its one worker has the second train unit to go
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=300) == 130, log.read_text()[-3000:]
    assert "Interrupted" in log.read_text() and "vocagnolm prepare: interrupted." in log.read_text()
    for _ in range(600):  # the LitData worker and its uploader stop with it
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        alive = subprocess.run(["ps", "-g", str(process.pid)], capture_output=True, text=True).stdout
        pytest.fail(f"Processes of the interrupted run are still alive:\n{alive}")
    assert not (output / "manifest.json").exists()
    assert (output / ".partial" / "val.json").is_file() and not (output / ".partial" / "train.json").exists()
    val_index = (output / ".partial" / "val" / "index.json").stat().st_mtime_ns

    resumed = typed_here(*command)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert "The val split was written before the interruption." in resumed.stdout
    assert (output / "val" / "index.json").stat().st_mtime_ns == val_index
    manifest = json.loads((output / "manifest.json").read_text())
    assert sum(manifest["splits"][split]["documents"] for split in SPLITS) == 3700  # every record of the corpus


def interrupted_while_publishing(kwargs: dict, monkeypatch) -> None:
    """`prepare(**kwargs)` stopped by Ctrl-C once both splits are written, before the manifest is."""

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(prepare_module, "build_manifest", interrupted)
        with pytest.raises(KeyboardInterrupt):
            prepare(**kwargs)


def test_run_interrupted_while_publishing_is_finished_by_the_next(prepared, corpus, tmp_path, monkeypatch):
    output = tmp_path / "out"
    kwargs = prepare_args(corpus[0], output)
    interrupted_while_publishing(kwargs, monkeypatch)
    assert sorted(p.name for p in output.iterdir()) == [".partial", "train", "val"]
    prepare(**kwargs)
    assert sorted(p.name for p in output.iterdir()) == ["manifest.json", "train", "val"]
    _assert_same_blocks(all_blocks(output), all_blocks(prepared))


def test_a_split_whose_shards_another_run_replaced_is_written_again(prepared, corpus, tmp_path, monkeypatch):
    """Two runs into one folder (before folders were locked) left a split recorded as finished whose index the other
    run had deleted; the next run died on the missing index.json. A split counts as finished only with the index it
    recorded."""
    output = tmp_path / "out"
    kwargs = prepare_args(corpus[0], output)
    interrupted_while_publishing(kwargs, monkeypatch)
    (output / "val" / "index.json").unlink()  # what the other run's start left of the published val split
    prepare(**kwargs)
    assert sorted(p.name for p in output.iterdir()) == ["manifest.json", "train", "val"]
    _assert_same_blocks(all_blocks(output), all_blocks(prepared))


def _assert_same_blocks(got, expected):
    for split in expected:
        assert len(got[split]) == len(expected[split])
        for a, b in zip(got[split], expected[split]):
            assert a.keys() == b.keys()
            assert all(np.array_equal(a[key], b[key]) for key in a)


def test_val_input_and_joined_fields(tmp_path):
    records = gsm8k(12)
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[:9]))
    (tmp_path / "val.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[9:]))
    output = tmp_path / "out"
    prepare(
        student=STUDENT,
        teacher=STUDENT,
        input=tmp_path / "train.jsonl",
        output=output,
        max_seq_length=32,
        num_workers=1,
        text_key="question, answer",
        val_input=tmp_path / "val.jsonl",
    )
    student = load_tokenizer(STUDENT)
    for split, expected in (("train", records[:9]), ("val", records[9:])):
        texts = [student.decode(ids[1:]) for ids, _ in documents_of(list(iter_blocks(output, split)))]
        assert texts == [f"{r['question']}\n\n{r['answer']}" for r in expected]
    module = VocAgnoData(output)
    assert module.same_vocabulary(STUDENT, STUDENT)
    # Identical tokenizers map every text token to itself.
    for block in iter_blocks(output, "train"):
        mapped = block["ranges"][:, 1] > block["ranges"][:, 0]
        assert (block["ranges"][mapped, 1] - block["ranges"][mapped, 0] == 1).all()
        assert np.array_equal(block["teacher_ids"][block["ranges"][mapped, 0]], block["student_ids"][mapped])


def test_llemma_extends_tinyllama_and_aligns_one_to_one(tinyllama_llemma_data, tmp_path):
    """Table 1's same-vocabulary teacher: Llemma's 32,016 tokens are TinyLlama's 32,000 with the same ids, then 16."""
    student, llemma = load_tokenizer(STUDENT), load_tokenizer(LLEMMA)
    assert [llemma.id_to_token(i) for i in range(32000)] == [student.id_to_token(i) for i in range(32000)]
    assert llemma.get_vocab_size(with_added_tokens=True) == 32016
    assert same_vocabulary(student, llemma) and same_vocabulary(student, student)
    assert not same_vocabulary(llemma, student)  # the other way round, 16 student tokens are missing
    assert not same_vocabulary(student, load_tokenizer(MISTRAL))  # 32,000 other tokens

    module = VocAgnoData(tinyllama_llemma_data)
    assert module.manifest["same_vocabulary"] is True and module.same_vocabulary(STUDENT, LLEMMA)
    # Both tokenize the math text alike, so a student token maps to the one teacher token with its id, the EOS to the
    # teacher's EOS (the same id); the BOS is unmapped. Tokens that share one character (the "▁" Metaspace puts before
    # a document's first digit, the byte pieces of a character) each map to that character's tokens, as the alignment
    # works on characters: here 2 of 42,305.
    one_to_one = text_tokens = 0
    for block in iter_blocks(tinyllama_llemma_data, "train"):
        ids, (starts, ends) = block["student_ids"][: block["num_tokens"]], block["ranges"][: block["num_tokens"]].T
        text = ids != BOS
        assert (ends[~text] == starts[~text]).all() and (ends[text] > starts[text]).all()
        assert all(i in block["teacher_ids"][a:e] for i, a, e in zip(ids[text], starts[text], ends[text]))
        single = text & (ends - starts == 1)
        assert np.array_equal(block["teacher_ids"][starts[single]], ids[single])
        one_to_one, text_tokens = one_to_one + single.sum(), text_tokens + text.sum()
    assert text_tokens - one_to_one <= 1e-4 * text_tokens
    # Only Code Llama's infill strings typed in a text tokenize otherwise: the student's pieces map to the one token.
    text = "x <PRE> y"
    (student_ids, student_offsets), (teacher_ids, teacher_offsets) = encode(student, text), encode(llemma, text)
    ranges = align(student_offsets, teacher_offsets)
    pieces = [i for i, t in enumerate(student_ids) if student.id_to_token(t) in ("▁<", "PRE", ">")]
    assert len(pieces) == 3 and {tuple(ranges[i]) for i in pieces} == {(1, 2)}
    assert llemma.id_to_token(teacher_ids[1]) == "▁<PRE>"

    # Data prepared before Llemma was accepted recorded False; training derives the relation from the tokenizers.
    old = tmp_path / "old"
    shutil.copytree(tinyllama_llemma_data, old)
    manifest = json.loads((old / "manifest.json").read_text())
    (old / "manifest.json").write_text(json.dumps({**manifest, "same_vocabulary": False}))
    assert VocAgnoData(old).same_vocabulary(STUDENT, LLEMMA)
    assert not VocAgnoData(old).same_vocabulary(STUDENT, None)  # no teacher tokenizer: the record stands


def test_bad_input_fails_before_work(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes.csv").write_text("a,b\n")
    args = dict(student=STUDENT, teacher=TEACHER, output=tmp_path / "out", num_workers=1)
    with pytest.raises(ValueError, match="no .txt, .jsonl, .parquet files"):
        prepare(input=[tmp_path / "docs"], **args)
    (tmp_path / "qa.jsonl").write_text('{"question": "1+1?", "answer": "2"}\n')
    with pytest.raises(ValueError, match=r"missing field 'text' \(its fields: question, answer\)"):
        prepare(input=[tmp_path / "qa.jsonl"], **args)
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(ValueError, match="every file is empty"):
        prepare(input=[tmp_path / "empty.txt"], **args)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        prepare(input=[tmp_path / "missing.jsonl"], **args)
    with pytest.raises(ValueError, match="not both"):
        prepare(input=[tmp_path / "qa.jsonl"], val_fraction=0.1, val_input=[tmp_path / "qa.jsonl"], **args)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "model.pth").write_bytes(b"weights")
    with pytest.raises(FileExistsError, match=r"holds no prepared data \(it has: model.pth\)"):
        prepare(input=[tmp_path / "qa.jsonl"], text_key="question,answer", **args)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["model.pth"]


def test_small_input_keeps_the_document_with_the_smallest_hash_for_validation(tmp_path):
    records = gsm8k(8)
    texts = [f"{r['question']}\n\n{r['answer']}" for r in records]
    hashes = {text: int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") for text in texts}
    assert min(hashes.values()) >= 0.01 * 2**64  # the hash rule alone leaves the val split empty
    (tmp_path / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    output = tmp_path / "out"
    prepare(
        student=STUDENT,
        teacher=TEACHER,
        input=tmp_path / "qa.jsonl",
        output=output,
        max_seq_length=MAX_SEQ_LENGTH,
        num_workers=2,
        text_key="question,answer",
    )
    student = load_tokenizer(STUDENT)
    got = {s: [student.decode(ids[1:]) for ids, _ in documents_of(list(iter_blocks(output, s)))] for s in SPLITS}
    smallest = min(texts, key=hashes.get)
    assert got["val"] == [smallest]
    assert Counter(got["train"]) == Counter(text for text in texts if text != smallest)


def test_too_few_or_unreadable_documents_say_why_and_a_rerun_starts_over(tmp_path):
    args = dict(student=STUDENT, teacher=TEACHER, output=tmp_path / "out", num_workers=1, text_key="question,answer")
    record = json.dumps(gsm8k(1)[0]) + "\n"
    (tmp_path / "one.jsonl").write_text(record)
    with pytest.raises(ValueError, match="holds 1 readable document: give two different documents"):
        prepare(input=tmp_path / "one.jsonl", **args)
    (tmp_path / "copies.jsonl").write_text(3 * record)
    with pytest.raises(ValueError, match="holds 3 readable documents, all the same text"):
        prepare(input=tmp_path / "copies.jsonl", **args)

    bad = tmp_path / "bad"
    bad.mkdir()
    for name in ("a.txt", "b.txt"):
        (bad / name).write_bytes("café au lait".encode("latin-1"))
    nulls = pa.table({"question": pa.array([None, None], pa.string()), "answer": ["2", "3"]})
    pq.write_table(nulls, bad / "c.parquet")
    one = tmp_path / "one.jsonl"
    for flag, flags in (("--input", {"input": bad}), ("--val_input", {"input": one, "val_input": bad})):
        with pytest.raises(ValueError) as error:
            prepare(**flags, **args)
        message = str(error.value)
        assert f"No document of {flag} could be read" in message
        for name in ("a.txt", "b.txt"):
            assert f"{bad / name}: not UTF-8 (byte 3)" in message
        assert "field 'question' is null: 2" in message

    (tmp_path / "two.jsonl").write_text("".join(json.dumps(r) + "\n" for r in gsm8k(2)))
    prepare(input=tmp_path / "two.jsonl", **args)  # not refused: the failed runs finished nothing worth keeping
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert [manifest["splits"][split]["documents"] for split in SPLITS] == [1, 1]


def test_tokenizer_mismatch_names_both(prepared):
    module = VocAgnoData(prepared)
    module.check_tokenizers(STUDENT, TEACHER)
    other = MISTRAL
    with pytest.raises(ValueError) as error:
        module.check_tokenizers(other, TEACHER)
    message = str(error.value)
    for path in (STUDENT / "tokenizer.json", other / "tokenizer.json"):
        assert str(path.resolve()) in message or str(path) in message
        assert file_sha256(path) in message
    assert not module.same_vocabulary(STUDENT, TEACHER)


def test_a_missing_or_cut_chunk_is_found_before_training(prepared, tmp_path):
    from litgpt.args import TrainArgs

    from litgpt_vocagnolm.loss.methods import GuidanceArgs
    from litgpt_vocagnolm.training.checks import check_setup
    from litgpt_vocagnolm.training.teacher import TeacherArgs

    copy = tmp_path / "copy"
    shutil.copytree(prepared, copy)
    chunk = sorted((copy / "train").glob("chunk-*.bin"))[-1]
    data = chunk.read_bytes()
    checks = {
        "check_files": VocAgnoData(copy).check_files,
        "iter_blocks": lambda: next(iter_blocks(copy, "train")),
        "the recipe, before any model": lambda: check_setup(
            tiny_config("student", 32000),
            VocAgnoData(copy),
            TrainArgs(max_tokens=1000, max_norm=1.0),
            TeacherArgs(),
            GuidanceArgs(method="ce"),
        ),
    }
    chunk.write_bytes(data[:-100])  # a copy cut short
    for name, check in checks.items():
        cut = rf"{chunk} has {len(data) - 100:,} bytes, .* records {len(data):,}.*prepare the data again"
        with pytest.raises(ValueError, match=cut):
            check()
    chunk.unlink()
    for name, check in checks.items():
        with pytest.raises(FileNotFoundError, match=rf"{chunk} is missing: .*index.json lists it"):
            check()


def point_index_elsewhere(data: Path, how: str, tmp_path: Path) -> str:
    """Edits the train split's index.json of prepared `data` as a crafted or careless copy would, the manifest's
    index_sha256 updated to match; returns what the refusal names."""
    index = data / "train" / "index.json"
    listing = json.loads(index.read_text())
    chunk = listing["chunks"][0]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    outside = shutil.copy(data / "train" / chunk["filename"], elsewhere / "x.bin")
    if how == "dotdot":
        chunk["filename"] = "../../elsewhere/x.bin"
    elif how == "absolute":
        chunk["filename"] = str(outside)
    elif how == "link":
        (data / "train" / chunk["filename"]).unlink()
        (data / "train" / chunk["filename"]).symlink_to(outside)
    else:  # a data_spec naming another callable than LitData's dict
        listing["config"]["data_spec"] = listing["config"]["data_spec"].replace("builtins.dict", "os.system")
    index.write_text(json.dumps(listing))
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["splits"]["train"]["index_sha256"] = file_sha256(index)
    (data / "manifest.json").write_text(json.dumps(manifest))
    return "not an index `vocagnolm prepare` writes" if how == "data_spec" else "which is not a file inside"


@pytest.mark.parametrize("how", ["dotdot", "absolute", "link", "data_spec"])
def test_a_split_is_read_only_inside_its_folder_and_only_as_prepared(prepared, tmp_path, how):
    from litgpt.args import TrainArgs

    from litgpt_vocagnolm.loss.methods import GuidanceArgs
    from litgpt_vocagnolm.training.checks import check_setup
    from litgpt_vocagnolm.training.teacher import TeacherArgs

    data = Path(shutil.copytree(prepared, tmp_path / "copy"))
    refusal = point_index_elsewhere(data, how, tmp_path)
    checks = {
        "check_files": VocAgnoData(data).check_files,
        "iter_blocks": lambda: next(iter_blocks(data, "train")),
        "the recipe, before any model": lambda: check_setup(
            tiny_config("student", 32000),
            VocAgnoData(data),
            TrainArgs(max_tokens=1000, max_norm=1.0),
            TeacherArgs(),
            GuidanceArgs(method="ce"),
        ),
    }
    for name, check in checks.items():
        with pytest.raises(InvalidArgument, match=rf"^{data / 'train' / 'index.json'} .*{refusal}") as error:
            check()
        assert "\n" not in str(error.value) and "prepare the data again" in str(error.value), name


def test_connect_refuses_another_sequence_length(prepared):
    module = VocAgnoData(prepared)
    with pytest.raises(ValueError, match="--max_seq_length 128"):
        module.connect(batch_size=2, max_seq_length=128)


@pytest.mark.parametrize("chunks", [None, 4])
def test_batches_have_the_documented_shapes(prepared, chunks):
    module = VocAgnoData(prepared, num_workers=0)
    module.connect(batch_size=3, max_seq_length=MAX_SEQ_LENGTH, num_chunks=chunks)
    blocks = list(iter_blocks(prepared, "val"))
    batches = list(module.val_dataloader())  # not shuffled: in stored order
    assert sum(len(batch.input_ids) for batch in batches) == len(blocks)
    for k, batch in enumerate(batches):
        rows = blocks[3 * k : 3 * k + 3]
        B, T, M = len(rows), MAX_SEQ_LENGTH, padded_window(module.manifest)  # one window length per run
        (side,) = batch.teachers  # one teacher
        shapes = {
            name: (tuple(value.shape), value.dtype) for name, value in zip(side._fields, side) if value is not None
        }
        assert shapes == {"ids": ((B, M), torch.long), "valid": ((B, M), torch.bool), "ranges": ((B, T, 2), torch.long)}
        student = {
            name: (tuple(getattr(batch, name).shape), getattr(batch, name).dtype)
            for name in ("input_ids", "targets", "num_bytes")
        }
        assert student == {
            "input_ids": ((B, T), torch.long),
            "targets": ((B, T), torch.long),
            "num_bytes": ((B,), torch.long),
        }
        assert side.loss is None  # no loss cache connected
        for row, block in enumerate(rows):
            n, m = block["num_tokens"], len(block["teacher_ids"])
            ids = torch.from_numpy(block["student_ids"])
            assert torch.equal(batch.input_ids[row], ids[:-1])
            assert torch.equal(batch.targets[row, : n - 1], ids[1:n])
            assert (batch.targets[row, n - 1 :] == -100).all()
            assert side.valid[row].tolist() == [True] * m + [False] * (M - m)
            assert torch.equal(side.ids[row, :m], torch.from_numpy(block["teacher_ids"]))
            ranges = block["ranges"] if chunks is None else np.pad(chunk_align(n, m, chunks), ((0, T + 1 - n), (0, 0)))
            assert torch.equal(side.ranges[row], torch.from_numpy(ranges[1:]))
            assert batch.num_bytes[row] == block["num_bytes"]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_resumes_at_the_next_sample(prepared, num_workers):
    def loader():
        module = VocAgnoData(prepared, num_workers=num_workers, seed=7)
        module.connect(batch_size=2, max_seq_length=MAX_SEQ_LENGTH)
        return module.train_dataloader()

    epoch = list(loader())
    assert len(epoch) > 6
    first = loader()
    iterator = iter(first)
    for _ in range(5):
        next(iterator)
    state = first.state_dict()
    resumed = loader()
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(rest) == len(epoch) - 5

    def tensors(batch):
        return [batch.input_ids, batch.targets, batch.num_bytes, *batch.teachers[0][:3]]

    for got, expected in zip(rest, epoch[5:]):
        assert all(torch.equal(a, b) for a, b in zip(tensors(got), tensors(expected), strict=True))


def test_data_of_another_format_fails_naming_both_versions_and_the_fix(prepared, tmp_path):
    from litgpt_vocagnolm.data.manifest import FORMAT, MANIFEST, load_manifest

    copy = tmp_path / "old"
    copy.mkdir()
    manifest = json.loads((prepared / MANIFEST).read_text(encoding="utf-8"))
    # Format 1 left the EOS unmapped and counted the BOS in mapped_share.
    (copy / MANIFEST).write_text(json.dumps({**manifest, "format": "vocagnolm-blocks/1"}), encoding="utf-8")
    with pytest.raises(ValueError) as error:
        load_manifest(copy)
    message = str(error.value)
    assert "'vocagnolm-blocks/1'" in message and repr(FORMAT) in message and "`vocagnolm prepare`" in message
    assert "\n" not in message
    with pytest.raises(ValueError, match="vocagnolm-blocks/1"):
        VocAgnoData(copy).check_files()  # training reads it through the same check
