"""Every piece of advice a refusal gives leads somewhere. Each test types what a user typed, is refused in one line,
follows the advice as the line words it (the options and the command are read from the message itself, not written
here) and checks that the command then gets past the point that refused it: it runs, or the next refusal is another.
"""

import gzip
import json
import re
import shlex
import shutil
from pathlib import Path

import pytest
import torch
from conftest import (
    MISTRAL,
    QWEN,
    ROOT,
    TINYLLAMA,
    TOKENIZERS,
    make_checkpoint,
    model_config_fields,
    prepare_pair,
    tiny_config,
)
from litgpt.config import Config
from litgpt.model import GPT

from litgpt_vocagnolm.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]
STUDENT = json.dumps(model_config_fields(tiny_config("student", 32000, block_size=64)))  # a 1-layer --model_config
ONE_STEP = ["--train.global_batch_size", "2", "--train.micro_batch_size", "2", "--train.max_tokens", "128"]


def typed(capsys, *argv: str | Path) -> tuple[int, str, str]:
    """`vocagnolm ARGV` in this process (`vocagnolm pretrain ...` is `litgpt pretrain --recipe vocagnolm ...`): its
    exit status, stdout and stderr."""
    try:
        main([str(arg) for arg in argv])
        code = 0
    except SystemExit as exit:
        code = exit.code or 0
    out = capsys.readouterr()
    return code, out.out, out.err


def refusal(capsys, *argv: str | Path) -> str:
    """The one line a refused command prints, exit status 1, without its `prog: error: `."""
    code, _, err = typed(capsys, *argv)
    lines = [line for line in err.splitlines() if ": error: " in line]
    assert code == 1 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0].split(": error: ", 1)[1]


def runs(capsys, *argv: str | Path) -> str:
    """The stdout of a command that runs to its end."""
    code, out, err = typed(capsys, *argv)
    assert code == 0, err[-3000:]
    return out


def fix(message: str, marker: str) -> str:
    """The one fix among those `message` offers (split at ", or ", "; ", ": " and sentences) that holds `marker`."""
    fixes = [part for part in re.split(r", or |; |: |\. (?=[A-Z])", message) if marker in part]
    assert len(fixes) == 1, message
    return fixes[0]


def options(advice: str) -> list[str]:
    """The options a piece of advice gives, as typed: "train with --a 1 --b x" -> ["--a", "1", "--b", "x"]."""
    pairs = re.findall(r"(--[\w.]+) ([\w/.-]*\w)", advice)
    assert pairs, advice
    return [word for pair in pairs for word in pair]


def command(advice: str, **placeholders: Path) -> list[str]:
    """The command a piece of advice quotes, as `main` takes it, its placeholders (DIR) filled in:
    "`vocagnolm export A DIR`" -> ["export", "A", "<DIR>"]; `litgpt pretrain --recipe vocagnolm` is `pretrain`."""
    quoted = re.search(r"`((?:vocagnolm|litgpt pretrain --recipe vocagnolm) [^`]+)`", advice)
    assert quoted, advice
    words = shlex.split(quoted[1].replace("litgpt pretrain --recipe vocagnolm", "vocagnolm pretrain"))[1:]
    return [str(placeholders.get(word, word)) for word in words]


def pretrain(data: Path, out_dir: Path, *more: str | Path) -> list[str | Path]:
    """A one-step run of a tiny student on prepared data, as a user types it."""
    return [
        "pretrain", "--model_config", STUDENT, "--tokenizer_dir", TINYLLAMA, "--data", "VocAgnoData",
        "--data.path", data, "--data.num_workers", "0", "--out_dir", out_dir, "--devices", "1",
        "--logger_name", "csv", "--eval.max_iters", "1", *ONE_STEP, *more,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """The first 60 GSM8K train records (real math text shipped in data/)."""
    path = tmp_path_factory.mktemp("corpus") / "gsm8k-60.jsonl"
    path.write_text("\n".join((ROOT / "data" / "gsm8k" / "train.jsonl").read_text().splitlines()[:60]) + "\n")
    return path


def trained_steps(out_dir: Path) -> int:
    return json.loads((out_dir / "final" / "train_state.json").read_text())["step_count"]


# The student's block size and the data's blocks


def test_data_of_another_length_names_both_fixes_and_each_works(tmp_path, corpus, capsys):
    """`make demo-cpu`'s recipe (a 128-token student) on data prepared at 256 tokens."""
    prepare = ["prepare", "--student", TINYLLAMA, "--teacher", QWEN, "--input", corpus]
    prepare += ["--text_key", "question,answer", "--num_workers", "1"]
    runs(capsys, *prepare, "--output", tmp_path / "data-256", "--max_seq_length", "256")
    demo = ["pretrain", "--config", "demo-cpu", "--eval.max_iters", "1", "--train.global_batch_size", "8"]
    message = refusal(capsys, *demo, "--data.path", tmp_path / "data-256", "--out_dir", tmp_path / "a")
    assert "holds blocks of 256 tokens" in message and "the student's block size is 128" in message

    train_at_256 = options(fix(message, "train with"))
    assert "--model_config.block_size" in train_at_256
    runs(capsys, *demo, "--data.path", tmp_path / "data-256", "--out_dir", tmp_path / "a", "--train.max_tokens", "2048",
         *train_at_256)  # fmt: skip
    assert trained_steps(tmp_path / "a") == 1

    prepare_again = options(fix(message, "prepare it again"))
    runs(capsys, *prepare, "--output", tmp_path / "data-128", *prepare_again)
    runs(capsys, *demo, "--data.path", tmp_path / "data-128", "--out_dir", tmp_path / "b", "--train.max_tokens", "1024")
    assert trained_steps(tmp_path / "b") == 1


def test_a_sequence_longer_than_the_block_size_names_both_fixes_and_each_works(capsys):
    plan = ["plan", "--config", "demo-cpu", "--devices", "1"]
    message = refusal(capsys, *plan, "--train.max_seq_length", "256")
    assert message.startswith("--train.max_seq_length 256 is longer than the student's block size 128")
    for marker in ("--model_config.block_size", "or less"):
        out = runs(capsys, *plan, "--train.max_seq_length", "256", *options(fix(message, marker)))
        assert "Largest micro-batch that fits" in out


def test_a_teacher_block_shorter_than_the_windows_is_refused_and_preparing_within_it_works(tmp_path, corpus, capsys):
    data = prepare_pair(tmp_path / "data", corpus, TINYLLAMA, MISTRAL)
    teacher = make_checkpoint(tmp_path / "teacher", tiny_config("t", 32000, block_size=48), MISTRAL)
    message = refusal(capsys, *pretrain(data, tmp_path / "a", "--teacher.checkpoint_dir", teacher))
    assert "has a block size of 48 tokens" in message
    shorter = options(fix(message, "--teacher_max_length"))
    prepare = ["prepare", "--student", TINYLLAMA, "--teacher", MISTRAL, "--input", corpus, "--num_workers", "1"]
    runs(capsys, *prepare, "--text_key", "question,answer", "--max_seq_length", "64", "--output", tmp_path / "short",
         *shorter)  # fmt: skip
    runs(capsys, *pretrain(tmp_path / "short", tmp_path / "a", "--teacher.checkpoint_dir", teacher))
    assert trained_steps(tmp_path / "a") == 1


# Teachers


def hugging_face_checkpoint(folder: Path) -> Path:
    """A Hugging Face checkpoint as `litgpt download --convert_checkpoint false` leaves one: Pythia-14M's weights
    under their Hugging Face names (drawn at random) and GPT-NeoX's tokenizer, in a folder named after the model."""
    from litgpt.scripts.convert_lit_checkpoint import copy_weights_gpt_neox

    folder.mkdir(parents=True)
    config = Config.from_name("pythia-14m")
    torch.manual_seed(0)
    hf_weights = {}
    copy_weights_gpt_neox(config, hf_weights, GPT(config).state_dict())
    torch.save(hf_weights, folder / "pytorch_model.bin")
    tokenizer = TOKENIZERS / "gpt-neox-20b-pii"
    (folder / "tokenizer.json").write_bytes(gzip.decompress((tokenizer / "tokenizer.json.gz").read_bytes()))
    shutil.copy(tokenizer / "tokenizer_config.json", folder)
    return folder


def test_a_teacher_without_litgpt_weights_is_converted_as_advised(tmp_path, corpus, capsys):
    teacher = hugging_face_checkpoint(tmp_path / "checkpoints" / "EleutherAI" / "pythia-14m")
    data = prepare_pair(tmp_path / "data", corpus, TINYLLAMA, teacher)
    train = pretrain(data, tmp_path / "out", "--teacher.checkpoint_dir", teacher)
    message = refusal(capsys, *train)
    assert "lacks ['lit_model.pth', 'model_config.yaml']" in message
    runs(capsys, *command(message))
    runs(capsys, *train)
    assert trained_steps(tmp_path / "out") == 1


def test_a_teacher_of_other_data_is_one_line_and_preparing_with_it_works(
    tmp_path, corpus, tinyllama_mistral_data, llemma_teacher, capsys
):
    message = refusal(
        capsys, *pretrain(tinyllama_mistral_data, tmp_path / "a", "--teacher.checkpoint_dir", llemma_teacher)
    )
    recorded = json.loads((tinyllama_mistral_data / "manifest.json").read_text())["teacher"]
    assert str(llemma_teacher) in message and recorded["path"] in message and recorded["sha256"] in message
    prepare = command(fix(message, "vocagnolm prepare"))
    assert prepare == ["prepare", "--teacher", str(llemma_teacher)]
    runs(capsys, *prepare, "--student", TINYLLAMA, "--input", corpus, "--text_key", "question,answer",
         "--max_seq_length", "64", "--num_workers", "1", "--output", tmp_path / "data")  # fmt: skip
    runs(capsys, *pretrain(tmp_path / "data", tmp_path / "a", "--teacher.checkpoint_dir", llemma_teacher))
    assert trained_steps(tmp_path / "a") == 1


def test_a_same_vocabulary_method_with_another_vocabulary_names_the_method_that_works(
    tmp_path, tinyllama_mistral_data, mistral_teacher, capsys
):
    train = pretrain(tinyllama_mistral_data, tmp_path / "a", "--teacher.checkpoint_dir", mistral_teacher)
    message = refusal(capsys, *train, "--guidance.method", "kld")
    runs(capsys, *train, "--guidance.method", "kld", *options(fix(message, "Use --guidance.method")))
    assert trained_steps(tmp_path / "a") == 1


def test_a_teacher_cache_not_yet_scored_is_scored_as_advised_and_its_precision_named(
    tmp_path, corpus, mistral_teacher, capsys
):
    (tmp_path / "20.jsonl").write_text("".join(corpus.read_text().splitlines(keepends=True)[:20]))
    data, cache = prepare_pair(tmp_path / "data", tmp_path / "20.jsonl", TINYLLAMA, MISTRAL), tmp_path / "cache"
    train = pretrain(data, tmp_path / "a", "--teacher.cache", cache)
    message = refusal(capsys, *train)
    assert "is not a teacher loss cache" in message
    runs(capsys, *command(message, DIR=data, CHECKPOINT_DIR=mistral_teacher, CACHE=cache))
    message = refusal(capsys, *train, "--teacher.precision", "bf16-true")
    assert "was scored in 32-true, --teacher.precision is bf16-true" in message
    runs(capsys, *train, "--teacher.precision", "bf16-true", *options(fix(message, "Train with")))
    assert trained_steps(tmp_path / "a") == 1


# A run's out_dir and checkpoints


@pytest.fixture
def one_step(tmp_path, tinyllama_mistral_data, mistral_teacher) -> list[str | Path]:
    """A one-step run into tmp_path / "out", as typed: it saves step-00000001 and final."""
    train = pretrain(tinyllama_mistral_data, tmp_path / "out", "--teacher.checkpoint_dir", mistral_teacher)
    return [*train, "--train.save_interval", "1"]


def test_an_out_dir_with_checkpoints_continues_or_starts_afresh_as_advised(tmp_path, one_step, capsys):
    runs(capsys, *one_step)
    message = refusal(capsys, *one_step)
    assert "holds a previous run's checkpoints" in message

    finished = refusal(capsys, *one_step, *options(fix(message, "--resume")))
    assert "holds a finished run, trained to step 1" in finished
    runs(capsys, *one_step, *options(fix(message, "--resume")), *options(fix(finished, "one more")))
    assert trained_steps(tmp_path / "out") == 2

    runs(capsys, *one_step, *options(fix(message, "--overwrite")))
    assert trained_steps(tmp_path / "out") == 1


def test_a_training_checkpoint_where_weights_are_due_is_exported_as_advised(tmp_path, one_step, capsys):
    runs(capsys, *one_step)
    step = tmp_path / "out" / "step-00000001"
    message = refusal(capsys, *one_step, "--out_dir", tmp_path / "b", "--initial_checkpoint_dir", step)
    assert "is a training checkpoint" in message
    runs(capsys, *command(message, DIR=tmp_path / "exported"))
    runs(capsys, *one_step, "--out_dir", tmp_path / "b", "--initial_checkpoint_dir", tmp_path / "exported")
    assert trained_steps(tmp_path / "b") == 1

    both = ["--resume", step, "--initial_checkpoint_dir", tmp_path / "exported"]
    message = refusal(capsys, *one_step, "--out_dir", tmp_path / "c", *both)
    runs(capsys, *one_step, "--out_dir", tmp_path / "c", *both, *options(fix(message, "--resume auto")))
    assert trained_steps(tmp_path / "c") == 1


# Names


def test_an_unknown_name_points_to_the_list_of_names(capsys):
    message = refusal(capsys, "pretrain", "--model_name", "tiny-lama-1.1b")
    assert "tiny-llama-1.1b" in runs(capsys, *command(message)).split()
    message = refusal(capsys, "plan", "--config", "demo-cpus", "--devices", "1")
    assert "demo-cpu" in runs(capsys, *command(message))
