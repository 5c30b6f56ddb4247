"""`vocagnolm demo` in miniature (`quick=True`): the same pipeline, a few steps of everything, and its pieces."""

import csv
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT
from test_recipe import metrics

from litgpt_vocagnolm.alignment.lexical import vocab_overlap
from litgpt_vocagnolm.alignment.tokenizer_files import load_tokenizer, same_vocabulary
from litgpt_vocagnolm.demo.corpus import add_noise, read_corpus, split_heldout
from litgpt_vocagnolm.demo.pipeline import demo
from litgpt_vocagnolm.demo.settings import QUICK, STUDENT_ALPHABET, STUDENT_VOCAB_MIN, STUDENTS
from litgpt_vocagnolm.demo.table import compare
from litgpt_vocagnolm.demo.tokenizer_training import train_student_tokenizer

METHOD_NAMES = list(STUDENTS)
SEEDED = ("ce", "vocagnolm", "vocagnolm-2teachers", "vocagnolm-2teachers-byte")


@pytest.fixture(scope="module")
def quick_run(quick_demo) -> tuple[Path, str]:
    """One quick demo (every method; 2 seeds for ce, vocagnolm and both two-teacher runs), run by
    `vocagnolm demo --quick true` from an empty folder (conftest.py): (out_dir, what it printed)."""
    return quick_demo / "out" / "demo", (quick_demo / "printed.txt").read_text()


def test_results_csv_has_one_row_per_method_with_the_curve(quick_run):
    out_dir, _ = quick_run
    with open(out_dir / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [row["method"] for row in rows] == METHOD_NAMES
    curve = [name for name in rows[0] if name.startswith("bpb@")]
    steps = QUICK.student_tokens // (QUICK.micro_batch_size * QUICK.max_seq_length) // QUICK.evaluations
    tokens_per_eval = steps * QUICK.micro_batch_size * QUICK.max_seq_length
    assert curve == [f"bpb@{tokens_per_eval * (i + 1)}" for i in range(QUICK.evaluations)]
    for row in rows:
        seeds = int(row["seeds"])
        assert seeds == (2 if row["method"] in SEEDED else 1)
        bpb, low, high = float(row["heldout_bpb"]), float(row["heldout_bpb_min"]), float(row["heldout_bpb_max"])
        assert 0 < low <= bpb <= high < 16, row  # a byte holds 8 bits; an untrained model of ~600 tokens ~4-6
        assert (low == high) == (seeds == 1)
        assert float(row[curve[-1]]) == pytest.approx(bpb)  # the final figure is the curve's last point
        # bits per byte = nats per token / ln 2 x tokens per byte: the same held-out text, so one ratio for all
        assert float(row["heldout_loss"]) > 0 and float(row["tokens_per_sec"]) > 0
        assert all(math.isfinite(float(row[name])) for name in curve)


def test_runs_are_logged_and_checkpointed(quick_run):
    out_dir, _ = quick_run
    expected = {"teacher", "teacher2"} | {f"{m}-seed1" for m in METHOD_NAMES} | {f"{m}-seed2" for m in SEEDED}
    assert {p.name for p in (out_dir / "runs").iterdir() if p.is_dir()} == expected
    teacher = out_dir / "runs" / "teacher" / "final"
    files = {p.name for p in teacher.iterdir()}
    assert {"lit_model.pth", "model_config.yaml", "tokenizer.json", "tokenizer_config.json"} <= files
    # The teacher's tokenizer is the very file the students' data was prepared with.
    manifest = json.loads((out_dir / "data" / "students" / "manifest.json").read_text())
    from litgpt_vocagnolm.files import file_sha256

    assert manifest["teacher"]["sha256"] == file_sha256(teacher / "tokenizer.json")
    assert manifest["student"]["sha256"] == file_sha256(out_dir / "tokenizers" / "student" / "tokenizer.json")
    # The second teacher's: its own data of the students' text, the same student blocks, and its loss cache.
    second = json.loads((out_dir / "data" / "students-teacher2" / "manifest.json").read_text())
    assert second["teacher"]["sha256"] == file_sha256(out_dir / "runs" / "teacher2" / "final" / "tokenizer.json")
    assert second["splits"]["train"]["blocks"] == manifest["splits"]["train"]["blocks"]
    assert (out_dir / "data" / "teacher2-loss" / "manifest.json").is_file()


def test_plot_and_markdown_table_are_written_and_printed(quick_run):
    out_dir, printed = quick_run
    import matplotlib.image

    image = matplotlib.image.imread(out_dir / "bpb.png")
    assert image.shape[:2] == (540, 840)  # 7 x 4.5 inches at 120 dpi
    assert image[..., :3].std() > 0.05  # not a blank canvas

    written = (out_dir / "results.md").read_text().strip()
    table = [line for line in written.splitlines() if line.startswith("|")]
    assert table[0].startswith("| method | seeds | held-out bits/byte")
    assert "| trained tokens touching noise |" in table[0]
    assert len({line.count("|") for line in table}) == 1  # every row has every column
    teachers = ["teacher (own tokenizer, clean text)", "second teacher (vocagnolm-2teachers)"]
    assert [line.split("|")[1].strip() for line in table[2:]] == [*teachers, *METHOD_NAMES]
    assert "\n".join(table) in printed
    summary = written.splitlines()[-1]
    assert summary.startswith("Noise: ") and "of the students' training tokens touch noise" in summary
    assert summary in printed
    assert re.search(r"Vocabulary overlap \d+\.\d% of the teacher's", printed)
    assert "vocagnolm vs ce, teacher-guided selection vs naive training" in printed
    assert "vocagnolm-2teachers vs vocagnolm, two teachers" in printed
    share = re.search(
        r"vocagnolm-2teachers: the second teacher set the reference of (\d+\.\d)% of the selected", printed
    )
    runs = [metrics(out_dir / "runs" / f"vocagnolm-2teachers-seed{seed}") for seed in (1, 2)]
    logged = np.mean([np.mean([row["reference_share_1"] for row in rows]) for rows in runs])  # per run, then seeds
    assert share and float(share.group(1)) == pytest.approx(100 * logged, abs=0.05)
    assert "vocagnolm-2teachers-byte vs vocagnolm-2teachers, two teachers compared per byte" in printed
    # The gap to `ce` at each evaluation, from the two curves of results.csv.
    with open(out_dir / "results.csv", newline="") as f:
        rows = {row["method"]: row for row in csv.DictReader(f)}
    points = [name for name in rows["ce"] if name.startswith("bpb@")]
    gaps = "; ".join(f"{float(rows['vocagnolm'][p]) - float(rows['ce'][p]):+.3f} at {int(p[4:]):,}" for p in points)
    along = re.search(r"vocagnolm vs ce along the run: (.*) tokens", printed).group(1)
    assert re.sub(r" \(every seed ahead\)", "", along) == gaps


def test_tokenizers_are_two_families_that_round_trip(quick_run):
    out_dir, _ = quick_run
    student = load_tokenizer(out_dir / "tokenizers" / "student")
    teacher = load_tokenizer(out_dir / "tokenizers" / "teacher")
    assert student.get_vocab_size() == QUICK.student_vocab_size
    assert teacher.get_vocab_size() == QUICK.teacher_vocab_size
    text = "Natalia sold 48 clips ∮ naïve 漢字 — $x^2$"
    # Characters outside the student's alphabet fall back to bytes, in Llama's id layout: <0xE2> is id 3 + 0xE2.
    ids = student.encode(text, add_special_tokens=False).ids
    assert student.token_to_id("<0xE2>") == 3 + 0xE2 and 3 + 0xE2 in ids
    assert student.decode(ids) == text
    assert teacher.decode(teacher.encode(text, add_special_tokens=False).ids) == text
    assert student.encode(" 12", add_special_tokens=False).tokens == ["▁", "1", "2"]  # digits split, like Llama
    assert teacher.encode(" hello", add_special_tokens=False).tokens[0].startswith("Ġ")  # byte-level, like Qwen
    assert 0 < vocab_overlap(student, teacher) < 0.5
    # The second teacher: the student's family, other merges, so other ids (a vocabulary of its own, not an extension).
    teacher2 = load_tokenizer(out_dir / "tokenizers" / "teacher2")
    assert teacher2.get_vocab_size() == QUICK.second_teacher_vocab_size and not same_vocabulary(student, teacher2)


def test_student_alphabet_breaks_ties_by_the_character(tmp_path):
    """Every character of the text once, "▁" (the space mark put before it) too: 102 tied for 100 places. The
    student keeps the first 100 by code point, after its special and byte tokens; the trainer alone would drop two
    in the order of its hash map."""
    characters = [chr(0x4E00 + i) for i in range(STUDENT_ALPHABET + 1)]
    tokenizer = load_tokenizer(train_student_tokenizer(["".join(characters)], STUDENT_VOCAB_MIN, tmp_path))
    vocab = sorted(tokenizer.get_vocab(), key=tokenizer.get_vocab().get)
    assert vocab[3 + 256 :] == ["▁", *characters[: STUDENT_ALPHABET - 1]]


# Trains the quick demo's tokenizers on the texts the demo gives them, three times, into folders 0, 1, 2 of argv[1].
TRAIN_QUICK_TOKENIZERS = """
import sys
from pathlib import Path
from litgpt_vocagnolm.demo.corpus import demo_texts
from litgpt_vocagnolm.demo.settings import DATA, QUICK
from litgpt_vocagnolm.demo.tokenizer_training import train_tokenizers
teacher_texts = demo_texts(DATA, QUICK)[0]
for i in range(3):
    train_tokenizers(teacher_texts, QUICK, Path(sys.argv[1]) / str(i), second_teacher=True)
"""


def test_quick_tokenizers_are_the_same_bytes_in_every_process(tmp_path):
    """`vocagnolm demo --quick`'s three tokenizers, trained three times in each of two processes: the same files. The
    trainer's hash maps are seeded anew in every process (and every map within one); with the student's alphabet
    left to them, its files differed from run to run."""
    command = [sys.executable, "-c", TRAIN_QUICK_TOKENIZERS]
    processes = [subprocess.Popen([*command, str(tmp_path / f"process{p}")], stderr=subprocess.PIPE) for p in (0, 1)]
    for process in processes:
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr.decode()
    trainings = sorted(tmp_path.glob("*/*"))
    files = [{str(f.relative_to(run)): f.read_bytes() for f in run.rglob("*") if f.is_file()} for run in trainings]
    assert len(trainings) == 6 and len(files[0]) == 6  # student, teacher, teacher2: tokenizer(_config).json each
    different = [
        f"{run.relative_to(tmp_path)}/{name}"
        for run, f in zip(trainings, files)
        for name in f
        if f[name] != files[0][name]
    ]
    assert not different, f"differ from {trainings[0].relative_to(tmp_path)}'s"


def test_noise_covers_its_share_and_keeps_length():
    rng = np.random.default_rng(0)
    text = "." * 200_000  # "." is no noise letter, and shuffling dots leaves dots: only letter stretches show
    noisy, mask = add_noise(text, 0.3, rng)
    assert len(noisy) == len(text) == len(mask)
    letters = [c != "." for c in noisy]
    assert abs(sum(letters) / len(text) - 0.15) < 0.01  # half the noisy stretches are letters
    assert abs(mask.mean() - 0.3) < 0.01
    assert not any(np.array(letters) & ~mask)  # every changed character lies in a noisy stretch
    assert all(c == "." or c.isalnum() and c.isascii() for c in noisy)
    # A shuffle keeps the characters; clean text stays clean.
    words = "the quick brown fox jumps over the lazy dog " * 2000
    shuffled, mask = add_noise(words, 0.3, np.random.default_rng(1))
    assert add_noise(words, 0.0, rng)[0] == words and not add_noise(words, 0.0, rng)[1].any()
    assert shuffled != words and len(shuffled) == len(words)
    assert all(a == b for a, b, noise in zip(shuffled, words, mask) if not noise)  # outside the noise, the text
    assert add_noise(words, 0.3, np.random.default_rng(1))[0] == shuffled  # seeded


def test_noise_in_the_trained_tokens(quick_run):
    """The noise counts: the demo's blocks and which of their tokens touch noise, against the prepared data and a
    per-token loop over the tokenizer's offsets; methods that train every token count the share of all tokens."""
    from litgpt_vocagnolm.data.prepared import collate_blocks, decode_block, iter_blocks
    from litgpt_vocagnolm.demo.noise import noise_sample, score_blocks, trained_noise_share
    from litgpt_vocagnolm.demo.settings import DATA
    from litgpt_vocagnolm.loss.methods import GuidanceArgs
    from litgpt_vocagnolm.loss.selection import teacher_guided_weights
    from litgpt_vocagnolm.models.gpt import load_model

    out_dir, _ = quick_run
    student_dir, teacher_dir = out_dir / "tokenizers" / "student", out_dir / "tokenizers" / "teacher"
    train, _ = split_heldout(read_corpus(DATA, QUICK.documents), QUICK.heldout_share)
    rng = np.random.default_rng(0)
    noisy = [add_noise(text, 0.3, rng) for text in train[1::2]]  # as the demo noises the students' half
    written = [json.loads(line)["text"] for line in (out_dir / "corpus" / "students.jsonl").read_text().splitlines()]
    assert [text for text, _ in noisy[: len(written)]] == written

    teacher2_dir = out_dir / "tokenizers" / "teacher2"
    (blocks, blocks2), touched = noise_sample(
        noisy, student_dir, [teacher_dir, teacher2_dir], QUICK, 2 * QUICK.max_seq_length
    )
    block_tokens = QUICK.max_seq_length + 1
    assert touched.shape == (QUICK.noise_batches * QUICK.micro_batch_size, block_tokens)
    for sample, data in ((blocks, "students"), (blocks2, "students-teacher2")):  # each teacher's prepared data
        stored = list(iter_blocks(out_dir / "data" / data, "train"))  # one work unit: in document order
        for ours, theirs in zip(sample, stored, strict=False):
            ours = decode_block(ours, block_tokens)
            assert all(np.array_equal(ours[key], theirs[key]) for key in theirs)
    tokenizer, expected = load_tokenizer(student_dir), []
    for text, mask in noisy[:20]:
        expected.append(False)  # BOS
        expected += [bool(mask[a:b].any()) for a, b in tokenizer.encode(text, add_special_tokens=False).offsets]
        expected.append(False)  # EOS
    assert touched.flatten().tolist() == expected[: touched.numel()]
    assert 0.1 < touched.float().mean() < 0.9

    noise_all = touched[:, 1:].float().mean().item()
    blocks = score_blocks(out_dir / "runs" / "teacher" / "final", blocks)
    run = out_dir / "runs" / "vocagnolm-seed1" / "final"
    everything = trained_noise_share(run, GuidanceArgs(top_k=1.0), [blocks], touched, QUICK, seed=1)
    assert everything == pytest.approx(noise_all)  # top-k 1 trains every token
    some = trained_noise_share(run, GuidanceArgs(top_k=0.4), [blocks], touched, QUICK, seed=1)
    # The same count, micro-batch by micro-batch, from the weights `teacher_guided_weights` gives the final student.
    model, counts = load_model(run), torch.zeros(2)
    for start in range(0, len(blocks), QUICK.micro_batch_size):
        rows = slice(start, start + QUICK.micro_batch_size)
        batch = collate_blocks(blocks[rows], block_tokens)
        (side,) = batch.teachers
        valid = batch.targets != -100
        with torch.no_grad():
            ls = model(batch.input_ids, targets=batch.targets)
        trained = teacher_guided_weights(ls, [side.loss], [side.ranges], valid) > 0  # top_k 0.4, the default
        counts += torch.stack([(trained & touched[rows, 1:]).sum(), trained.sum()])
    assert some == pytest.approx((counts[0] / counts[1]).item()) and some != pytest.approx(noise_all)

    with open(out_dir / "results.csv", newline="") as f:
        rows = {row["method"]: row for row in csv.DictReader(f)}
    assert all(float(row["noise_all"]) == pytest.approx(noise_all) for row in rows.values())
    for method in ("ce", "uld"):
        assert float(rows[method]["noise_trained"]) == pytest.approx(noise_all)
    assert float(rows["vocagnolm"]["noise_trained"]) != pytest.approx(noise_all)


def test_heldout_split_is_a_stable_disjoint_share():
    documents = read_corpus(ROOT / "data", limit=2000)
    assert len(documents) == 2000
    assert sum(d.startswith("Background:") for d in documents[:20]) >= 1  # both sources, interleaved
    train, heldout = split_heldout(documents, 0.1)
    assert len(train) + len(heldout) == 2000 and not set(train) & set(heldout)
    assert 150 < len(heldout) < 250
    assert split_heldout(documents[::-1], 0.1)[1] == heldout[::-1]  # by text, not by position


@pytest.mark.parametrize(
    "a, b, spread, verdict",
    [
        ([2.0, 2.1], [2.2, 2.3], None, "better"),
        ([2.0, 2.25], [2.2, 2.3], None, "no clear difference"),
        ([2.4, 2.5], [2.2, 2.3], None, "worse"),
        ([2.0], [2.2], 0.1, "better"),
        ([2.0], [2.05], 0.1, "no clear difference"),
        ([2.0], [2.2], None, "not claimed"),
    ],
)
def test_claims_need_a_gap_beyond_seed_noise(a, b, spread, verdict):
    assert compare(a, b, spread).split(": ", 1)[1].startswith(verdict)


def test_bad_settings_fail_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="Unknown method"):
        demo(out_dir=tmp_path, methods=("ce", "rho2"))
    with pytest.raises(FileNotFoundError, match="--data_dir"):
        demo(out_dir=tmp_path, data_dir=tmp_path)
    assert not any(tmp_path.iterdir())


def test_documents_for_a_budget_are_a_prefix_with_five_percent_more(quick_run):
    from litgpt_vocagnolm.demo.corpus import documents_for

    out_dir, _ = quick_run
    tokenizer_dir = out_dir / "tokenizers" / "student"
    tokenizer = load_tokenizer(tokenizer_dir)
    texts = read_corpus(ROOT / "data", limit=300)
    chosen = documents_for(texts, tokenizer_dir, 5000)
    assert chosen == texts[: len(chosen)]
    counts = [len(tokenizer.encode(t, add_special_tokens=False).ids) + 1 for t in chosen]
    assert sum(counts[:-1]) < 5250 <= sum(counts)
    assert documents_for(iter(texts), tokenizer_dir, 5000) == chosen  # a generator, read lazily, gives the same
    with pytest.raises(ValueError, match="lower the budget"):
        documents_for(texts[:3], tokenizer_dir, 5000)


def test_command_line_takes_sizes_and_lists_of_methods():
    """What `vocagnolm demo ...` parses (jsonargparse, as the CLI runs it): nested sizes, lists, the quick switch."""
    from jsonargparse import CLI, capture_parser

    parser = capture_parser(lambda: CLI(demo, args=[]))
    config = parser.parse_args(
        [
            "--methods",
            "[ce, vocagnolm]",
            "--seeds",
            "[3]",
            "--sizes.student_tokens",
            "4096",
            "--quick",
            "true",
            "--noise",
            "0",
        ]
    )
    assert config.methods == ("ce", "vocagnolm") and config.seeds == (3,) and config.quick is True
    assert config.sizes.student_tokens == 4096 and config.sizes.teacher_vocab_size == 6000 and config.noise == 0


def test_the_paper_pair_overlap_the_demo_prints_is_computed(tmp_path):
    """The demo sets its tokenizer pair beside TinyLlama's and Qwen2.5's overlap, measured on the fixtures (6.3%)."""
    from litgpt_vocagnolm.demo.settings import PAPER_PAIR
    from litgpt_vocagnolm.demo.tokenizer_training import describe_tokenizers

    student, teacher = (load_tokenizer(path) for path in PAPER_PAIR)
    printed = describe_tokenizers(*PAPER_PAIR, "Let x = 2.")
    assert f"(TinyLlama vs Qwen2.5: {vocab_overlap(student, teacher):.1%})" in printed
    assert "(TinyLlama vs Qwen2.5: 6.3%)" in printed  # the paper's Figure 1: 6.32%


def test_every_file_the_demo_writes_is_under_a_path_it_records(quick_run):
    """A demo stopped in the middle is replaced on a rerun where its record's paths say, and only there: every file
    a whole demo writes must fall under one of them."""
    from litgpt_vocagnolm.demo.pipeline import OUTPUTS, RECORD, demo_paths, written_files

    out_dir, _ = quick_run
    paths = demo_paths([(m, s) for s in (1, 2) for m in METHOD_NAMES if s == 1 or m in SEEDED])  # what it recorded
    assert json.loads((out_dir / RECORD).read_text())["files"] == written_files(out_dir, OUTPUTS)  # once finished
    outside = [f for f in written_files(out_dir, OUTPUTS) if not any(f == p or f.startswith(f"{p}/") for p in paths)]
    assert outside == [] and len(written_files(out_dir, OUTPUTS)) > 50
