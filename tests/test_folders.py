"""One command per folder (`files.hold_folder`): two commands started into one folder at once, the second refused in
one line naming the first, which finishes; a holder killed with kill -9 blocks nothing."""

import errno
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
import torch
from conftest import BIN, MISTRAL, ROOT, TINYLLAMA, tiny_config, typed_here
from test_recipe import pretrain_here, recipe_config
from test_user_errors import assert_one_line

from litgpt_vocagnolm.data.prepare import prepare
from litgpt_vocagnolm.data.teacher_cache import check_cache
from litgpt_vocagnolm.errors import FolderInUse
from litgpt_vocagnolm.files import LOCK, hold_folder, read_holder
from litgpt_vocagnolm.models import gpt
from litgpt_vocagnolm.training.checkpoints import Checkpointer, verify_checkpoint
from litgpt_vocagnolm.training.export import export
from litgpt_vocagnolm.training.score_teacher import score_teacher

ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}


def start_holding(command: list[str], folder: Path, log: Path) -> subprocess.Popen:
    """Starts `command` (in a session of its own, with whatever it forks) and pauses it (SIGSTOP) as soon as it holds
    `folder`: a second command started now meets it there, however fast the first would have finished."""
    with open(log, "w") as f:
        process = subprocess.Popen(
            command, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=ONE_THREAD, start_new_session=True
        )
    deadline = time.monotonic() + 600  # a bound on a wait, not a timing that is asserted
    while read_holder(folder / LOCK).get("pid") != process.pid:
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.001)
    process.send_signal(signal.SIGSTOP)
    assert read_holder(folder / LOCK).get("pid") == process.pid, "it finished before it could be paused"
    return process


def resume(process: subprocess.Popen, log: Path) -> None:
    process.send_signal(signal.SIGCONT)
    assert process.wait(timeout=600) == 0, log.read_text()[-3000:]


def refusal(folder: Path, command: str, pid: int) -> str:
    return f"{folder} is in use by `{command}` (pid {pid} on "


def test_a_second_prepare_is_refused_and_a_killed_ones_folder_is_finished_by_the_next(tmp_path, gsm8k_sample):
    output = tmp_path / "data"
    command = [str(BIN / "vocagnolm"), "prepare", "--student", str(TINYLLAMA), "--teacher", str(MISTRAL)]
    command += ["--input", str(gsm8k_sample), "--output", str(output), "--text_key", "question,answer"]
    first = start_holding(command, output, tmp_path / "first.log")
    try:
        second = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=ONE_THREAD, timeout=600)
        assert_one_line(second, "vocagnolm prepare", refusal(output.absolute(), "vocagnolm prepare", first.pid))
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # kill -9, its LitData workers with it
        first.wait()
    assert not (output / "manifest.json").exists()

    prepare(student=TINYLLAMA, teacher=MISTRAL, input=[gsm8k_sample], output=output, text_key="question,answer")
    manifest = json.loads((output / "manifest.json").read_text())
    assert sum(split["documents"] for split in manifest["splits"].values()) == 240  # every record of the sample
    assert sorted(p.name for p in output.iterdir()) == ["manifest.json", "train", "val"]


def test_a_second_score_teacher_is_refused_and_the_first_finishes(tmp_path, cached_split):
    data = cached_split.data  # 38 blocks: the first command has little to score once it goes on
    output, log = tmp_path / "cache", tmp_path / "first.log"
    command = [str(BIN / "vocagnolm"), "score-teacher", "--data", str(data)]
    command += ["--teacher", str(cached_split.teacher), "--output", str(output)]
    first = start_holding(command, output, log)
    try:
        with pytest.raises(
            FolderInUse, match=re.escape(refusal(output.absolute(), "vocagnolm score-teacher", first.pid))
        ):
            score_teacher(data=data, teacher=cached_split.teacher, output=output)
    finally:
        resume(first, log)
    check_cache(output, data / "manifest.json", None)  # every shard there, at its recorded size
    assert not (output / LOCK).exists()


def test_a_second_run_and_a_second_export_are_refused_and_a_killed_runs_folder_is_taken_by_the_next(
    tmp_path, tinyllama_mistral_data
):
    """The first of each pair is a command of its own, which holds the folder; the second, and the run after the
    first is killed, run in this process."""
    out_dir = tmp_path / "out"
    config = recipe_config(tmp_path, tinyllama_mistral_data, None, guidance={"method": "ce"})
    command = [str(BIN / "litgpt"), "pretrain", "--recipe", "vocagnolm", "--config", str(config)]
    first = start_holding(command, out_dir, tmp_path / "first.log")
    try:  # a requeued or resubmitted job's command: --resume auto
        second = typed_here(*command, "--resume", "auto")
        message = refusal(out_dir.absolute(), "litgpt pretrain --recipe vocagnolm", first.pid)
        assert_one_line(second, "litgpt pretrain --recipe vocagnolm", message)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    budget = ["--train.max_tokens", str(2 * 4 * 64), "--train.save_interval", "null"]
    pretrain_here(config, "--resume", "auto", *budget)  # not blocked by the killed run
    verify_checkpoint(out_dir / "final")

    exported, log = tmp_path / "exported", tmp_path / "export.log"
    command = [str(BIN / "vocagnolm"), "export", str(out_dir / "final"), str(exported)]
    first = start_holding(command, exported, log)
    try:
        with pytest.raises(FolderInUse, match=re.escape(refusal(exported.absolute(), "vocagnolm export", first.pid))):
            export(out_dir / "final", exported)
    finally:
        resume(first, log)
    weights = torch.load(exported / "lit_model.pth", weights_only=True)["model"]
    final = torch.load(out_dir / "final" / "lit_model.pth", weights_only=True)["model"]
    assert weights.keys() == final.keys() and all(torch.equal(weights[k], final[k]) for k in final)


def holding(folder: Path, command: str, env: dict[str, str] = ONE_THREAD) -> subprocess.Popen:
    """A process that holds `folder` for `command` (`hold_folder`) until it is killed."""
    code = "import sys, time\nfrom litgpt_vocagnolm.files import hold_folder\n"
    code += "with hold_folder(sys.argv[1], sys.argv[2]):\n    print('held', flush=True)\n    time.sleep(600)"
    process = subprocess.Popen(
        [sys.executable, "-c", code, str(folder), command], stdout=subprocess.PIPE, text=True, env=env
    )
    assert process.stdout.readline() == "held\n"
    return process


def test_a_requeued_slurm_job_takes_back_its_earlier_attempts_folder(tmp_path, monkeypatch):
    """A node lost keeps its lock on a shared file system until the server notices; the job's next attempt (the same
    SLURM_JOB_ID, a higher SLURM_RESTART_COUNT) takes the folder back. Any other command is refused."""
    folder = tmp_path / "out"
    # Its lock outlives it, as a lost node's does.
    earlier = holding(folder, "attempt 0", {**ONE_THREAD, "SLURM_JOB_ID": "1234"})
    try:
        monkeypatch.setenv("SLURM_JOB_ID", "1234")
        with pytest.raises(FolderInUse, match=r"in use by `attempt 0` \(pid \d+ on .*, Slurm job 1234, since "):
            with hold_folder(folder, "the same attempt"):
                pass
        monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
        with hold_folder(folder, "attempt 1"):
            assert read_holder(folder / LOCK)["command"] == "attempt 1"
    finally:
        earlier.kill()
        earlier.wait()


def test_a_file_system_without_locks_is_named_with_the_fix(tmp_path, monkeypatch):
    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")  # NFSv3 without lockd

    monkeypatch.setattr("fcntl.lockf", no_locks)
    with pytest.raises(FolderInUse, match="can't lock files \\(No locks available\\).* VOCAGNOLM_NO_LOCK=1"):
        with hold_folder(tmp_path, "vocagnolm prepare"):
            pass
    monkeypatch.setenv("VOCAGNOLM_NO_LOCK", "1")
    with hold_folder(tmp_path, "vocagnolm prepare"):
        assert read_holder(tmp_path / LOCK) == {}  # nobody recorded as holding it


def test_a_holder_killed_with_a_longer_record_leaves_no_tail_in_the_next_ones(tmp_path):
    """kill -9 leaves the lock file and its record; the next holder's shorter record replaces it whole, so that a
    command refused then names that holder, not "another command (pid ?)"."""
    folder = tmp_path / "out"
    killed = holding(folder, "vocagnolm score-teacher --data " + "d" * 200)
    killed.kill()
    killed.wait()
    holder = holding(folder, "vocagnolm prepare")
    try:
        assert read_holder(folder / LOCK)["command"] == "vocagnolm prepare"
        with pytest.raises(FolderInUse, match=re.escape(refusal(folder, "vocagnolm prepare", holder.pid))):
            with hold_folder(folder, "vocagnolm export"):
                pass
    finally:
        holder.kill()
        holder.wait()


def sharded_checkpoint(out_dir: Path, n_embd: int = 8) -> Path:
    """A step checkpoint of a tiny student (TinyLlama's vocabulary, 2 layers of width `n_embd`), as a run saves it."""
    model = gpt.GPT(tiny_config("student", 32000, n_layer=2, n_embd=n_embd, block_size=64))
    state = {"model": model, "optimizer": torch.optim.AdamW(model.parameters()), "iter_num": 2, "step_count": 1}
    fabric = L.Fabric(accelerator="cpu", devices=1)
    return Checkpointer(fabric, state | {"position": 4}, out_dir, TINYLLAMA, hparams={}).save(1)


@pytest.mark.parametrize(
    "command, lock",
    [("prepare", "link"), ("export", "link"), ("pretrain", "link"), ("prepare", "folder"), ("export", "dangling")],
)
def test_a_lock_that_is_a_link_or_a_folder_is_refused_naming_it_and_nothing_is_written_through_it(
    tmp_path, gsm8k_sample, tinyllama_mistral_data, command, lock
):
    """A user's own file that the lock links to is left as it was (the commands once wrote their record over its
    first bytes); the refusal names the lock and says to remove it. Each command runs in this process."""
    outside = tmp_path / "notes.txt"
    outside.write_text("a user's file outside the folder\n" * 10)
    folder = tmp_path / "folder"
    folder.mkdir()
    if lock == "folder":
        (folder / LOCK).mkdir()
    else:
        (folder / LOCK).symlink_to(outside if lock == "link" else tmp_path / "nowhere")
    vocagnolm, prog = [str(BIN / "vocagnolm"), command], f"vocagnolm {command}"
    if command == "prepare":
        args = [*vocagnolm, "--student", str(TINYLLAMA), "--teacher", str(MISTRAL), "--input", str(gsm8k_sample)]
        args += ["--output", str(folder), "--text_key", "question,answer"]
    elif command == "export":
        args = [*vocagnolm, str(sharded_checkpoint(tmp_path / "run")), str(folder)]
    else:
        config = recipe_config(tmp_path, tinyllama_mistral_data, None, guidance={"method": "ce"})
        args = [str(BIN / "litgpt"), "pretrain", "--recipe", "vocagnolm", "--config", str(config)]
        args, prog = [*args, "--out_dir", str(folder)], "litgpt pretrain --recipe vocagnolm"
    refused = typed_here(*args)
    assert_one_line(refused, prog, f"{folder / LOCK} is not a regular file (a link, a folder...)")
    assert f"Remove it (rm -r {folder / LOCK}), then run again." in refused.stderr
    assert outside.read_text() == "a user's file outside the folder\n" * 10
    assert not (tmp_path / "nowhere").exists()


def test_an_export_killed_while_it_writes_lit_model_is_finished_by_the_same_command(tmp_path):
    """kill -9 while lit_model.pth is half written (its student is 38M parameters: 152 MB to write); the same command
    run again (in this process) finishes, and what it writes is byte for byte what an export never interrupted
    writes."""
    checkpoint = sharded_checkpoint(tmp_path / "run", n_embd=512)
    exported = tmp_path / "exported"
    command = [str(BIN / "vocagnolm"), "export", str(checkpoint), str(exported)]
    killed = subprocess.Popen(command, cwd=ROOT, env=ONE_THREAD, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    partial = exported / ".partial-export" / "lit_model.pth"
    deadline = time.monotonic() + 600  # a bound on a wait, not a timing that is asserted
    while not partial.exists():
        assert killed.poll() is None and time.monotonic() < deadline, killed.stderr.read()
        time.sleep(0.001)
    killed.kill()
    killed.wait()
    assert not (exported / "lit_model.pth").exists(), "it finished before it could be killed"

    rerun = typed_here(*command)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    export(checkpoint, tmp_path / "uninterrupted")
    files = sorted(p.name for p in (tmp_path / "uninterrupted").iterdir())
    assert sorted(p.name for p in exported.iterdir()) == files  # nothing left of the killed one
    assert all((exported / name).read_bytes() == (tmp_path / "uninterrupted" / name).read_bytes() for name in files)
