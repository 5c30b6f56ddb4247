"""Faults and first contacts, each one line before any model is built where the input allows, with nothing lost: a
save the file system refuses (a file past `ulimit -f`, a read-only or failing disk, a spent quota), records whose
numbers were edited by hand, out-of-range seeds, names too long, folders that mislead."""

import errno
import json
import os
import re
import resource
import shlex
import shutil
import subprocess
from pathlib import Path

import lightning as L
import pytest
import torch
from conftest import BIN, MISTRAL, ROOT, TINYLLAMA, tiny_config
from litgpt.args import TrainArgs
from test_checkpoints import setup_args
from test_disk_full import resize, small_disk  # noqa: F401 (a fixture)
from test_docs import Parsed, parse_only  # noqa: F401 (a fixture)
from test_recipe import recipe_config
from test_user_errors_training import demo_cpu_data  # noqa: F401 (a fixture)

import litgpt_vocagnolm.training.recipe as recipe
from litgpt_vocagnolm import files
from litgpt_vocagnolm.cli import main
from litgpt_vocagnolm.data.prepare import prepare
from litgpt_vocagnolm.data.prepared import VocAgnoData
from litgpt_vocagnolm.errors import InvalidArgument, PathMissing, PathTaken, WriteFailed
from litgpt_vocagnolm.files import file_sha256
from litgpt_vocagnolm.models import gpt
from litgpt_vocagnolm.models.weights import UnreadableCheckpoint
from litgpt_vocagnolm.training.checkpoints import Checkpointer, verify_checkpoint
from litgpt_vocagnolm.training.checks import check_out_dir_apart, check_seed
from litgpt_vocagnolm.training.recipe import setup
from litgpt_vocagnolm.training.teacher import TeacherArgs
from litgpt_vocagnolm.training.train_state import check_train_state

CONTINUES = "then run again with --resume auto: it continues from step-00000001."


def trained_checkpointer(out_dir) -> Checkpointer:
    """A checkpointer over a tiny student after one AdamW step, which has saved step-00000001 in `out_dir`."""
    model = gpt.GPT(tiny_config("student", 32000, n_embd=8, block_size=64))
    tokens = torch.randint(0, 32000, (1, 8))
    model(tokens, targets=tokens).sum().backward()
    optimizer = torch.optim.AdamW(model.parameters())
    optimizer.step()
    state = {"model": model, "optimizer": optimizer, "iter_num": 1, "step_count": 1, "position": 2}
    checkpointer = Checkpointer(L.Fabric(accelerator="cpu", devices=1), state, out_dir, TINYLLAMA, hparams={})
    checkpointer.save(1)
    return checkpointer


@pytest.mark.parametrize(
    "number, says",
    [
        pytest.param(
            errno.EIO,
            "Input/output error (EIO): writing into {out}, the disk or the network file system under it failed."
            " Check it (the node's `dmesg`, the cluster's status) or choose another folder, ",
            id="EIO",
        ),
        pytest.param(
            errno.EDQUOT,
            "Disk quota exceeded: writing into {out} needs 6.2 MB and this user's quota there is spent. Make"
            " room within it (or choose another folder), ",
            id="EDQUOT",
        ),
        pytest.param(
            errno.EACCES,
            "Permission denied (EACCES): writing into {out}, this user may not write there. Give it the"
            " right to (or choose another folder), ",
            id="EACCES",
        ),
        pytest.param(
            errno.EFBIG,
            "File too large (EFBIG): writing into {out}, a file outgrew the largest its file system takes."
            " Choose a folder on another file system, ",
            id="EFBIG",
        ),
    ],
)
def test_a_save_the_file_system_refuses_says_why_in_one_line_and_keeps_the_last_checkpoint(
    tmp_path, monkeypatch, capfd, number, says
):
    """The failure where a file system reports it last: at the fsync of each shard, in DCP's writer threads too
    (whose failures DCP itself drops). Before: a traceback for all but a full disk, the unfinished step left."""
    out_dir = tmp_path / "out"
    checkpointer = trained_checkpointer(out_dir)

    def refused(fd: int) -> None:
        raise OSError(number, os.strerror(number))

    monkeypatch.setattr(os, "fsync", refused)
    capfd.readouterr()
    for blocking in (True, False):
        with pytest.raises(WriteFailed) as error:
            checkpointer.save(2, blocking=blocking)
            checkpointer.finish()  # a background save fails here
        assert str(error.value) == says.format(out=out_dir) + CONTINUES
        assert sorted(p.name for p in out_dir.iterdir()) == ["step-00000001"]  # the unfinished step removed
    assert "Traceback" not in capfd.readouterr().err  # nor do DCP's writer threads print theirs
    verify_checkpoint(out_dir / "step-00000001")
    monkeypatch.undo()  # the file system mended: the run goes on
    checkpointer.save(3)
    verify_checkpoint(out_dir / "step-00000003")


def test_a_save_into_a_file_system_remounted_read_only_says_so(small_disk):  # noqa: F811 (the fixture)
    resize(small_disk, "64m")
    out_dir = small_disk / "out"
    checkpointer = trained_checkpointer(out_dir)
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    with pytest.raises(WriteFailed) as error:
        checkpointer.save(2)
    assert str(error.value) == (
        f"Read-only file system (EROFS): writing into {out_dir} ({out_dir / '.partial-step-00000002'}), its file system"
        " is read-only (mounted so, or remounted after a disk error). Have it made writable (or choose another"
        f" folder), {CONTINUES}"
    )
    subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=True)
    assert sorted(p.name for p in out_dir.iterdir()) == ["step-00000001"]
    checkpointer.save(2)
    verify_checkpoint(out_dir / "step-00000002")


def test_a_run_under_ulimit_f_ends_in_one_line_and_leaves_no_unfinished_step(tmp_path, tinyllama_mistral_data):
    """`ulimit -f` caps every file of the process: Python ignores SIGXFSZ, so a write past the cap fails with EFBIG.
    Before: a 243-line torch RuntimeError, and `.partial-step-*` left behind. Each shard of the tiny student's first
    checkpoint is over 4 MB; its tokenizer.json (1.8 MB) and logs are not."""
    config = recipe_config(tmp_path, tinyllama_mistral_data, None, guidance={"method": "ce"})
    out_dir = tmp_path / "out"
    limit = 4_000_000

    def capped() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    command = [str(BIN / "vocagnolm"), "pretrain", "--config", str(config), "--train.save_interval", "1"]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, preexec_fn=capped)
    assert run.returncode == 1, run.stderr[-3000:]
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    (line,) = [line for line in run.stderr.splitlines() if line.startswith("vocagnolm pretrain: error: ")]
    assert line == (
        f"vocagnolm pretrain: error: File too large (EFBIG): writing into {out_dir}, a file outgrew this process's"
        " limit of 4.0 MB per file (`ulimit -f`, set by the shell or job that started it). Lift the limit (`ulimit -f"
        " unlimited` before the command), then run again with --resume auto: it starts afresh."
    )
    assert not [p.name for p in out_dir.iterdir() if p.name.startswith((".partial-", "step-", "final"))]


# Records edited by hand


@pytest.fixture(scope="module")
def one_step_run(tmp_path_factory, tinyllama_mistral_data) -> Path:
    """A finished one-step `ce` run of 2 blocks a step: its out_dir (step-00000001/ and final/)."""
    tmp_path = tmp_path_factory.mktemp("run")
    train = TrainArgs(
        global_batch_size=2, micro_batch_size=2, max_tokens=2 * 64, max_norm=1.0, max_seq_length=64, save_interval=1
    )
    setup(**setup_args(tmp_path, tinyllama_mistral_data, train=train))
    return tmp_path / "out"


def edited_manifest(tmp_path: Path, data: Path, edit) -> Path:
    """A copy of the prepared `data` whose manifest `edit` changed, as a hand does."""
    copy = shutil.copytree(data, tmp_path / "edited")
    manifest = json.loads((copy / "manifest.json").read_text())
    edit(manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def more_blocks(manifest: dict) -> None:
    manifest["splits"]["train"]["blocks"] += 10


def more_blocks_and_padding(manifest: dict) -> None:  # the sums made to agree: only the index tells
    manifest["splits"]["train"]["blocks"] += 10
    manifest["splits"]["train"]["padding"] += 10 * manifest["block_size"]


@pytest.mark.parametrize(
    "edit, says",
    [
        (
            more_blocks,
            r"manifest.json: splits.train.blocks is {blocks}, where `vocagnolm prepare` writes the blocks of 65 tokens"
            r" that its [\d,]+ student tokens and [\d,]+ of padding fill, {true}: the manifest was edited or damaged\.",
        ),
        (
            more_blocks_and_padding,
            r"manifest.json records {blocks} train blocks, and .*train/index.json lists {true}: the manifest was",
        ),
        (
            lambda manifest: manifest.update(max_seq_length=-1),
            r"manifest.json: max_seq_length is -1, where `vocagnolm prepare` writes a whole number of at least 1:",
        ),
        (
            lambda manifest: manifest.update(mapped_share=1.5),
            r"manifest.json: mapped_share is 1.5, where `vocagnolm prepare` writes a share between 0 and 1:",
        ),
    ],
    ids=["blocks", "blocks and padding", "max_seq_length", "mapped_share"],
)
def test_a_manifest_edited_by_hand_is_refused_at_start(tmp_path, tinyllama_mistral_data, edit, says):
    """Before: a block count raised by hand was accepted, and step 1 raised IndexError reading past the blocks."""
    data = edited_manifest(tmp_path, tinyllama_mistral_data, edit)
    blocks = json.loads((tinyllama_mistral_data / "manifest.json").read_text())["splits"]["train"]["blocks"]
    with pytest.raises(InvalidArgument, match=says.format(blocks=blocks + 10, true=blocks)) as error:
        setup(**setup_args(tmp_path, data))
    assert str(error.value).endswith(
        f"Copy {data} again, whole, or prepare the data again: `vocagnolm prepare ... --output NEW_DIR`."
    )
    assert not (tmp_path / "out").exists()


def test_a_train_state_edited_with_its_checksum_is_refused_at_start(
    one_step_run, tinyllama_mistral_data, tmp_path, monkeypatch, capsys
):
    """Before: `position: -5`, its checksum updated to match, passed the checks and raised ValueError in data/order.py
    once the models were built."""
    out_dir = shutil.copytree(one_step_run, tmp_path / "out")
    step = out_dir / "step-00000001"
    train_state = json.loads((step / "train_state.json").read_text())
    (step / "train_state.json").write_text(json.dumps(train_state | {"position": -5}))
    sums = json.loads((step / "checksums.json").read_text())
    (step / "checksums.json").write_text(
        json.dumps(sums | {"train_state.json": file_sha256(step / "train_state.json")})
    )
    monkeypatch.setattr(recipe, "build_student", lambda *args: pytest.fail("a model was built"))
    train = TrainArgs(global_batch_size=2, micro_batch_size=2, max_tokens=4 * 64, max_norm=1.0, max_seq_length=64)
    with pytest.raises(UnreadableCheckpoint) as error:
        setup(**setup_args(tmp_path, tinyllama_mistral_data, train=train, resume=step))
    assert str(error.value) == f"--resume {str(step)!r} can't be resumed from: see the line above."
    assert f"Skipping {step}: {step / 'train_state.json'}: position is -5, where a run saves" in capsys.readouterr().out


@pytest.mark.parametrize(
    "change, says",
    [
        ({"position": -5}, "position is -5, where a run saves a whole number of at least 0"),
        (
            {"position": 6},
            "position is 6, where a run saves the blocks of its 1 steps of 2 (train.global_batch_size), 2",
        ),
        (
            {"iter_num": 0},
            "iter_num is 0, where a run saves at least step_count, 1 (a step is one micro-batch or more)",
        ),
        ({"step_count": 1.5}, "step_count is 1.5, where a run saves a whole number of at least 0"),
        ({"world_size": 0}, "world_size is 0, where a run saves a whole number of at least 1"),
        (
            {"train_dataloader": [None, None]},
            "train_dataloader is [None, None], where a run saves a list of one loader state per rank, 1",
        ),
    ],
)
def test_every_number_of_a_train_state_is_checked(tmp_path, change, says):
    train_state = {"iter_num": 1, "step_count": 1, "position": 2, "world_size": 1} | change
    with pytest.raises(UnreadableCheckpoint) as error:
        check_train_state(tmp_path, train_state, {"train": {"global_batch_size": 2}})
    assert str(error.value) == (
        f"{tmp_path / 'train_state.json'}: {says}: the file was edited or damaged. Resume from another checkpoint"
        " (--resume auto skips this one), or put back this one's file."
    )


# Numbers out of range, names too long


def typed(capsys, *argv: str | Path) -> tuple[int, str]:
    """`vocagnolm ARGV` in this process, as the console script runs it: its exit status and stderr."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main([str(arg) for arg in argv])
    return exit_.value.code, capsys.readouterr().err


def test_a_seed_lightning_would_refuse_is_refused_before_any_model(tmp_path, monkeypatch, capsys):
    """Before: `--seed=-1` passed the checks, built the student and teacher, then `seed_everything` raised."""
    monkeypatch.chdir(tmp_path)
    for seed in ("-1", str(2**32)):
        status, err = typed(capsys, "pretrain", "--config", "demo-cpu", f"--seed={seed}")
        assert (status, err) == (
            1,
            f"vocagnolm pretrain: error: --seed must lie between 0 and 4294967295 (2**32 - 1: NumPy's seeds, which"
            f" Lightning seeds from), got {seed}.\n",
        )
    check_seed(0)
    check_seed(2**32 - 1)  # the bounds are Lightning's own
    assert list(tmp_path.iterdir()) == []


def test_a_data_seed_below_0_is_refused_before_any_model(tmp_path, tinyllama_mistral_data):
    with pytest.raises(InvalidArgument, match=r"^--data.seed must be at least 0, got -1\.$"):
        setup(**setup_args(tmp_path, tinyllama_mistral_data) | {"data": VocAgnoData(tinyllama_mistral_data, seed=-1)})
    assert not (tmp_path / "out").exists()


def test_a_name_too_long_for_its_file_system_is_one_line(tmp_path, monkeypatch, capsys):
    """Before: `OSError: [Errno 36] File name too long` from `check_writable`, and from reading --data.path."""
    monkeypatch.chdir(tmp_path)
    name = "x" * 300
    status, err = typed(capsys, "pretrain", "--config", "demo-cpu", "--out_dir", f"runs/{name}")
    assert (status, err) == (
        1,
        f"vocagnolm pretrain: error: --out_dir {tmp_path / 'runs' / name}: the name {'x' * 40}... is 300 bytes long,"
        " and its file system takes at most 255. Give a shorter one.\n",
    )
    deep = tmp_path.joinpath(*["y" * 200] * 25)
    status, err = typed(
        capsys, "prepare", "--student", TINYLLAMA, "--teacher", TINYLLAMA, "--input", ".", "--output", deep
    )
    assert (status, err) == (
        1,
        f"vocagnolm prepare: error: --output {deep}: the path is {len(str(deep))} bytes long, and its file system takes"
        " fewer than 4096. Give a shorter one.\n",
    )
    with pytest.raises(PathMissing) as error:
        setup(**setup_args(tmp_path, tmp_path / name))
    assert str(error.value) == (
        f"No prepared data in {tmp_path / name}: the name {'x' * 40}... is 300 bytes long, and its file system takes at"
        " most 255. Give the folder `vocagnolm prepare` wrote."
    )
    assert list(tmp_path.iterdir()) == []


# Folders that mislead


def test_an_out_dir_in_the_prepared_data_is_refused_and_data_in_the_out_dir_is_not(tmp_path, tinyllama_mistral_data):
    """Before: accepted, and the run's checkpoints sat among the shards."""
    held = sorted(p.name for p in tinyllama_mistral_data.iterdir())
    for out_dir, where in ((tinyllama_mistral_data, "is"), (tinyllama_mistral_data / "train" / "run", "lies inside")):
        with pytest.raises(InvalidArgument) as error:
            setup(**setup_args(tmp_path, tinyllama_mistral_data, out_dir=out_dir))
        assert str(error.value) == (
            f"--out_dir {out_dir} {where} --data.path {tinyllama_mistral_data}: the run's checkpoints, logs and lock"
            " would sit among its shards. Give an --out_dir outside it, such as"
            f" {tinyllama_mistral_data.parent / 'tl-mistral-run'}."
        )
    assert sorted(p.name for p in tinyllama_mistral_data.iterdir()) == held
    data = shutil.copytree(tinyllama_mistral_data, tmp_path / "out" / "data")  # demo-cpu's layout
    check_out_dir_apart(tmp_path / "out", VocAgnoData(data), TeacherArgs())


def test_a_run_folder_given_as_data_is_named_with_the_data_it_trained_on(
    one_step_run, tinyllama_mistral_data, tmp_path
):
    """Before: "No prepared data in OUT. Make it with `vocagnolm prepare ... --output OUT`", which prepare refuses."""
    for given in (one_step_run, one_step_run / "step-00000001"):
        with pytest.raises(PathMissing) as error:
            setup(**setup_args(tmp_path, given))
        newest = (
            one_step_run / "final" / "hyperparameters.yaml" if given == one_step_run else given / "hyperparameters.yaml"
        )
        assert str(error.value) == (
            f"{given} is a training run's folder, not prepared data (no manifest.json): {newest} records that the run"
            f" trained on {tinyllama_mistral_data}: give that folder."
        )
    assert not (tmp_path / "out").exists()


def test_preparing_into_a_copy_of_prepared_data_compares_contents_not_paths(
    tmp_path, tinyllama_mistral_data, gsm8k_sample, capsys
):
    """The data, its tokenizers and its input copied elsewhere: the same data, nothing to do. Before: refused with
    "student: X there, Y now" for the tokenizer's path alone."""
    data = shutil.copytree(tinyllama_mistral_data, tmp_path / "data")
    student, teacher = shutil.copytree(TINYLLAMA, tmp_path / "student"), shutil.copytree(MISTRAL, tmp_path / "teacher")
    corpus = Path(shutil.copy(gsm8k_sample, tmp_path / "corpus.jsonl"))
    stamps = {p: p.stat().st_mtime_ns for p in data.rglob("*")}
    args = dict(student=student, teacher=teacher, input=[corpus], output=data, max_seq_length=64, num_workers=1)
    args |= dict(text_key="question,answer", val_fraction=0.1)
    prepare(**args)
    assert "nothing to do" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in data.rglob("*")} == stamps

    recorded = json.loads((data / "manifest.json").read_text())["settings"]
    with corpus.open("a") as f:
        f.write(json.dumps({"question": "1 + 1?", "answer": "2"}) + "\n")
    with pytest.raises(PathTaken) as error:
        prepare(**args | dict(student=teacher))
    assert str(error.value) == (
        f"--output {data} holds data prepared with other settings (student: {recorded['student']['path']} (sha256"
        f" {recorded['student']['sha256'][:12]}...) there, {teacher / 'tokenizer.json'} (sha256"
        f" {recorded['teacher']['sha256'][:12]}...) now; --input: {corpus} changed (bytes, sha256, recorded as"
        f" {recorded['input'][0]['path']})). Give another --output, or delete {data} to prepare it again."
    )
    assert {p: p.stat().st_mtime_ns for p in data.rglob("*")} == stamps


def test_the_demo_cpu_recipe_outside_a_clone_says_exactly_what_to_give(
    tmp_path,
    monkeypatch,
    capsys,
    request,
    demo_cpu_data,  # noqa: F811 (the fixture)
):
    """Before: "Tokenizer path 'tests/fixtures/tokenizers/tinyllama-1.1b' does not exist", naming neither
    --tokenizer_dir nor a way on. Now the line gives the commands that run it anywhere; they are followed as worded,
    the download stood in for by the tokenizer it fetches, the data by the GSM8K sample prepared at 128 tokens with it
    (the prepare command only parsed: all of GSM8K takes a while)."""
    monkeypatch.chdir(tmp_path)
    status, err = typed(capsys, "pretrain", "--config", "demo-cpu")
    student = "checkpoints/TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T"
    corpus = files.shipped("demo/data", "data") / "gsm8k" / "train.jsonl"
    assert (status, err) == (
        1,
        "vocagnolm pretrain: error: --tokenizer_dir tests/fixtures/tokenizers/tinyllama-1.1b is a folder of a clone of"
        f" litgpt-vocagnolm (demo-cpu names it from the clone's root), and the working folder, {tmp_path}, is not one."
        " Run it from a clone's root (`make demo-cpu` there prepares its data, then trains), or anywhere: 1) `litgpt"
        " download TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T --tokenizer_only true`; 2) `vocagnolm prepare"
        f" --student {student} --teacher {student} --input {corpus} --text_key question,answer --output"
        " out/demo-cpu/data --max_seq_length 128` (demo-cpu trains plain cross-entropy: its data's teacher is not"
        f" used); 3) this command with --tokenizer_dir {student}.\n",
    )
    assert corpus.is_file() and list(tmp_path.iterdir()) == []
    download, prepare_command = re.findall(r"`((?:litgpt download|vocagnolm prepare) [^`]+)`", err)
    assert shlex.split(download)[2] == "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T"
    (tmp_path / student).parent.mkdir(parents=True)
    (tmp_path / student).symlink_to(TINYLLAMA)  # what `litgpt download --tokenizer_only true` leaves there
    (tmp_path / "out" / "demo-cpu").mkdir(parents=True)
    (tmp_path / "out" / "demo-cpu" / "data").symlink_to(demo_cpu_data)
    monkeypatch.setattr(recipe, "fit", lambda *args: None)  # the steps are another test's
    main(["pretrain", "--config", "demo-cpu", "--tokenizer_dir", student])
    assert (tmp_path / "out" / "demo-cpu" / "final" / "lit_model.pth").is_file()
    request.getfixturevalue("parse_only")  # the prepare command as worded: its own parser takes it
    with pytest.raises(Parsed):
        main(shlex.split(prepare_command)[1:])
