import json
import re
from pathlib import Path

import numpy as np
import pytest
from jsonargparse import CLI

from litgpt_vocagnolm.alignment.inspection import (
    KINDS,
    SAMPLE,
    alignment_rows,
    group_kinds,
    inspect,
    mapping_groups,
    pair_report,
)
from litgpt_vocagnolm.alignment.lexical import align, chunk_span_ios_iou, encode
from litgpt_vocagnolm.alignment.tokenizer_files import load_tokenizer
from litgpt_vocagnolm.errors import UserError

TOKENIZERS = Path(__file__).resolve().parent / "fixtures/tokenizers"
TINYLLAMA, QWEN, MISTRAL = TOKENIZERS / "tinyllama-1.1b", TOKENIZERS / "qwen2.5", TOKENIZERS / "mistral-7b-v0.1"
MATH_STACKEXCHANGE = Path(__file__).resolve().parents[1] / "data/stackexchange/math_stackexchange_33votes.jsonl"


def math_text(documents: int) -> str:
    """The first `documents` questions of the math StackExchange sample shipped in data/, one text."""
    with open(MATH_STACKEXCHANGE, encoding="utf-8") as f:
        return "\n\n".join(json.loads(next(f))["input"] for _ in range(documents))


@pytest.fixture(scope="module")
def tokenizers():
    # Loaded once per module: Qwen's JSON is 7 MB decompressed.
    return load_tokenizer(TINYLLAMA), load_tokenizer(QWEN)


def reference_groups(ranges: np.ndarray) -> list[list[int]]:
    """Union-find over the (student, teacher) pairs that share characters: each component's token index bounds."""
    parent = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    for i, (a, b) in enumerate(ranges.tolist()):
        for j in range(a, b):
            parent[find(("s", i))] = find(("t", j))
    components = {}
    for node in parent:
        components.setdefault(find(node), []).append(node)
    groups = []
    for nodes in components.values():
        students = [i for side, i in nodes if side == "s"]
        teachers = [j for side, j in nodes if side == "t"]
        groups.append([min(students), max(students) + 1, min(teachers), max(teachers) + 1])
    return sorted(groups)


def test_mapping_groups_hand_computed():
    # Student 0 <-> teacher 0 (1:1); student 1 <-> teachers 1, 2 (1:many); students 2, 3 <-> teacher 3 (many:1);
    # student 4 unmapped (a special token); students 5, 6 <-> teachers 4, 5, 6 with teacher 5 shared (many:many).
    ranges = np.array([[0, 1], [1, 3], [3, 4], [3, 4], [0, 0], [4, 6], [5, 7]])
    groups = mapping_groups(ranges)
    np.testing.assert_array_equal(groups, [[0, 1, 0, 1], [1, 2, 1, 3], [2, 4, 3, 4], [5, 7, 4, 7]])
    assert [KINDS[k] for k in group_kinds(groups)] == ["1:1", "1:many", "many:1", "many:many"]
    assert mapping_groups(np.zeros((3, 2), dtype=np.int64)).shape == (0, 4)


def test_pair_report_on_real_tokenizers(tokenizers):
    student, teacher = tokenizers
    report = pair_report(student, teacher, SAMPLE, chunks=[1, 8])
    assert (report["student_vocab"], report["teacher_vocab"], report["shared_vocab"]) == (32000, 151665, 9587)
    n_student = len(report["student_ids"])
    assert n_student == len(student.encode(SAMPLE, add_special_tokens=False).ids)
    # Groups are the connected components of tokens that share characters.
    assert report["groups"].tolist() == reference_groups(report["ranges"])
    assert report["group_counts"].sum() == len(report["groups"])
    assert report["group_student_tokens"].sum() == n_student  # every student token of this text is mapped
    spans = report["ranges"][:, 1] - report["ranges"][:, 0]
    assert report["span_histogram"].tolist() == [int(np.sum(np.minimum(spans, 5) == k)) for k in range(6)]
    assert report["student_unmapped"] == report["teacher_unmapped"] == report["student_special"] == 0
    assert report["student_covered"] == report["teacher_covered"] == len(SAMPLE)
    # Token-level alignment covers every student span; one chunk does too but with a far lower IoU.
    assert report["token_level"][0] == 1.0
    # Per student token, one chunk maps every student token to the whole teacher text: full IoS, a tiny IoU.
    assert report["chunks"][1]["per_token"][0] == 1.0
    assert report["chunks"][1]["per_token"][1] < report["token_level"][1] / 10
    assert report["chunks"][8]["per_token"][0] < 1.0
    # As chunk spans, one chunk is the whole text on both sides.
    assert report["chunks"][1]["chunk_span"] == (1.0, 1.0) and report["chunks"][8]["chunk_span"][1] < 1.0


def test_pair_report_gives_folded_characters_to_the_token_that_holds_them(tokenizers):
    student, teacher = tokenizers
    # Qwen's NFC folds the combining acute into "é", whose span takes it back: both TinyLlama tokens map to "é".
    report = pair_report(student, teacher, "e\u0301x", chunks=[1])
    assert report["student_unmapped"] == 0 and report["teacher_covered"] == 3 and report["student_covered"] == 3
    assert report["token_level"] == pytest.approx((1, 2 / 3))
    rows = alignment_rows(report, 10)
    assert [(start, stop, s, t, kind) for start, stop, s, t, kind in rows] == [
        (0, 2, [0, 1], [0], "many:1"),
        (2, 3, [2], [1], "1:1"),
    ]


def test_alignment_rows_show_every_token_once(tokenizers):
    student, teacher = tokenizers
    text = SAMPLE + " ᄀ\u1161\u11a8 e\u0301"  # characters Qwen's NFC folds
    report = pair_report(teacher, student, text, chunks=[])  # Qwen as student: TinyLlama tokens in no range
    rows = alignment_rows(report, 10_000)
    assert sorted(i for row in rows for i in row[2]) == list(range(len(report["student_ids"])))
    assert sorted(j for row in rows for j in row[3]) == list(range(len(report["teacher_ids"])))
    assert [row[:2] for row in rows] == sorted(row[:2] for row in rows)
    assert alignment_rows(report, 5) == rows[:5]
    assert report["teacher_unmapped"] == sum(1 for row in rows if not row[2])


def test_inspect_prints_the_report(capsys, tmp_path, tokenizers):
    html = tmp_path / "alignment.html"
    inspect(student=TINYLLAMA, teacher=QWEN, html=html, chunks=[1, 4], rows=5)
    out = capsys.readouterr().out
    assert "Vocabulary overlap: 9,587 token strings, 6.32% of the teacher's vocabulary" in out
    assert f"Text: built-in math sample, {len(SAMPLE):,} characters" in out
    assert re.search(r"token-level\s+—\s+—\s+100\.00%\s+\d+\.\d\d%\n", out)
    assert re.search(r"4 chunks(\s+\d+\.\d\d%){4}\n", out)
    assert "IoS is below 100%" not in out
    # The first rows: "A" and " train" are cut the same way by both tokenizers.
    assert re.search(r'"A"\s+▁A\s+A\n\s+" train"\s+▁train\s+Ġtrain\n', out)
    page = html.read_text(encoding="utf-8")
    assert page.startswith("<!doctype html>") and "6.32% of the teacher&#x27;s vocabulary" in page
    report = pair_report(*tokenizers, SAMPLE, chunks=[])
    assert page.count('<div class="g" style') == len(alignment_rows(report, 10_000))


def test_inspect_says_how_documents_are_framed_and_how_much_maps(capsys, tmp_path):
    """Each side's BOS/EOS as `prepare` adds them (LitGPT's; or why prepare would refuse the tokenizer), and the mapped
    share of the prediction targets `prepare` makes of the text: its tokens and the EOS, the student's mapped to the
    teacher's; the BOS is none. On a text where Qwen's NFC folds a character away (its tiling span still covers the
    accent, so every token maps)."""
    (tmp_path / "tokenizer.json").write_bytes((TINYLLAMA / "tokenizer.json").read_bytes())  # no tokenizer_config.json
    text = "cafe\u0301 au lait"
    student, teacher = load_tokenizer(TINYLLAMA), load_tokenizer(QWEN)
    ranges = align(encode(student, text)[1], encode(teacher, text)[1])
    mapped = sum(a < b for a, b in ranges.tolist())  # Qwen's "é" spans the "e" and its accent
    assert mapped == len(ranges)

    inspect(student=tmp_path / "tokenizer.json", teacher=QWEN, text=text, rows=0)
    out = capsys.readouterr().out
    frame = re.search(r"Each document, as LitGPT's Tokenizer frames it: student (.*); teacher (.*)\n", out)
    assert frame[1].startswith("none: ") and "names no eos_token" in frame[1] and "is missing" in frame[1]
    assert frame[2] == "… <|endoftext|> (151643)"
    assert "(mapped share of the prediction targets: the text's tokens; the BOS is none)" in out
    assert pair_report(student, teacher, text, chunks=[])["targets"] == (len(ranges), len(encode(teacher, text)[0]))

    inspect(student=TINYLLAMA, teacher=QWEN, text=text, rows=0)
    out = capsys.readouterr().out
    assert "student <s> (1) … </s> (2); teacher … <|endoftext|> (151643)\n" in out
    report = pair_report(student, teacher, text, chunks=[], eos=True)
    assert report["targets"][0] == report["mapped_targets"][0] == mapped + 1  # the EOS, mapped to the teacher's
    shown = re.search(r"mapped share +([\d.]+)% +([\d.]+)%\n", out)
    assert shown[1] == shown[2] == "100.00"
    assert "targets: the text's tokens and its EOS, mapped to the teacher's EOS; the BOS is none)" in out
    # An empty document: its EOS is predicted from nothing of it, and maps to nothing.
    empty = pair_report(student, teacher, "", chunks=[], eos=True)
    assert (empty["targets"], empty["mapped_targets"]) == ((1, 1), (0, 0))


def test_inspect_covers_characters_a_normalizer_folds(capsys, tmp_path):
    file = tmp_path / "text.md"
    text = "Les mathe\u0301matiques: a < b"  # Qwen's NFC folds the combining acute into "é", whose span keeps it
    file.write_text(text, encoding="utf-8")
    html = tmp_path / "page.html"
    inspect(student=MISTRAL, teacher=QWEN / "tokenizer.json.gz", file=file, html=html, rows=3)
    out = capsys.readouterr().out
    assert f"Text: {file}, {len(text)} characters" in out
    assert re.search(r"characters covered +100\.00% +100\.00%", out) and re.search(r"unmapped tokens +0 +0", out)
    page = html.read_text(encoding="utf-8")
    assert "&lt;" in page and "a < b" not in page


def test_inspect_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="Pass --text or --file, not both"):
        inspect(student=TINYLLAMA, teacher=MISTRAL, text="x", file=tmp_path / "x.txt")
    with pytest.raises(ValueError, match="Chunk counts must be at least 1"):
        inspect(student=TINYLLAMA, teacher=MISTRAL, chunks=[4, 0])
    with pytest.raises(FileNotFoundError, match=r"No tokenizer.json or tokenizer.json.gz in .*it holds: nothing"):
        inspect(student=tmp_path, teacher=MISTRAL)


def test_inspect_command_line(capsys):
    # The vocagnolm CLI runs command functions through jsonargparse: flags and --help come from the signature.
    CLI(inspect, args=["--student", str(TINYLLAMA), "--teacher", str(MISTRAL), "--text", "1 + 1 = 2", "--chunks=[2]"])
    out = capsys.readouterr().out
    assert "Text: --text, 9 characters" in out and re.search(r"2 chunks\s+\d", out) and "4 chunks" not in out
    with pytest.raises(SystemExit):
        CLI(inspect, args=["--help"])
    assert "--teacher TEACHER" in capsys.readouterr().out


def reference_chunk_span_ios_iou(student_offsets, teacher_offsets, num_chunks):
    """Brute force: each chunk's characters as a Python set, chunk c holding tokens [c * n // C, (c + 1) * n // C)."""

    def chunk_sets(offsets):
        n = len(offsets)
        sets = [set() for _ in range(num_chunks)]
        for c in range(num_chunks):
            for i in range(c * n // num_chunks, (c + 1) * n // num_chunks):
                sets[c].update(range(offsets[i][0], offsets[i][1]))
        return sets

    ios, iou = [], []
    for s, t in zip(chunk_sets(student_offsets.tolist()), chunk_sets(teacher_offsets.tolist())):
        if s:
            ios.append(len(s & t) / len(s))
        if s | t:
            iou.append(len(s & t) / len(s | t))
    return np.mean(ios), np.mean(iou)


def test_chunk_span_overlap_matches_character_sets(tokenizers):
    # Real math text, plus characters that byte-level BPE splits across tokens (a token then spans a whole character
    # its neighbour shares) and that Qwen's NFC drops (a character in no teacher token).
    text = math_text(3) + " 名前は 🙂🙂 e\u0301 ∫₀¹"
    (_, student), (_, teacher) = (encode(tokenizer, text) for tokenizer in tokenizers)
    for pair in [(student, teacher), (teacher, student)]:
        for num_chunks in [1, 2, 7, 16, 64, 300, len(teacher) + 5]:
            assert chunk_span_ios_iou(*pair, num_chunks) == pytest.approx(
                reference_chunk_span_ios_iou(*pair, num_chunks), abs=1e-12
            )
    # Both chunk counts above and below the token counts; an empty side measures nothing.
    assert np.isnan(chunk_span_ios_iou(np.zeros((0, 2), dtype=np.int64), teacher, 4)[0])


def test_chunk_span_overlap_falls_as_chunks_get_finer(tokenizers):
    # The paper's Figure 3 direction on real math text, TinyLlama vs Qwen2.5: both figures fall as chunks get finer,
    # while token-level alignment keeps IoS at 100%.
    report = pair_report(*tokenizers, math_text(20), chunks=[1, 4, 16, 64, 256])
    spans = [report["chunks"][c]["chunk_span"] for c in [1, 4, 16, 64, 256]]
    assert spans[0] == (1.0, 1.0)
    for (ios, iou), (finer_ios, finer_iou) in zip(spans, spans[1:]):
        assert finer_ios < ios and finer_iou < iou
    assert spans[-1][1] < 0.5
    assert report["token_level"][0] == 1.0 and report["token_level"][1] > spans[-1][1]
    # The per-token view of the same chunks goes the other way for IoU: it is not Figure 3's measure.
    assert report["chunks"][256]["per_token"][1] > report["chunks"][1]["per_token"][1]


def test_inspect_writes_json_and_plot(capsys, tmp_path, tokenizers):
    file = tmp_path / "math.txt"
    file.write_text(math_text(5), encoding="utf-8")
    CLI(
        inspect,
        args=[
            "--student",
            str(TINYLLAMA),
            "--teacher",
            str(QWEN),
            "--file",
            str(file),
            "--chunks=[1, 16, 64]",
            "--json",
            str(tmp_path / "figure3.json"),
            "--plot",
            str(tmp_path / "figure3.png"),
            "--rows",
            "0",
        ],
    )
    out = capsys.readouterr().out
    assert re.search(r"chunk spans\s+per student token", out) and "the paper's measure" in out
    figures = json.loads((tmp_path / "figure3.json").read_text(encoding="utf-8"))
    report = pair_report(*tokenizers, file.read_text(encoding="utf-8"), chunks=[1, 16, 64])
    assert (figures["ios"], figures["iou"]) == report["token_level"]
    assert [entry["num_chunks"] for entry in figures["chunks"]] == [1, 16, 64]
    for entry in figures["chunks"]:
        c = entry["num_chunks"]
        assert (entry["chunk_span_ios"], entry["chunk_span_iou"]) == report["chunks"][c]["chunk_span"]
        assert (entry["per_token_ios"], entry["per_token_iou"]) == report["chunks"][c]["per_token"]
        # Fractions, and the printed table shows the same numbers as percentages.
        assert 0 <= entry["chunk_span_iou"] <= 1
        assert f"{entry['chunk_span_ios']:.2%}" in out and f"{entry['chunk_span_iou']:.2%}" in out
    assert (tmp_path / "figure3.png").read_bytes().startswith(b"\x89PNG")


def test_inspect_file_errors_name_the_problem(tmp_path):
    (tmp_path / "empty.txt").write_text("", encoding="utf-8")
    (tmp_path / "latin1.txt").write_bytes("Lösung: x = 2".encode("latin-1"))
    (tmp_path / "folder").mkdir()
    cases = [
        (tmp_path / "missing.txt", r"--file .*missing.txt does not exist: pass a UTF-8 text file"),
        (tmp_path / "folder", r"--file .*folder is a folder: pass one UTF-8 text file"),
        (tmp_path / "latin1.txt", r"--file .*latin1.txt is not UTF-8 text \(byte 1: invalid start byte\): convert"),
        (tmp_path / "empty.txt", r"--file .*empty.txt is empty: give some text to inspect"),
    ]
    for file, message in cases:
        with pytest.raises(UserError, match=message):
            inspect(student=TINYLLAMA, teacher=MISTRAL, file=file)
    with pytest.raises(ValueError, match="--text is empty"):
        inspect(student=TINYLLAMA, teacher=MISTRAL, text="")
