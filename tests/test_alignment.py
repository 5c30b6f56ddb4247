import gzip
import itertools
import json
import shutil
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from litgpt_vocagnolm.alignment import lexical as alignment
from litgpt_vocagnolm.alignment.lexical import (
    align,
    align_batch,
    align_text,
    chunk_align,
    encode,
    encode_batch,
    ios_iou,
    token_ios_iou,
    vocab_overlap,
)
from litgpt_vocagnolm.alignment.tokenizer_files import find_tokenizer_file, load_tokenizer

ROOT = Path(__file__).resolve().parent.parent
TOKENIZERS = ROOT / "tests/fixtures/tokenizers"
NAMES = ["tinyllama-1.1b", "qwen2.5", "mistral-7b-v0.1", "llemma-7b"]
PAIRS = list(itertools.permutations(NAMES, 2))

# What tokenizers disagree on: multi-byte characters split into byte tokens, grapheme clusters, combining marks that
# NFC folds away, spaces that SentencePiece marks with "▁", and text that holds a tokenizer's own added tokens.
TRICKY = [
    "",
    " ",
    "Hello world",
    "  two  leading, trailing spaces   ",
    "a😀b 👨‍👩‍👧‍👦 family, 🏳️‍🌈 flag",
    "日本語のテキスト、中文文本。한국어",
    "e\u0301 and \u00e9, a\u030a\u0301 Å",
    "non\u00a0breaking\u200bzero\u200dwidth\ufeff",
    "tab\tcrlf\r\nnewline\n\n\nend",
    "12345678901234567890 * 3.14159265358979 = ?",
    "$\\frac{a}{b} \\leq \\sqrt{x^2}$ and ∑_{k=1}^n k",
    "literal </s> and <s> and <|endoftext|> and <|im_start|>",
    "a ▁ metaspace ▁▁ marker",
    "<0x41> looks like a byte token",
]


def documents() -> list[str]:
    """Real math text: GSM8K questions with answers, Stack Exchange questions with answers (cut to keep tests fast)."""
    with open(ROOT / "data/gsm8k/train.jsonl", encoding="utf-8") as f:
        gsm8k = [json.loads(line) for line in itertools.islice(f, 3)]
    with open(ROOT / "data/stackexchange/math_stackexchange_33votes.jsonl", encoding="utf-8") as f:
        stackexchange = [json.loads(line) for line in itertools.islice(f, 3)]
    return [f"{row['question']}\n{row['answer']}" for row in gsm8k] + [
        f"{row['input']}\n{row['output']}"[:1500] for row in stackexchange
    ]


@pytest.fixture(scope="module")
def tokenizers():
    # Loaded once per module: Qwen's JSON is 7 MB decompressed.
    return {name: load_tokenizer(TOKENIZERS / name) for name in NAMES}


def reference_offsets(tokenizer, text: str) -> np.ndarray:
    return np.array(tokenizer.encode(text, add_special_tokens=False).offsets, dtype=np.int64).reshape(-1, 2)


def overlapping(student: np.ndarray, teacher: np.ndarray) -> list[list[int]]:
    """Brute force: for each student span, every teacher token whose non-empty span overlaps it."""
    result = []
    for s, e in student.tolist():
        result.append([j for j, (a, b) in enumerate(teacher.tolist()) if s < e and a < b and a < e and s < b])
    return result


def assert_matches_brute_force(student: np.ndarray, teacher: np.ndarray, ranges: np.ndarray) -> None:
    for i, tokens in enumerate(overlapping(student, teacher)):
        a, b = ranges[i].tolist()
        if tokens:
            assert tokens == list(range(a, b)), (i, student[i], tokens, ranges[i])
        else:
            assert (a, b) == (0, 0), (i, student[i], ranges[i])


def covered(offsets: np.ndarray, length: int) -> np.ndarray:
    """(length,) bool: characters inside some span."""
    mask = np.zeros(length, dtype=bool)
    for s, e in offsets.tolist():
        mask[s:e] = True
    return mask


# ---- loading -------------------------------------------------------------------------------------------------------


def test_load_tokenizer_accepts_files_gz_and_dirs(tmp_path, tokenizers):
    source = TOKENIZERS / "tinyllama-1.1b/tokenizer.json"
    checkpoint = tmp_path / "checkpoints/TinyLlama"  # a LitGPT checkpoint dir: weights, config, tokenizer files
    checkpoint.mkdir(parents=True)
    for name in ("model_config.yaml", "lit_model.pth", "tokenizer_config.json"):
        (checkpoint / name).write_text("{}")
    shutil.copy(source, checkpoint / "tokenizer.json")
    gz_dir = tmp_path / "gz"
    gz_dir.mkdir()
    (gz_dir / "tokenizer.json.gz").write_bytes(gzip.compress(source.read_bytes()))

    text = "Natalia sold 48/2 = 24 clips."
    expected = tokenizers["tinyllama-1.1b"].encode(text).ids
    for path in (source, str(source), checkpoint, gz_dir, gz_dir / "tokenizer.json.gz"):
        assert load_tokenizer(path).encode(text).ids == expected
    assert find_tokenizer_file(checkpoint) == checkpoint / "tokenizer.json"
    assert find_tokenizer_file(gz_dir) == gz_dir / "tokenizer.json.gz"
    assert find_tokenizer_file(TOKENIZERS / "qwen2.5") == TOKENIZERS / "qwen2.5/tokenizer.json.gz"


def test_load_tokenizer_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tokenizer(tmp_path / "missing")

    (tmp_path / "tokenizer.model").write_bytes(b"\x0a\x05spm")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"it holds: config.json, tokenizer.model\).*SentencePiece"):
        load_tokenizer(tmp_path)

    for name, content in [("config.json", b'{"vocab_size": 32000}'), ("tokenizer.model", b"\x0a\x05\xff\xfe")]:
        with pytest.raises(ValueError, match=f"{name}' is not a fast-tokenizer JSON file"):
            load_tokenizer(tmp_path / name)


def test_vocab_overlap_reproduces_figure_1(tokenizers):
    # The paper's Figure 1: TinyLlama shares 6.32% of Qwen2.5's vocabulary.
    overlap = vocab_overlap(tokenizers["tinyllama-1.1b"], tokenizers["qwen2.5"])
    assert overlap == 9587 / 151665
    assert round(100 * overlap, 2) == 6.32
    # Llemma is Llama 2's vocabulary plus 16 added tokens.
    assert vocab_overlap(tokenizers["tinyllama-1.1b"], tokenizers["llemma-7b"]) == 32000 / 32016
    assert vocab_overlap(tokenizers["qwen2.5"], tokenizers["qwen2.5"]) == 1.0


# ---- encode: offsets derived from ids ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_encode_equals_tokenizer_offsets(tokenizers, name):
    tokenizer = tokenizers[name]
    texts = TRICKY + documents()
    for text in texts:
        ids, offsets = encode(tokenizer, text)
        assert ids.dtype == np.int32 and offsets.dtype == np.int64 and offsets.shape == (len(ids), 2)
        assert ids.tolist() == tokenizer.encode(text, add_special_tokens=False).ids
        np.testing.assert_array_equal(offsets, reference_offsets(tokenizer, text), err_msg=repr(text))
    assert [i.tolist() for i, _ in encode_batch(tokenizer, texts)] == [encode(tokenizer, t)[0].tolist() for t in texts]
    for (_, batch_offsets), text in zip(encode_batch(tokenizer, texts), texts):
        np.testing.assert_array_equal(batch_offsets, reference_offsets(tokenizer, text))


@pytest.mark.parametrize(
    ("name", "text"),
    [
        # NFC folds "e" + combining acute into one character: the text changes, so the table does not hold.
        ("qwen2.5", "cafe\u0301"),
        # A literal "▁" is three bytes, not the one space it stands for in a piece.
        ("llemma-7b", "a ▁ b"),
    ],
)
def test_encode_falls_back_where_the_text_changes(tokenizers, name, text):
    tokenizer = tokenizers[name]
    table = alignment._offset_table(tokenizer, tokenizer.get_vocab_size(with_added_tokens=True))
    ids, offsets = encode(tokenizer, text)
    assert alignment._derived_offsets(table, ids, text) is None
    np.testing.assert_array_equal(offsets, reference_offsets(tokenizer, text))


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("qwen2.5", "a <|endoftext|> b"),
        ("qwen2.5", "a <tool_call> b"),  # an added token not marked special
        ("tinyllama-1.1b", "a </s> b <s>"),
        ("mistral-7b-v0.1", "a <s> b"),
    ],
)
def test_special_tokens_written_in_the_text_are_encoded_as_text(tokenizers, name, text):
    tokenizer = tokenizers[name]
    specials = {t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special}
    ids, offsets = encode(tokenizer, text)
    assert not {tokenizer.id_to_token(int(i)) for i in ids} & specials
    np.testing.assert_array_equal(offsets, reference_offsets(tokenizer, text))
    assert tokenizer.decode(ids.tolist()) == text


def test_encode_derives_offsets_from_ids_on_real_text(tokenizers):
    # The fast path is taken (not only correct when taken) for every fixture tokenizer on real math text.
    for name, tokenizer in tokenizers.items():
        table = alignment._offset_table(tokenizer, tokenizer.get_vocab_size(with_added_tokens=True))
        assert table is not None, name
        for text in documents() + ["日本語 😀 e\u0301" if name != "qwen2.5" else "日本語 😀 é"]:
            ids, offsets = encode(tokenizer, text)
            np.testing.assert_array_equal(alignment._derived_offsets(table, ids, text), offsets)


def test_encoding_many_texts_never_builds_the_vocabulary(tokenizers):
    """`get_vocab_size(with_added_tokens=True)` builds the whole vocabulary (0.4 s for Qwen2.5's): once per text it
    made `prepare` take minutes per MB of short documents."""

    class Counting:
        def __init__(self, tokenizer):
            self.tokenizer, self.built, self.tables = tokenizer, 0, 0

        def get_vocab_size(self, with_added_tokens=True):
            self.built += with_added_tokens
            return self.tokenizer.get_vocab_size(with_added_tokens=with_added_tokens)

        def get_vocab(self, with_added_tokens=True):  # builds the whole vocabulary too: for the offset table only
            self.tables += 1
            return self.tokenizer.get_vocab(with_added_tokens=with_added_tokens)

        def __getattr__(self, name):
            return getattr(self.tokenizer, name)

    for name, tokenizer in tokenizers.items():
        counting = Counting(tokenizer)
        assert alignment.vocab_size(counting) == tokenizer.get_vocab_size(with_added_tokens=True)
        texts = documents()[:20]
        for (ids, offsets), text in zip(encode_batch(counting, texts), texts):
            np.testing.assert_array_equal(offsets, reference_offsets(tokenizer, text))
        assert counting.built == 0 and counting.tables <= 1, name  # the table once (cached), not once per text


def test_encode_without_fast_path_uses_tokenizer_offsets():
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    # A model and normalizer the table does not cover: lowercasing "İ" gives two characters, "i̇".
    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0, "i̇": 1, "ab": 2}, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    assert alignment._offset_table(tokenizer, tokenizer.get_vocab_size()) is None
    ids, offsets = encode(tokenizer, "İ AB x")
    assert ids.tolist() == [1, 2, 0]
    np.testing.assert_array_equal(offsets, [[0, 1], [2, 4], [5, 6]])


# ---- align ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("student", "teacher"), PAIRS)
def test_align_matches_brute_force_on_real_tokenizers(tokenizers, student, teacher):
    for text in TRICKY + documents():
        result = align_text(tokenizers[student], tokenizers[teacher], text)
        assert result.ranges.shape == (len(result.student_ids), 2)
        assert_matches_brute_force(result.student_offsets, result.teacher_offsets, result.ranges)
        if unicodedata.is_normalized("NFC", text):
            # Every character is in some token on both sides: every non-empty student token is fully covered.
            ios, _ = token_ios_iou(result.student_offsets, result.teacher_offsets, result.ranges)
            nonempty = result.student_offsets[:, 0] < result.student_offsets[:, 1]
            assert (ios[nonempty] == 1).all(), text


def test_align_hand_computed():
    # text "abcdef": student "ab|cd|ef", teacher "abc|def"; then an empty student span (a special token).
    student = np.array([[0, 2], [2, 4], [4, 6], [6, 6]])
    teacher = np.array([[0, 3], [3, 6]])
    np.testing.assert_array_equal(align(student, teacher), [[0, 1], [0, 2], [1, 2], [0, 0]])
    # Overlapping spans, as byte tokens of one multi-byte character give them: all of them are mapped.
    np.testing.assert_array_equal(align([[0, 1], [1, 2]], [[0, 1], [0, 1], [0, 1], [1, 2]]), [[0, 3], [3, 4]])
    # A character the teacher dropped (no teacher span covers [1, 2)) leaves that student token unmapped.
    np.testing.assert_array_equal(align([[0, 1], [1, 2], [2, 3]], [[0, 1], [2, 3]]), [[0, 1], [0, 0], [1, 2]])
    assert align(np.zeros((0, 2), dtype=np.int64), teacher).shape == (0, 2)
    np.testing.assert_array_equal(align(student, np.zeros((0, 2), dtype=np.int64)), np.zeros((4, 2)))


def test_special_tokens_are_unmapped(tokenizers):
    text = documents()[0]
    result = align_text(tokenizers["tinyllama-1.1b"], tokenizers["qwen2.5"], text)
    assert (result.ranges[:, 0] < result.ranges[:, 1]).all()
    # BOS and EOS as the data pipeline adds them: empty spans at either end of the text.
    bos, eos = [[0, 0]], [[len(text), len(text)]]
    student = np.concatenate([bos, result.student_offsets, eos])
    teacher = np.concatenate([bos, result.teacher_offsets, [[0, 0]]])  # an EOS at (0, 0) is accepted as well
    ranges = align(student, teacher)
    np.testing.assert_array_equal(ranges[[0, -1]], [[0, 0], [0, 0]])
    np.testing.assert_array_equal(ranges[1:-1], result.ranges + 1)
    assert_matches_brute_force(student, teacher, ranges)


@pytest.mark.parametrize(
    ("student", "teacher", "error"),
    [
        ([[0, 1, 2]], [[0, 1]], r"student_offsets must have shape \(N, 2\).*\(1, 3\)"),
        ([0, 1], [[0, 1]], r"student_offsets must have shape \(N, 2\).*\(2,\)"),
        ([[0, 1]], [[0.0, 1.0]], "teacher_offsets must hold integer character offsets; got dtype float64"),
        ([[0, 2], [3, 1]], [[0, 3]], r"student_offsets\[1\] = \[3, 1\] is not a span"),
        ([[0, 1]], [[-1, 1]], r"teacher_offsets\[0\] = \[-1, 1\] is not a span"),
        ([[0, 2], [2, 4], [0, 2]], [[0, 4]], r"student_offsets go backwards: token 2 spans \[0, 2\] after token 1"),
        ([[0, 4]], [[0, 5], [0, 0], [1, 3]], r"teacher_offsets go backwards: token 2 spans \[1, 3\] after token 0"),
        ([[0, 4]], [[0, 2], [2, 2], [2, 4]], r"empty spans lie inside teacher range \[0, 3\) of student token 0"),
    ],
)
def test_align_rejects_bad_offsets(student, teacher, error):
    with pytest.raises(ValueError, match=error):
        align(np.array(student), np.array(teacher))


def test_align_batch_equals_align(tokenizers):
    texts = documents() + ["", "😀", "x"]
    student = [offsets for _, offsets in encode_batch(tokenizers["tinyllama-1.1b"], texts)]
    teacher = [offsets for _, offsets in encode_batch(tokenizers["qwen2.5"], texts)]
    student[0] = np.concatenate([[[0, 0]], student[0]])  # a BOS
    teacher[1] = np.concatenate([teacher[1], [[len(texts[1])] * 2]])  # an EOS
    teacher[-1] = np.zeros((0, 2), dtype=np.int64)  # a document the teacher has no tokens for
    batch = align_batch(student, teacher)
    assert len(batch) == len(texts)
    for s, t, ranges in zip(student, teacher, batch):
        np.testing.assert_array_equal(ranges, align(s, t))
    assert align_batch([], []) == []
    with pytest.raises(ValueError, match="2 student and 1 teacher offset arrays"):
        align_batch(student[:2], teacher[:1])
    with pytest.raises(ValueError, match=r"Document 1: student_offsets go backwards"):
        align_batch([student[0], student[1][::-1]], teacher[:2])
    with pytest.raises(ValueError, match=r"Document 1: teacher_offsets\[0\] = \[-3, 1\] is not a span"):
        align_batch(student[:2], [teacher[0], np.array([[-3, 1]])])


# ---- property tests over arbitrary Unicode -------------------------------------------------------------------------

FRAGMENTS = [
    "👨‍👩‍👧‍👦",
    "🏳️‍🌈",
    "😀",
    "日本語",
    "中文",
    "한국어",
    "e\u0301",
    "a\u0308\u0301",
    "\u00a0",
    "\u200b",
    "\u200d",
    "\ufeff",
    "\t",
    "\r\n",
    "\n",
    " ",
    "    ",
    "1234567890123456789",
    "3.14",
    "$x^2$",
    "▁",
    "</s>",
    "<|endoftext|>",
    "İ",
    "ﬁ",
    "q\u0307\u0323",
    "\u1100\u1161\u11a8",
    "\u212b",
    "\u0f73",  # NFC reorders, composes Hangul, maps, expands
]
texts = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=8)), max_size=10).map("".join)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=texts)
def test_alignment_properties(tokenizers, text):
    encoded = {}
    for name, tokenizer in tokenizers.items():
        ids, offsets = encode(tokenizer, text)
        np.testing.assert_array_equal(offsets, reference_offsets(tokenizer, text))
        encoded[name] = offsets
    for student_name, teacher_name in PAIRS:
        student, teacher = encoded[student_name], encoded[teacher_name]
        ranges = align(student, teacher)
        a, b = ranges[:, 0], ranges[:, 1]
        assert ((0 <= a) & (a <= b) & (b <= len(teacher))).all()
        assert_matches_brute_force(student, teacher, ranges)
        mapped = a < b
        assert (np.diff(a[mapped]) >= 0).all() and (np.diff(b[mapped]) >= 0).all()
        teacher_chars = covered(teacher, len(text))
        ios, _ = token_ios_iou(student, teacher, ranges)
        for i, (s, e) in enumerate(student.tolist()):
            if s == e:
                assert not mapped[i] and np.isnan(ios[i])
            elif teacher_chars[s:e].all():
                assert mapped[i] and ios[i] == 1, (student_name, teacher_name, i)
            elif not teacher_chars[s:e].any():
                # Only where a teacher's normalizer dropped these characters (NFC folding a combining mark).
                assert not mapped[i] and ios[i] == 0
                assert teacher_name == "qwen2.5" and not unicodedata.is_normalized("NFC", text)


# ---- chunk alignment and metrics -----------------------------------------------------------------------------------


def test_chunk_align_hand_computed():
    # 5 student tokens -> chunks [0, 2), [2, 5); 3 teacher tokens -> [0, 1), [1, 3).
    np.testing.assert_array_equal(chunk_align(5, 3, 2), [[0, 1], [0, 1], [1, 3], [1, 3], [1, 3]])
    # More chunks than teacher tokens: chunk 1 of the teacher is empty, so student token 0 (chunk 1) is unmapped.
    np.testing.assert_array_equal(chunk_align(2, 1, 3), [[0, 0], [0, 1]])
    np.testing.assert_array_equal(chunk_align(4, 6, 1), [[0, 6]] * 4)
    assert chunk_align(0, 5, 3).shape == (0, 2)
    # Chunk sizes differ by at most one and the chunks cover both sequences in order.
    ranges = chunk_align(1000, 777, 7)
    starts, counts = np.unique(ranges[:, 0], return_counts=True)
    assert len(starts) == 7 and counts.max() - counts.min() <= 1
    assert ranges[0, 0] == 0 and ranges[-1, 1] == 777 and (ranges[1:, 0] >= ranges[:-1, 0]).all()
    with pytest.raises(ValueError, match="num_chunks must be at least 1"):
        chunk_align(3, 3, 0)


def test_ios_iou_hand_computed():
    # text "abcdef": student "abcd|ef" + a special token; teacher "ab|cde|f".
    student = np.array([[0, 4], [4, 6], [6, 6]])
    teacher = np.array([[0, 2], [2, 5], [5, 6]])
    ranges = align(student, teacher)
    np.testing.assert_array_equal(ranges, [[0, 2], [1, 3], [0, 0]])
    # "abcd" in "abcde": IoS 1, IoU 4/5; "ef" in "cdef": IoS 1, IoU 2/4.
    ios, iou = token_ios_iou(student, teacher, ranges)
    np.testing.assert_allclose(ios[:2], [1, 1])
    np.testing.assert_allclose(iou[:2], [0.8, 0.5])
    assert np.isnan(ios[2]) and np.isnan(iou[2])
    assert ios_iou(student, teacher, ranges) == pytest.approx((1.0, 0.65))
    # Coarser ranges: "abcd" -> "ab" (IoS 2/4, IoU 2/4); "ef" -> "f" (1/2, 1/2).
    assert ios_iou(student, teacher, [[0, 1], [2, 3], [0, 0]]) == pytest.approx((0.5, 0.5))
    # Unmapped counts as 0; "ef" -> "cde": overlap "e", IoS 1/2, IoU 1/4.
    assert ios_iou(student, teacher, [[0, 0], [1, 2], [0, 0]]) == pytest.approx((0.25, 0.125))
    # A special teacher token inside a (chunk) range does not stretch the mapped span: BOS + "ab" is "ab".
    teacher_with_bos = np.array([[0, 0], [0, 2], [2, 5], [5, 6]])
    assert ios_iou(student, teacher_with_bos, [[0, 2], [2, 4], [0, 0]]) == pytest.approx((0.75, 0.5))
    assert np.isnan(ios_iou(np.zeros((0, 2), dtype=int), teacher, np.zeros((0, 2), dtype=int))[0])
    with pytest.raises(ValueError, match=r"ranges must have shape \(3, 2\)"):
        token_ios_iou(student, teacher, ranges[:2])
    with pytest.raises(ValueError, match="0 <= a <= b <= 3"):
        token_ios_iou(student, teacher, [[0, 4], [0, 1], [0, 0]])


def test_dropped_characters_lower_ios_instead_of_failing(tokenizers):
    # Qwen's NFC folds the combining acute into "é" and reports no span for it: that TinyLlama token is unmapped.
    result = align_text(tokenizers["tinyllama-1.1b"], tokenizers["qwen2.5"], "e\u0301x")
    np.testing.assert_array_equal(result.student_offsets, [[0, 1], [1, 2], [2, 3]])
    np.testing.assert_array_equal(result.teacher_offsets, [[0, 1], [2, 3]])
    np.testing.assert_array_equal(result.ranges, [[0, 1], [0, 0], [1, 2]])
    assert ios_iou(result.student_offsets, result.teacher_offsets, result.ranges) == pytest.approx((2 / 3, 2 / 3))


def test_align_text_accepts_paths(tokenizers):
    text = "If $x = 3$, then $x^2 = 9$."
    by_path = align_text(TOKENIZERS / "tinyllama-1.1b", str(TOKENIZERS / "mistral-7b-v0.1/tokenizer.json"), text)
    by_tokenizer = align_text(tokenizers["tinyllama-1.1b"], tokenizers["mistral-7b-v0.1"], text)
    for a, b in zip(by_path, by_tokenizer):
        np.testing.assert_array_equal(a, b)
