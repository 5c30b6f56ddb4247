"""A full disk in one line (`errors.disk_full`): each command that writes stops on ENOSPC naming the folder, what it
needed and what a rerun continues from, with what it wrote earlier intact. The disk is real: a small tmpfs."""

import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Iterator

import lightning as L
import pytest
import torch
from conftest import BIN, MISTRAL, ROOT, TINYLLAMA, tiny_config
from test_recipe import recipe_config

from litgpt_vocagnolm.data.prepare import prepare
from litgpt_vocagnolm.errors import DiskFull
from litgpt_vocagnolm.models import gpt
from litgpt_vocagnolm.training.checkpoints import Checkpointer, tensor_bytes, verify_checkpoint
from litgpt_vocagnolm.training.export import export
from litgpt_vocagnolm.training.score_teacher import score_teacher


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Path]:
    """A folder on a file system of its own, of 64 kB (`resize` it). Mounting needs root: skipped where it is refused,
    but not under CI=true."""
    folder = tmp_path / "disk"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        if os.environ.get("CI") == "true":
            pytest.fail(f"mount -t tmpfs failed: {mounted.stderr.decode()}")
        pytest.skip("this user may not mount a tmpfs")
    yield folder
    subprocess.run(["umount", "--lazy", str(folder)], check=True)


def resize(disk: Path, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(disk)], check=True)


def leave_free(disk: Path, free: int) -> None:
    """Fills `disk` until `free` bytes are left."""
    (disk / "filler").unlink(missing_ok=True)
    (disk / "filler").write_bytes(bytes(shutil.disk_usage(disk).free - free))


def full_disk(folder: Path, then: str, needed: str = "") -> str:
    """The one line, its figures as patterns; `needed`: what it says the writing needed, where known."""
    need = rf" needs {re.escape(needed)} and" if needed else ""
    free = r" its file system has [\d.]+ [MG]B free\. Make room there \(or choose another folder\), then "
    return rf"^No space left on device: writing into {re.escape(str(folder))}{need}{free}{then}\.$"


def test_prepare_and_score_teacher_on_a_full_disk_say_so_and_the_next_run_finishes(
    small_disk, gsm8k_sample, tinyllama_mistral_data, mistral_teacher
):
    output = small_disk / "data"
    args = dict(student=TINYLLAMA, teacher=MISTRAL, input=[gsm8k_sample], output=output, text_key="question,answer")
    with pytest.raises(
        DiskFull, match=full_disk(output, "run the same command again: it keeps what .* holds of the finished splits")
    ):
        prepare(**args)
    resize(small_disk, "32m")
    prepare(**args)
    manifest = json.loads((output / "manifest.json").read_text())
    assert sum(split["documents"] for split in manifest["splits"].values()) == 240  # every record of the sample

    # Shards of 64 blocks (about 10 kB of losses): the disk fills within the first two, and the rerun scores the
    # others, where one shard of the whole split would be scored twice.
    cache = small_disk / "cache"
    score = dict(data=tinyllama_mistral_data, teacher=mistral_teacher, output=cache, blocks_per_shard=64)
    leave_free(small_disk, 16 * 1024)
    rerun = "run the same command again: it scores only the missing shards"
    manifest = json.loads((tinyllama_mistral_data / "manifest.json").read_text())
    needed = 2 * sum(split["teacher_tokens"] for split in manifest["splits"].values()) / 1e6  # float16 losses
    with pytest.raises(DiskFull, match=full_disk(cache, rerun, f"{needed:.1f} MB")):
        score_teacher(**score)
    (small_disk / "filler").unlink()
    score_teacher(**score)
    assert (cache / "manifest.json").is_file()


def test_a_full_disk_at_each_save_and_at_export_says_so_and_damages_nothing(small_disk, capfd):
    resize(small_disk, "64m")
    fabric = L.Fabric(accelerator="cpu", devices=1)
    model = gpt.GPT(tiny_config("student", 32000, n_embd=8, block_size=64))
    weights = tensor_bytes(model.state_dict())
    out_dir = small_disk / "out"

    leave_free(small_disk, 3 * weights)  # before the first step, AdamW's moments are counted too
    state = {"model": model, "optimizer": torch.optim.AdamW(model.parameters()), "iter_num": 0, "step_count": 0}
    with pytest.raises(DiskFull, match=r"^Saving .*final needs .*: make room there .*, then run again with --resume"):
        Checkpointer(fabric, state | {"position": 0}, out_dir, TINYLLAMA, hparams={}).check_room()

    (small_disk / "filler").unlink()
    tokens = torch.randint(0, 32000, (1, 8))
    model(tokens, targets=tokens).sum().backward()
    state["optimizer"].step()
    state |= {"iter_num": 1, "step_count": 1, "position": 2}
    checkpointer = Checkpointer(fabric, state, out_dir, TINYLLAMA, hparams={})
    first = checkpointer.save(1)
    continues = "run again with --resume auto: it continues from step-00000001"

    # Room for the tensors the check before a save counts, not for them and the tokenizer's files beside them.
    leave_free(small_disk, 3 * weights + 64 * 1024)
    shards = f"{3 * weights / 1e6:.1f} MB"  # the weights and AdamW's two moments
    with pytest.raises(DiskFull, match=full_disk(out_dir, continues, shards)):
        checkpointer.save(2)  # the shards' writer fails: torch.distributed.checkpoint's CheckpointException
    capfd.readouterr()
    checkpointer.save(3, blocking=False)
    with pytest.raises(DiskFull, match=full_disk(out_dir, continues, shards)):
        checkpointer.finish()  # the background save fails
    assert "Traceback" not in capfd.readouterr().err  # nor do its writer threads print theirs
    leave_free(small_disk, 4 * weights + 64 * 1024)  # the shards fit, not lit_model.pth
    with pytest.raises(DiskFull, match=full_disk(out_dir, continues, f"{4 * weights / 1e6:.1f} MB")):
        checkpointer.save_final()
    assert sorted(p.name for p in out_dir.iterdir()) == ["step-00000001"]
    verify_checkpoint(first)

    exported = small_disk / "exported"
    leave_free(small_disk, weights // 2)
    with pytest.raises(DiskFull, match=full_disk(exported, "run the same command again", f"{weights / 1e6:.1f} MB")):
        export(first, exported)
    assert list(exported.iterdir()) == []  # the rerun finds the folder as this one did
    (small_disk / "filler").unlink()
    export(first, exported)
    saved = torch.load(exported / "lit_model.pth", weights_only=True)["model"]
    assert all(torch.equal(saved[name], tensor) for name, tensor in model.state_dict().items())


def test_a_full_disk_that_only_rank_0_meets_in_the_final_save_ends_every_rank_in_one_line(
    small_disk, tmp_path, tinyllama_mistral_data
):
    """Two processes (gloo); the disk has room for what the final save counts, not for the tokenizer files beside it:
    rank 0, which alone writes lit_model.pth, meets the full disk, and rank 1, waiting for its checksums, stops too
    with the same line at once: not at the process group's timeout (30 minutes), nor with gloo's traceback of a
    connection closed by its peer."""
    resize(small_disk, "64m")
    weights = tensor_bytes(gpt.GPT(tiny_config("student", 32000, block_size=64)).state_dict())  # as student.json
    leave_free(small_disk, 4 * weights + 256 * 1024)  # the weights, AdamW's two moments and lit_model.pth: 4x
    out_dir = small_disk / "out"
    config = recipe_config(tmp_path, tinyllama_mistral_data, None, guidance={"method": "ce"}, devices=2)
    command = [str(BIN / "litgpt"), "pretrain", "--recipe", "vocagnolm", "--config", str(config)]
    command += ["--out_dir", str(out_dir), "--train.micro_batch_size", "1", "--train.global_batch_size", "2"]
    command += ["--train.max_tokens", str(2 * 2 * 64), "--train.save_interval", "1000"]
    run = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = run.communicate(timeout=600)  # far below the process group's timeout
    finally:
        os.killpg(run.pid, signal.SIGKILL)  # whatever rank is left, if one waits still
    assert run.returncode == 1, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    prog = "litgpt pretrain --recipe vocagnolm: error: "
    errors = [line.removeprefix(prog) for line in err.splitlines() if line.startswith(prog)]
    assert len(errors) == 2 and errors[0] == errors[1], err[-3000:]  # one line from each rank, the same
    needed = f"{4 * weights / 1e6:.1f} MB"
    assert re.match(full_disk(out_dir, "run again with --resume auto: it starts afresh", needed), errors[0])
    assert not (out_dir / "final").exists() and not (out_dir / ".partial-final").exists()
