"""User errors of `vocagnolm score-teacher`: every argument checked before anything is written, each message naming
this command's own option, sizes capped to what the data can use, a damaged cache never taken for a finished one."""

import json
import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import MISTRAL, make_checkpoint, tiny_config
from test_score_teacher import cache_bytes

import litgpt_vocagnolm.training.score_teacher as score_teacher_module
from litgpt_vocagnolm.data.prepared import iter_blocks
from litgpt_vocagnolm.data.teacher_cache import TeacherLossCache, file_record
from litgpt_vocagnolm.errors import InvalidArgument, NotFinite, UserError
from litgpt_vocagnolm.training.score_teacher import ScoringStopped, score_teacher
from litgpt_vocagnolm.training.teacher import teacher_token_loss


@pytest.mark.parametrize(
    "options, message",
    [
        ({"devices": 0}, "--devices must be 'auto' or a positive number of devices per node, got 0."),
        ({"devices": -2}, "--devices must be 'auto' or a positive number of devices per node, got -2."),
        ({"precision": "fp7"}, "--precision must be one of bf16-true, 16-true, 32-true, got 'fp7'."),
        ({"output": "a-file/cache"}, "--output {tmp_path}/a-file/cache: {tmp_path}/a-file is a file, not a folder."),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_written(
    tmp_path, tinyllama_mistral_data, mistral_teacher, options, message
):
    (tmp_path / "a-file").write_text("mine")
    output = tmp_path / options.pop("output", "cache")
    with pytest.raises(UserError) as error:
        score_teacher(data=tinyllama_mistral_data, teacher=mistral_teacher, output=output, **options)
    assert str(error.value).startswith(message.format(tmp_path=tmp_path))
    assert not (tmp_path / "cache").exists()  # no .settings.json to refuse the corrected command with


def test_a_data_file_is_not_taken_for_an_output_to_prepare(tmp_path, mistral_teacher, gsm8k_sample):
    with pytest.raises(InvalidArgument) as error:
        score_teacher(data=gsm8k_sample, teacher=mistral_teacher, output=tmp_path / "cache")
    assert f"--input {gsm8k_sample} --output DIR" in str(error.value)
    assert f"--output {gsm8k_sample}" not in str(error.value)


def test_a_teacher_shorter_than_the_windows_is_refused_before_loading_it(tmp_path, tinyllama_mistral_data):
    manifest = json.loads((tinyllama_mistral_data / "manifest.json").read_text())
    short = manifest["teacher_max_length"] - 1
    teacher = make_checkpoint(tmp_path / "short", tiny_config("t", 32000, block_size=short), MISTRAL)
    with pytest.raises(
        InvalidArgument,
        match=f"has a block size of {short} tokens, shorter than the teacher windows of up to {short + 1} tokens",
    ):
        score_teacher(data=tinyllama_mistral_data, teacher=teacher, output=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_a_batch_larger_than_the_data_is_capped_with_a_note(mistral_cache):
    assert (
        "--batch_size 100000 capped at 64: the most blocks a forward can take here (a shard holds 64"
        in mistral_cache[1]
    )


def test_a_truncated_shard_is_not_taken_for_a_finished_cache(
    tmp_path, mistral_cache, tinyllama_mistral_data, mistral_teacher, capsys
):
    output = shutil.copytree(mistral_cache[0], tmp_path / "cache")
    score_teacher(data=tinyllama_mistral_data, teacher=mistral_teacher, output=output, blocks_per_shard=64)
    assert "nothing to do" in capsys.readouterr().out
    shard = output / "train" / "000000.losses.npy"
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(InvalidArgument, match=f"{shard} has .* bytes; .* records .* delete {output} and run the same"):
        score_teacher(data=tinyllama_mistral_data, teacher=mistral_teacher, output=output, blocks_per_shard=64)
    assert "nothing to do" not in capsys.readouterr().out


def nan_teacher(tmp_path: Path, teacher: Path) -> Path:
    """A copy of `teacher` whose head holds NaN, as a diverged run or a damaged conversion leaves weights."""
    copy = Path(shutil.copytree(teacher, tmp_path / "nan-teacher"))
    weights = torch.load(copy / "lit_model.pth", weights_only=True)
    weights["lm_head.weight"][:] = float("nan")
    torch.save(weights, copy / "lit_model.pth")
    return copy


def test_a_teacher_whose_losses_are_nan_stops_scoring_naming_it(tmp_path, tinyllama_mistral_data, mistral_teacher):
    teacher, output = nan_teacher(tmp_path, mistral_teacher), tmp_path / "cache"
    with pytest.raises(NotFinite) as error:
        score_teacher(data=tinyllama_mistral_data, teacher=teacher, output=output, num_workers=0, blocks_per_shard=64)
    assert str(error.value).startswith(
        f"The teacher {teacher} gives non-finite losses (NaN or inf) on train blocks 0..7 (shard 0, not written)"
    )
    assert not list(output.rglob("*.npy")) and not (output / "manifest.json").exists()


def test_sigterm_stops_scoring_in_one_line_and_a_rerun_continues(tmp_path, cached_split, monkeypatch):
    """SIGTERM during the second forward (a shard of 8 blocks each): the first shard is kept, the rerun scores the
    rest only, and the cache is the bytes of one uninterrupted run (the same shard and batch sizes). On the 38 blocks
    of `cached_split`'s data (35 train, 3 validation): 6 shards, as many forwards."""
    data = cached_split.data
    forwards = []

    def count_forwards(*args):
        forwards.append(args)
        if stop_at and len(forwards) == stop_at:
            os.kill(os.getpid(), signal.SIGTERM)
        return teacher_token_loss(*args)

    stop_at, output, handler = 2, tmp_path / "cache", signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(score_teacher_module, "teacher_token_loss", count_forwards)
    arguments = dict(data=data, teacher=cached_split.teacher, blocks_per_shard=8, num_workers=0, batch_size=8)
    with pytest.raises(ScoringStopped) as error:
        score_teacher(**arguments, output=output)
    assert str(error.value) == (
        f"score-teacher stopped by SIGTERM: the shards written to {output} are kept; run the same command again to"
        " continue (it scores only the missing shards)."
    )
    assert [p.name for p in output.rglob("*.losses.npy")] == ["000000.losses.npy"]
    assert signal.getsignal(signal.SIGTERM) == handler  # restored
    stop_at, forwards = None, []
    score_teacher(**arguments, output=output)
    shards = sum(-(-len(list(iter_blocks(data, split))) // 8) for split in ("train", "val"))
    assert len(forwards) == shards - 1 and shards >= 3
    score_teacher(**arguments, output=tmp_path / "uninterrupted")
    assert cache_bytes(output) == cache_bytes(tmp_path / "uninterrupted")


def test_a_cache_holding_nan_losses_is_refused_at_first_use(tmp_path, mistral_cache):
    cache = Path(shutil.copytree(mistral_cache[0], tmp_path / "cache"))
    shard = cache / "train" / "000001.losses.npy"
    losses = np.load(shard)
    losses[5] = np.nan  # as a teacher whose weights held NaN mistral_cache it, before score-teacher refused one
    np.save(shard, losses)
    manifest = json.loads((cache / "manifest.json").read_text())
    manifest["files"]["train/000001.losses.npy"] = file_record(shard)
    (cache / "manifest.json").write_text(json.dumps(manifest))
    cached = TeacherLossCache(cache, "train")
    assert np.isfinite(cached[0][1:]).all()
    with pytest.raises(
        NotFinite, match=rf"^{shard} holds non-finite teacher losses \(NaN or inf\), the first in block 64:"
    ):
        cached[64]
