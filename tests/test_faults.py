"""Faults and first contacts, each one line before any model is built where the input allows, with nothing lost: a
save the file system refuses (a file past `ulimit -f`, a read-only or failing disk, a spent quota), records whose
numbers were edited by hand, out-of-range seeds, names too long, folders that mislead."""

import errno
import os
import resource
import subprocess

import lightning as L
import pytest
import torch
from conftest import BIN, ROOT, TINYLLAMA, tiny_config
from test_disk_full import resize, small_disk  # noqa: F401 (a fixture)
from test_recipe import recipe_config

from litgpt_vocagnolm.errors import WriteFailed
from litgpt_vocagnolm.models import gpt
from litgpt_vocagnolm.training.checkpoints import Checkpointer, verify_checkpoint

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
