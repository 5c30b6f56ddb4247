"""Sharded checkpoints (DCP): checksums that catch damage in place, the used out_dir refused, the final export that
LitGPT loads, and resuming on another number of processes."""

import json
import shutil
import subprocess
from pathlib import Path

import lightning as L
import pytest
import torch
from litgpt.args import TrainArgs
from litgpt.model import GPT
from conftest import BIN, ROOT
from test_checkpoints import setup_args

from litgpt_vocagnolm.checkpoints import CHECKSUMS, check_checkpoint_dir, find_resume_checkpoint
from litgpt_vocagnolm.recipe import setup


def train(tmp_path: Path, data: Path, steps: int, **overrides) -> Path:
    """A tiny one-process run of `steps` optimizer steps (2 x 64 tokens each), a checkpoint after every step."""
    train_args = TrainArgs(global_batch_size=2, micro_batch_size=2, max_tokens=steps * 2 * 64, max_norm=1.0,
                           max_seq_length=64, save_interval=1)  # fmt: skip
    setup(**setup_args(tmp_path, data, train=train_args, **overrides))
    return tmp_path / "out"


def test_a_fresh_run_into_a_used_out_dir_is_refused_unless_overwrite(tmp_path, tinyllama_mistral_data):
    out_dir = train(tmp_path, tinyllama_mistral_data, steps=2)
    assert sorted(p.name for p in out_dir.glob("*") if p.name != "logs") == ["final", "step-00000001", "step-00000002"]
    final = (out_dir / "final" / "lit_model.pth").read_bytes()
    with pytest.raises(FileExistsError, match=r"holds a previous run's checkpoints \(final, step-00000001, step-0000"
                       r"0002\)\. Continue that run with --resume auto.*or pass --overwrite true"):  # fmt: skip
        train(tmp_path, tinyllama_mistral_data, steps=1)
    assert (out_dir / "final" / "lit_model.pth").read_bytes() == final  # nothing touched
    train(tmp_path, tinyllama_mistral_data, steps=1, overwrite=True)
    # The old run's step 2 is gone: a later `--resume auto` can't continue the old run from it.
    assert sorted(p.name for p in out_dir.glob("*") if p.name != "logs") == ["final", "step-00000001"]
    assert torch.load(out_dir / "final" / "lit_model.pth", weights_only=True)["step_count"] == 1


@pytest.mark.parametrize("fill", [0x00, 0xFF])
def test_a_checkpoint_damaged_in_place_is_skipped_naming_the_file(tmp_path, tinyllama_mistral_data, fill, capsys):
    out_dir = train(tmp_path, tinyllama_mistral_data, steps=3)
    (shard,) = (out_dir / "step-00000003").glob("*.distcp")
    data = bytearray(shard.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 4096] = bytes([fill]) * 4096  # same size, 4 KB overwritten
    shard.write_bytes(bytes(data))
    capsys.readouterr()
    fabric = L.Fabric(accelerator="cpu", devices=1)
    assert find_resume_checkpoint(fabric, "auto", out_dir) == out_dir / "step-00000002"
    out = capsys.readouterr().out
    assert f"Skipping {out_dir / 'step-00000003'}: {shard} does not match its checksum in {CHECKSUMS}" in out
    # A checkpoint without its checksums (written before, or cut before the last file) is skipped too.
    (out_dir / "step-00000002" / CHECKSUMS).unlink()
    assert find_resume_checkpoint(fabric, "auto", out_dir) == out_dir / "step-00000001"
    assert f"Skipping {out_dir / 'step-00000002'}: Cannot read" in capsys.readouterr().out


def test_resume_on_one_process_is_bit_exact_and_the_final_export_loads_in_litgpt(tmp_path, tinyllama_mistral_data):
    whole = train(tmp_path / "whole", tinyllama_mistral_data, steps=4)
    resumed_dir = tmp_path / "resumed"
    train(resumed_dir, tinyllama_mistral_data, steps=4)
    for step in ("step-00000003", "step-00000004", "final"):  # as if killed after step 2
        shutil.rmtree(resumed_dir / "out" / step)
    resumed = train(resumed_dir, tinyllama_mistral_data, steps=4, resume="auto")
    reference = torch.load(whole / "final" / "lit_model.pth", weights_only=True)
    final = torch.load(resumed / "final" / "lit_model.pth", weights_only=True)
    assert (final["step_count"], final["iter_num"]) == (reference["step_count"], reference["iter_num"]) == (4, 4)
    for name, tensor in reference["model"].items():
        torch.testing.assert_close(final["model"][name], tensor, rtol=0, atol=0, msg=name)
    config = setup_args(tmp_path, tinyllama_mistral_data)["model_config"]
    GPT(config).load_state_dict(final["model"])  # strict: every key LitGPT expects, nothing else
    assert json.loads((resumed / "final" / "train_state.json").read_text())["world_size"] == 1


def test_export_of_a_step_is_a_litgpt_checkpoint(tmp_path, tinyllama_mistral_data):
    out_dir = train(tmp_path, tinyllama_mistral_data, steps=2)
    command = [str(BIN / "vocagnolm"), "export", str(out_dir / "step-00000002"), str(tmp_path / "exported")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    check_checkpoint_dir(tmp_path / "exported", "exported", tokenizer=True)  # what `litgpt generate` needs
    exported = torch.load(tmp_path / "exported" / "lit_model.pth", weights_only=True)
    final = torch.load(out_dir / "final" / "lit_model.pth", weights_only=True)  # the same step, exported at the end
    assert exported["step_count"] == final["step_count"] == 2
    for name, tensor in final["model"].items():
        assert torch.equal(exported["model"][name], tensor), name
