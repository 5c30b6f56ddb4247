"""Every console command and the recipe as a user types them: the required paths given, every other option at its
default, on tiny models and the CPU; then each precision the commands accept, end to end.

The chain runs once (session fixtures), each step on what the one before wrote: `vocagnolm prepare` -> `vocagnolm
score-teacher` -> `litgpt pretrain --recipe vocagnolm` (guided by the cache) -> `vocagnolm export` -> `vocagnolm
evaluate`. What the tests give beyond the defaults, and why:
- Tokenizers of 512 tokens, trained here on GSM8K text as the demo trains its own (a TinyLlama-like BPE for the
  student, a Qwen-like byte-level BPE for the teacher): paths the user gives. At `prepare`'s default sequence of
  2,048 tokens, each of `score-teacher`'s forwards (8 windows of ~2,560 teacher tokens) makes 650M logits with a
  real tokenizer's 32,000-row head: ~5 s of CPU each, measured here; 10M with 512 rows.
- The recipe's `--config`: the recipe has no default student (`--model_name` or `--model_config` is required), and
  its other defaults describe the paper's run (1,024 sequences of 2,048 tokens per step, 15B tokens). The file
  names the student (1 layer, width 32), the prepared data, the teacher (the cache, or its checkpoint), the tokenizer
  (so that the checkpoint can be evaluated) and a budget of 2 steps of 2 sequences; nothing else.
- `evaluate --tasks gsm8k --limit 2`, the README's quick check: without `--tasks` it evaluates Table 1's nine test
  sets whole. Its precision is the default (bf16-true on a CPU).
- The demo's defaults take minutes (`make demo`; docs/demo.md gives a run's time); tests/test_demo.py runs its
  whole pipeline at the QUICK sizes. Here `vocagnolm demo` with no option runs as typed up to its first work
  (tokenizer training) and no further: the command line, the defaults' checks, the shipped corpus found from another
  folder, `out/demo` made where the user is.
- `convert_to_litgpt` is given a folder named after the config (`llemma_7b`, as `litgpt download` names it) that holds
  a tiny model's weights in Hugging Face's layout: the name gives the config, the weights the tensors.

Each command runs in this process through the function its console script ends in (`conftest.typed_here`: `vocagnolm
...` as `cli.main` takes it, `litgpt pretrain --recipe vocagnolm ...` as the .pth hook hands it on), in the folder it is
typed in, to its exit status and what it printed: a console script's subprocess would import torch, Lightning and
LitGPT again for each (tests/test_cli.py runs the console scripts themselves).

The commands run with one thread (as OMP_NUM_THREADS=1 would in a subprocess; conftest's `one_thread`): on the 2
shared cores of the test machine a tiny model's matrix products ran up to 400x slower with 2 threads than with 1 (a
2 x 32 by 32 x 512 product: 15 ms against 36 us; the threads of a busy machine wait on each other, as demo/pipeline.py
says); it changes nothing the commands compute.
"""

import csv
import gzip
import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import QWEN, ROOT, TINYLLAMA, make_checkpoint, model_config_fields, tiny_config, typed_here
from litgpt import GPT
from litgpt.args import EvalArgs, TrainArgs
from litgpt.utils import get_default_supported_precision
from tokenizers import Tokenizer

from litgpt_vocagnolm.data.prepared import VocAgnoData, iter_blocks
from litgpt_vocagnolm.data.teacher_cache import TeacherLossCache
from litgpt_vocagnolm.demo.tokenizer_training import train_student_tokenizer, train_teacher_tokenizer
from litgpt_vocagnolm.evaluation.evaluate import evaluate
from litgpt_vocagnolm.evaluation.math_tasks import TASKS, load_examples
from litgpt_vocagnolm.models.weights import CHECKSUMS, UnreadableCheckpoint
from litgpt_vocagnolm.training.teacher import TeacherArgs

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]
STUDENT = tiny_config("student", 512, block_size=2048)  # prepare's default sequence
TEACHER = tiny_config("teacher", 512, block_size=4096)  # longer than any teacher window of 2,049 student tokens


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """A console command as typed in `cwd`, run here to its exit (`typed_here`: on one thread), which must succeed."""
    out = typed_here(*args, cwd=cwd)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    return out


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# The chain, each step on what the one before wrote.


@pytest.fixture(scope="session")
def work(tmp_path_factory) -> SimpleNamespace:
    """A folder as a user would have it: a corpus of 60 GSM8K problems (.jsonl with "text", `prepare`'s default
    key), the two tokenizers, the teacher's checkpoint and the run's --config."""
    root = tmp_path_factory.mktemp("as-typed")
    records = [json.loads(line) for line in (ROOT / "data" / "gsm8k" / "train.jsonl").read_text().splitlines()[:60]]
    texts = [record["question"] + "\n\n" + record["answer"] for record in records]
    (root / "corpus.jsonl").write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    student_tokenizer = train_student_tokenizer(texts, 512, root / "student-tokenizer")
    teacher = make_checkpoint(root / "teacher", TEACHER, train_teacher_tokenizer(texts, 512, root / "teacher-tok"))
    config = {
        "model_config": model_config_fields(STUDENT),
        "tokenizer_dir": "student-tokenizer",
        "data": {"class_path": "litgpt_vocagnolm.data.VocAgnoData", "init_args": {"path": "data"}},
        "train": {"global_batch_size": 2, "micro_batch_size": 1, "max_steps": 2},
    }
    return SimpleNamespace(root=root, student_tokenizer=student_tokenizer, teacher=teacher, config=config)


def write_config(work: SimpleNamespace, name: str, teacher: dict) -> Path:
    path = work.root / name
    path.write_text(yaml.safe_dump(work.config | {"teacher": teacher}))
    return path


@pytest.fixture(scope="session")
def prepared(work) -> subprocess.CompletedProcess:
    return run(
        "vocagnolm",
        "prepare",
        "--student",
        "student-tokenizer",
        "--teacher",
        "teacher",
        "--input",
        "corpus.jsonl",
        "--output",
        "data",
        cwd=work.root,
    )


@pytest.fixture(scope="session")
def scored(work, prepared) -> subprocess.CompletedProcess:
    return run("vocagnolm", "score-teacher", "--data", "data", "--teacher", "teacher", cwd=work.root)


@pytest.fixture(scope="session")
def trained(work, scored) -> subprocess.CompletedProcess:
    config = write_config(work, "cached.yaml", {"cache": "data/teacher_loss/teacher"})
    return run("litgpt", "pretrain", "--recipe", "vocagnolm", "--config", config.name, cwd=work.root)


@pytest.fixture(scope="session")
def exported(work, trained) -> subprocess.CompletedProcess:
    return run("vocagnolm", "export", "out/vocagnolm/final", "exported", cwd=work.root)


def test_prepare(work, prepared):
    manifest = json.loads((work.root / "data" / "manifest.json").read_text())
    assert manifest["max_seq_length"] == 2048 and manifest["settings"]["text_key"] == ["text"]
    assert manifest["student"]["sha256"] == sha256(work.student_tokenizer / "tokenizer.json")
    assert manifest["teacher"]["sha256"] == sha256(work.teacher / "tokenizer.json")
    # 1% of 60 documents leaves none: the one with the smallest hash is held out, the other 59 are trained on.
    assert "val: 1 documents" in prepared.stdout and "train: 59 documents" in prepared.stdout
    blocks = list(iter_blocks(work.root / "data"))
    assert len(blocks) == manifest["splits"]["train"]["blocks"] >= 4
    assert all(len(block["student_ids"]) == 2049 for block in blocks)


def test_score_teacher(work, scored):
    """The cache, where the default puts it, holds the teacher's loss of each token of each window, as LitGPT's GPT
    and torch's cross-entropy give it in float32, to float16's precision."""
    cache = TeacherLossCache(work.root / "data" / "teacher_loss" / "teacher", "train")
    teacher = GPT(TEACHER).eval()
    teacher.load_state_dict(torch.load(work.teacher / "lit_model.pth", weights_only=True))
    for index, block in zip(range(2), iter_blocks(work.root / "data")):
        ids = torch.as_tensor(block["teacher_ids"])
        with torch.no_grad():
            expected = F.cross_entropy(teacher(ids[None, :-1])[0], ids[1:], reduction="none")
        losses = torch.as_tensor(cache[index])
        assert losses.shape == ids.shape and losses[0].isnan()
        torch.testing.assert_close(losses[1:], expected, rtol=2e-3, atol=2e-3)


def test_litgpt_pretrain_recipe(work, trained):
    """Two steps guided by the cache, at the defaults: 32-true on a CPU, top 40% of the mapped tokens, tensorboard."""
    final = work.root / "out" / "vocagnolm" / "final"
    assert trained.stdout.count("selected: 0.40 of mapped") == 2
    weights = torch.load(final / "lit_model.pth", weights_only=True)
    assert (weights["step_count"], weights["iter_num"]) == (2, 4)  # 2 steps of 2 micro-batches of 1 block
    assert {tensor.dtype for tensor in weights["model"].values()} == {torch.float32}
    assert json.loads((final / CHECKSUMS).read_text())["lit_model.pth"] == sha256(final / "lit_model.pth")
    assert list((work.root / "out" / "vocagnolm" / "logs" / "tensorboard").rglob("events.out.tfevents.*"))


def test_vocagnolm_pretrain(work, prepared):
    """The same command under `vocagnolm pretrain`, the teacher online."""
    folder = work.root / "online"
    folder.mkdir()
    for name in ("data", "teacher", "student-tokenizer"):
        (folder / name).symlink_to(work.root / name)
    config = write_config(work, "online/online.yaml", {"checkpoint_dir": "teacher"})
    out = run("vocagnolm", "pretrain", "--config", config.name, cwd=folder)
    assert "Teacher teacher (" in out.stdout and out.stdout.count("selected: 0.40 of mapped") == 2
    assert torch.load(folder / "out" / "vocagnolm" / "final" / "lit_model.pth", weights_only=True)["step_count"] == 2


def test_export(work, exported):
    final, out = work.root / "out" / "vocagnolm" / "final", work.root / "exported"
    assert "Wrote exported/lit_model.pth (step 2)" in exported.stdout
    ours, theirs = (torch.load(d / "lit_model.pth", weights_only=True) for d in (out, final))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours["model"][k], t) for k, t in theirs["model"].items())
    assert json.loads((out / CHECKSUMS).read_text())["lit_model.pth"] == sha256(out / "lit_model.pth")
    # Its checksums are what evaluate checks the weights against: a damaged copy is refused before any work.
    damaged = work.root / "exported-damaged"
    shutil.copytree(out, damaged)
    with open(damaged / "lit_model.pth", "r+b") as f:
        f.seek((damaged / "lit_model.pth").stat().st_size // 2)
        f.write(b"\xff" * 4096)
    with pytest.raises(UnreadableCheckpoint, match="lit_model.pth does not match its checksum in checksums.json"):
        evaluate(damaged, tasks="gsm8k", limit=1)
    assert not (damaged / "evaluate").exists()


@pytest.mark.parametrize("kind", ["trained", "plain LitGPT"])
def test_evaluate(work, exported, kind):
    """The crash this was written for: `evaluate CHECKPOINT` at its default precision (bf16-true on a CPU) called the
    head, bf16, on what Fabric hands back in float32. Both kinds of checkpoint: exported from training ({"model": ...},
    checksums.json) and as `litgpt download` leaves one (a bare state dict, TinyLlama's tokenizer)."""
    if kind == "trained":
        checkpoint, block_size = work.root / "exported", STUDENT.block_size
    else:
        config = tiny_config("plain", 32000, block_size=1024)
        checkpoint, block_size = make_checkpoint(work.root / "plain", config, TINYLLAMA), config.block_size
    out = run("vocagnolm", "evaluate", checkpoint.name, "--tasks", "gsm8k", "--limit", "2", cwd=work.root)

    assert "| model | GSM8K | AVG |" in out.stdout
    with open(checkpoint / "evaluate" / "results.csv", newline="") as f:
        (row,) = list(csv.DictReader(f))
    settings = (row["task"], row["questions"], row["limit"], row["max_new_tokens"], row["precision"])
    assert settings == ("gsm8k", "2", "2", "1024", get_default_supported_precision(training=False))
    assert row["checkpoint_sha256"] == sha256(checkpoint / "lit_model.pth")
    predictions = [json.loads(line) for line in open(checkpoint / "evaluate" / row["predictions"])]
    assert [p["idx"] for p in predictions] == [example["idx"] for example in load_examples(TASKS["gsm8k"])[:2]]
    assert float(row["accuracy"]) == 100 * sum(p["score"] for p in predictions) / 2
    # Decoded past the prefill's first token, within each prompt's share of the block.
    assert max(p["new_tokens"] for p in predictions) > 1 and all(p["new_tokens"] < block_size for p in predictions)


def test_inspect(tmp_path):
    """The paper's pair of tokenizers (Figure 1: 6.32% of Qwen2.5's vocabulary is TinyLlama's too), on the built-in
    sample; the overlap counted here with the tokenizers library."""
    out = run("vocagnolm", "inspect", "--student", str(TINYLLAMA), "--teacher", str(QWEN), cwd=tmp_path)
    student = Tokenizer.from_file(str(TINYLLAMA / "tokenizer.json")).get_vocab(with_added_tokens=True)
    teacher = Tokenizer.from_str(gzip.decompress((QWEN / "tokenizer.json.gz").read_bytes()).decode())
    teacher_vocab = teacher.get_vocab(with_added_tokens=True)
    shared = len(student.keys() & teacher_vocab.keys())
    assert f"Vocabulary overlap: {shared:,} token strings, {100 * shared / len(teacher_vocab):.2f}%" in out.stdout
    assert shared == 9587 and "built-in math sample" in out.stdout


def test_plan():
    """`make demo-cpu`'s recipe, as its comment says to run it (from the repository)."""
    out = run("vocagnolm", "plan", "--config", "demo-cpu", cwd=ROOT)
    largest = re.search(r"Largest micro-batch that fits 80 GB: (\d+)", out.stdout)
    assert largest and int(largest[1]) >= 8  # the recipe's own micro-batch fits


def test_convert_to_litgpt(tmp_path):
    from litgpt.scripts.convert_lit_checkpoint import copy_weights_llama

    config = tiny_config("tiny", 512)  # llemma_7b's shapes are not needed to convert: the names are
    torch.manual_seed(0)
    model = GPT(config)
    hf_weights = {}
    copy_weights_llama(config, hf_weights, model.state_dict(), untie_weights=False)  # LitGPT -> Hugging Face names
    folder = tmp_path / "checkpoints" / "EleutherAI" / "llemma_7b"
    folder.mkdir(parents=True)
    torch.save(hf_weights, folder / "pytorch_model.bin")
    run("vocagnolm", "convert_to_litgpt", "checkpoints/EleutherAI/llemma_7b", cwd=tmp_path)

    converted = torch.load(folder / "lit_model.pth", weights_only=True)
    assert converted.keys() == model.state_dict().keys()
    assert all(torch.equal(converted[name], tensor) for name, tensor in model.state_dict().items())
    assert yaml.safe_load((folder / "model_config.yaml").read_text())["name"] == "llemma_7b"  # registered by us


def test_demo(tmp_path, monkeypatch):
    """`vocagnolm demo`, through the function the console script runs, as far as its first work."""
    from litgpt_vocagnolm.cli import main
    from litgpt_vocagnolm.demo import tokenizer_training
    from litgpt_vocagnolm.demo.settings import CORPUS, DemoSizes

    class FirstWork(Exception):
        pass

    seen = {}

    def stop(texts: list[str], vocab_size: int, out_dir: Path) -> Path:
        seen.update(texts=texts, vocab_size=vocab_size, out_dir=out_dir)
        raise FirstWork

    monkeypatch.setattr(tokenizer_training, "train_student_tokenizer", stop)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FirstWork):
        main(["demo"])
    sizes = DemoSizes()
    assert seen["out_dir"] == Path("out/demo/tokenizers/student") and seen["vocab_size"] == sizes.student_vocab_size
    assert (tmp_path / "out" / "demo").is_dir()
    # The tokenizers learn from the teacher's half of every shipped document that is not held out.
    documents = sum(1 for file, _ in CORPUS for line in open(ROOT / "data" / file) if line.strip())
    assert len(seen["texts"]) == pytest.approx(documents * (1 - sizes.heldout_share) / 2, rel=0.01)


# Each precision the commands accept, end to end (where torch supports it on a CPU), in this process: the recipe
# (`--precision`, `--teacher.precision`), score-teacher and evaluate. 32-true is the recipe's, its teacher's and
# score-teacher's default on a CPU, bf16-true evaluate's: the tests above run those, and evaluate's 32-true is what
# its other precisions are measured against. evaluate's `16-mixed` has no CPU autocast in Fabric, which runs it as
# bf16-mixed (evaluate --help says so).


@pytest.mark.parametrize("precision, teacher_precision", [("bf16-true", "16-true"), ("bf16-mixed", "bf16-true")])
def test_recipe_precisions(work, prepared, tmp_path, precision, teacher_precision):
    from litgpt_vocagnolm.training.recipe import setup

    setup(
        model_config=STUDENT,
        out_dir=tmp_path / "out",
        precision=precision,
        tokenizer_dir=work.student_tokenizer,
        data=VocAgnoData(path=work.root / "data", num_workers=0),
        devices=1,
        logger_name="csv",
        train=TrainArgs(global_batch_size=1, micro_batch_size=1, max_tokens=2048, max_norm=1.0, save_interval=None),
        eval=EvalArgs(final_validation=False),
        teacher=TeacherArgs(checkpoint_dir=work.teacher, precision=teacher_precision),
    )
    with open(next((tmp_path / "out").glob("logs/**/metrics.csv")), newline="") as f:
        (row,) = [row for row in csv.DictReader(f) if row["loss"]]
    assert np.isfinite(float(row["loss"]))
    weights = torch.load(tmp_path / "out" / "final" / "lit_model.pth", weights_only=True)["model"]
    # bf16-true trains bf16 weights; bf16-mixed keeps float32 ones and computes in bf16.
    assert {t.dtype for t in weights.values()} == {torch.bfloat16 if precision == "bf16-true" else torch.float32}


@pytest.mark.parametrize("precision, tolerance", [("bf16-true", 0.05), ("16-true", 0.02)])
def test_score_teacher_precisions(work, scored, tmp_path, precision, tolerance):
    """The same teacher in half precision scores what the default (float32) did, to the half type's rounding."""
    from litgpt_vocagnolm.training.score_teacher import score_teacher

    score_teacher(
        data=work.root / "data", teacher=work.teacher, output=tmp_path / "cache", precision=precision, num_workers=0
    )
    manifest = json.loads((tmp_path / "cache" / "manifest.json").read_text())
    assert manifest["precision"] == precision
    half = TeacherLossCache(tmp_path / "cache", "train")
    full = TeacherLossCache(work.root / "data" / "teacher_loss" / "teacher", "train")
    for index in range(manifest["splits"]["train"]["blocks"]):
        np.testing.assert_allclose(half[index][1:], full[index][1:], atol=tolerance)


@pytest.fixture(scope="session")
def evaluated_in_float32(tmp_path_factory) -> tuple[Path, Path, Path]:
    """A plain LitGPT checkpoint evaluated in float32 (generation and bits per byte): (checkpoint, text, out_dir)."""
    root = tmp_path_factory.mktemp("precisions")
    checkpoint = make_checkpoint(root / "plain", tiny_config("plain", 32000, block_size=1024), TINYLLAMA)
    text = root / "held-out.txt"
    text.write_text((ROOT / "data" / "gsm8k" / "train.jsonl").read_text()[:3000])
    evaluate(checkpoint, tasks="gsm8k", limit=1, max_new_tokens=8, bpb=text, out_dir=root / "out", precision="32-true")
    return checkpoint, text, root / "out"


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-true"])
def test_evaluate_precisions(evaluated_in_float32, precision):
    """Generation and bits per byte under each precision, beside float32's rows; bits per byte as float32 measures
    it, to the rounding."""
    checkpoint, text, out = evaluated_in_float32
    evaluate(checkpoint, tasks="gsm8k", limit=1, max_new_tokens=8, bpb=text, out_dir=out, precision=precision)
    with open(out / "results.csv", newline="") as f:
        rows = {row["precision"]: row for row in csv.DictReader(f)}
    for p in ("32-true", precision):
        predictions = [json.loads(line) for line in open(out / rows[p]["predictions"])]
        assert len(predictions) == 1 and predictions[0]["new_tokens"] == 8  # a random model: no stop string, no EOS
    with open(out / "bpb.csv", newline="") as f:
        bpb = {row["precision"]: float(row["bits_per_byte"]) for row in csv.DictReader(f)}
    assert bpb[precision] == pytest.approx(bpb["32-true"], rel=1e-3)
