"""Sharded checkpoints (DCP): checksums that catch damage in place, the used out_dir refused, the final export that
LitGPT loads, and resuming on another number of processes."""

import csv
import json
import os
import shutil
import subprocess
from pathlib import Path

import lightning as L
import pytest
import torch
from conftest import BIN, ROOT, TINYLLAMA, make_checkpoint, model_config_fields, tiny_config
from litgpt.args import TrainArgs
from litgpt.model import GPT
from test_checkpoints import setup_args
from test_recipe import litgpt_pretrain, metrics, recipe_config
from traced_data import trained

from litgpt_vocagnolm.errors import InvalidArgument
from litgpt_vocagnolm.models.weights import CHECKSUMS, check_checkpoint_dir
from litgpt_vocagnolm.training.checkpoints import find_resume_checkpoint
from litgpt_vocagnolm.training.recipe import setup
from litgpt_vocagnolm.training.train_state import TRAIN_STATE, data_position


def train(tmp_path: Path, data: Path, steps: int, **overrides) -> Path:
    """A tiny one-process run of `steps` optimizer steps (2 x 64 tokens each), a checkpoint after every step."""
    train_args = TrainArgs(
        global_batch_size=2,
        micro_batch_size=2,
        max_tokens=steps * 2 * 64,
        max_norm=1.0,
        max_seq_length=64,
        save_interval=1,
    )
    setup(**setup_args(tmp_path, data, train=train_args, **overrides))
    return tmp_path / "out"


def test_a_fresh_run_into_a_used_out_dir_is_refused_unless_overwrite(tmp_path, tinyllama_mistral_data):
    out_dir = train(tmp_path, tinyllama_mistral_data, steps=2)
    assert sorted(p.name for p in out_dir.glob("*") if p.name != "logs") == ["final", "step-00000001", "step-00000002"]
    final = (out_dir / "final" / "lit_model.pth").read_bytes()
    with pytest.raises(
        FileExistsError,
        match=r"holds a previous run's checkpoints \(final, step-00000001, step-0000"
        r"0002\)\. Continue that run with --resume auto.*or pass --overwrite true",
    ):
        train(tmp_path, tinyllama_mistral_data, steps=1)
    assert (out_dir / "final" / "lit_model.pth").read_bytes() == final  # nothing touched
    train(tmp_path, tinyllama_mistral_data, steps=1, overwrite=True)
    # The old run's step 2 is gone: a later `--resume auto` can't continue the old run from it.
    assert sorted(p.name for p in out_dir.glob("*") if p.name != "logs") == ["final", "step-00000001"]
    assert torch.load(out_dir / "final" / "lit_model.pth", weights_only=True)["step_count"] == 1


@pytest.mark.parametrize("fill", [0x00, 0xFF])
def test_a_checkpoint_damaged_in_place_is_skipped_naming_the_file(tmp_path, tinyllama_mistral_data, fill, capsys):
    out_dir = train(tmp_path, tinyllama_mistral_data, steps=3)
    shard = max((out_dir / "step-00000003").glob("*.distcp"), key=lambda p: p.stat().st_size)  # a file per thread
    data = bytearray(shard.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 4096] = bytes([fill]) * 4096  # same size, 4 KB overwritten
    shard.write_bytes(bytes(data))
    shutil.rmtree(out_dir / "final")  # as if killed before it: the step checkpoints are all there is
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


@pytest.mark.slow
def test_a_run_resumed_on_as_many_processes_ends_bit_for_bit_as_the_uninterrupted_one(tmp_path, tinyllama_mistral_data):
    """Saved on 2 processes (FSDP2 over gloo, each rank its shard), resumed from step 2 on 2: the step count, the token
    budget and the schedule stay the run's, the end is bit for bit the uninterrupted run's, and the final lit_model.pth
    loads in LitGPT. (Another number of processes:
    `test_every_block_once_and_the_same_losses_on_1_2_3_and_4_processes`.)"""
    before = after = 2
    config = recipe_config(tmp_path, tinyllama_mistral_data, None, guidance={"method": "ce"}, devices=before)
    args = [
        "--train.micro_batch_size",
        "1",
        "--train.global_batch_size",
        "2",
        "--train.save_interval",
        "2",
        "--train.max_tokens",
        str(6 * 2 * 64),
    ]
    litgpt_pretrain(config, *args, "--out_dir", str(tmp_path / "whole"))
    assert len(list((tmp_path / "whole" / "step-00000002").glob("__*_0.distcp"))) == before  # one shard per rank
    shutil.copytree(
        tmp_path / "whole",
        tmp_path / "resumed",
        ignore=shutil.ignore_patterns("step-00000004", "step-00000006", "final", "logs"),
    )
    out = litgpt_pretrain(
        config, *args, "--out_dir", str(tmp_path / "resumed"), "--devices", str(after), "--resume", "auto"
    ).stdout
    assert f"Resuming training from {tmp_path / 'resumed' / 'step-00000002'} after 4 blocks" in out
    final = torch.load(tmp_path / "resumed" / "final" / "lit_model.pth", weights_only=True)
    assert (final["step_count"], final["iter_num"]) == (6, 6 * 2 // after)  # the run's 6 steps of 2 blocks
    assert len(metrics(tmp_path / "resumed")) == 4  # steps 3 to 6: the budget is the run's, not a new one
    reference = torch.load(tmp_path / "whole" / "final" / "lit_model.pth", weights_only=True)
    for name, tensor in reference["model"].items():
        assert torch.equal(final["model"][name], tensor), name
    assert not (tmp_path / "resumed" / "final" / "hyperparameters.yaml").read_text().startswith("#")
    GPT(setup_args(tmp_path, tinyllama_mistral_data)["model_config"]).load_state_dict(final["model"])


def test_a_resume_that_changes_the_global_batch_is_refused_before_any_model(tmp_path, tinyllama_mistral_data):
    train(tmp_path, tinyllama_mistral_data, steps=1)
    train_args = TrainArgs(
        global_batch_size=4, micro_batch_size=2, max_tokens=2 * 4 * 64, max_norm=1.0, max_seq_length=64, save_interval=1
    )
    with pytest.raises(
        ValueError,
        match=r"--train.global_batch_size 4 differs from the run's 2 .*Resume with"
        r" --train.global_batch_size 2",
    ):
        setup(**setup_args(tmp_path, tinyllama_mistral_data, train=train_args, resume="auto"))


def test_a_resume_with_another_micro_batch_keeps_the_runs_steps_and_says_so(tmp_path, tinyllama_mistral_data, capsys):
    train(tmp_path, tinyllama_mistral_data, steps=3)
    for step in ("step-00000003", "final"):
        shutil.rmtree(tmp_path / "out" / step)
    train_args = TrainArgs(
        global_batch_size=2, micro_batch_size=1, max_tokens=3 * 2 * 64, max_norm=1.0, max_seq_length=64, save_interval=1
    )
    capsys.readouterr()
    setup(**setup_args(tmp_path, tinyllama_mistral_data, train=train_args, resume="auto"))
    out = capsys.readouterr().out
    assert "Resumed from step 2 with train.micro_batch_size 2 -> 1." in out
    final = torch.load(tmp_path / "out" / "final" / "lit_model.pth", weights_only=True)
    assert (final["step_count"], final["iter_num"]) == (3, 6)  # one more step of 2 micro-batches, not 4 more steps
    assert "iter 6 step 3" in out and "step 4" not in out
    hparams = (tmp_path / "out" / "final" / "hyperparameters.yaml").read_text()
    assert hparams.startswith("# Resumed from step 2 with train.micro_batch_size 2 -> 1.\n")


@pytest.mark.slow
def test_every_block_once_and_the_same_losses_on_1_2_and_3_processes(tmp_path, cached_split, mistral_teacher):
    """The global order (issue 31). Runs of 5 steps of 12 blocks (one block per micro-batch) over a train split of 32,
    so step 3 ends epoch 1 and begins epoch 2, with the teacher's cached losses selecting the tokens: from one
    student checkpoint on 1 and 2 processes they train the same blocks in every step and log the same losses (4
    processes, from random weights: tests/test_any_number_of_processes.py); saved at step 2 (mid-epoch) and resumed
    2 -> 1, 1 -> 2 and 2 -> 3, they go on with the uninterrupted run's blocks and losses, so every block of the epoch
    is trained once. Each process records the blocks it reads (`TracedData`)."""
    data, cache = cached_split
    config = tiny_config("student", 32000, n_layer=2, n_embd=64, block_size=128)
    student = make_checkpoint(tmp_path / "student", config, TINYLLAMA, seed=3)
    config = recipe_config(
        tmp_path,
        data,
        mistral_teacher,
        teacher={"checkpoint_dir": str(mistral_teacher), "cache": str(cache)},
        model_config=model_config_fields(config),
        initial_checkpoint_dir=str(student),
        data={"class_path": "traced_data.TracedData", "init_args": {"path": str(data), "num_workers": 0}},
    )
    args = [
        "--train.micro_batch_size",
        "1",
        "--train.global_batch_size",
        "12",
        "--train.max_seq_length",
        "128",
        "--train.save_interval",
        "2",
        "--train.max_tokens",
        str(5 * 12 * 128),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests")}

    def run(name: str, processes: int, *more: str) -> tuple[list[list[int]], list[float], str]:
        out = litgpt_pretrain(
            config,
            *args,
            *more,
            "--devices",
            str(processes),
            "--out_dir",
            str(tmp_path / name),
            "--data.trace",
            str(tmp_path / f"{name}-trace"),
            env=env,
        ).stdout
        steps = trained(tmp_path / f"{name}-trace", processes, accumulation=12 // processes)
        return steps, [row["loss"] for row in metrics(tmp_path / name)], out

    def final_val_loss(name: str) -> float:
        (path,) = (tmp_path / name).glob("logs/**/metrics.csv")
        return [float(row["val_loss"]) for row in csv.DictReader(path.open()) if row["val_loss"]][-1]

    whole = {processes: run(f"whole-{processes}", processes) for processes in (1, 2)}
    steps, losses, _ = whole[1]
    blocks = [block for step in steps for block in step]
    assert len(steps) == 5 and sorted(blocks[:32]) == list(range(32))  # epoch 1: every block once
    assert len(set(blocks[32:])) == 28  # epoch 2 begins in step 3, in another order
    assert blocks[32:] != blocks[:28]
    assert whole[2][0] == steps
    torch.testing.assert_close(torch.tensor(whole[2][1]), torch.tensor(losses), rtol=1e-4, atol=1e-4)
    assert final_val_loss("whole-2") == pytest.approx(final_val_loss("whole-1"), rel=1e-4)

    for before, after in ((2, 1), (1, 2), (2, 3)):
        name = f"resumed-{before}-{after}"
        shutil.copytree(
            tmp_path / f"whole-{before}",
            tmp_path / name,
            ignore=shutil.ignore_patterns("step-00000004", "final", "logs"),
        )
        resumed_steps, resumed_losses, out = run(name, after, "--resume", "auto")
        assert f"Resuming training from {tmp_path / name / 'step-00000002'} after 24 blocks" in out
        assert f"Resumed from step 2 with processes {before} -> {after}" in out
        assert whole[before][0][:2] + resumed_steps == steps  # every block of epoch 1 once, then epoch 2 as before
        torch.testing.assert_close(torch.tensor(resumed_losses), torch.tensor(losses[2:]), rtol=1e-4, atol=1e-4)
        final = torch.load(tmp_path / name / "final" / "lit_model.pth", weights_only=True)
        assert (final["step_count"], final["iter_num"]) == (5, 5 * 12 // after)
        assert json.loads((tmp_path / name / "final" / "train_state.json").read_text())["position"] == 60


def test_the_data_position_is_the_saved_count_and_per_rank_loader_states_are_not_moved(tmp_path):
    def saved(**train_state) -> Path:
        (tmp_path / TRAIN_STATE).write_text(
            json.dumps({"iter_num": 6, "step_count": 3, "world_size": 2, **train_state})
        )
        return tmp_path

    # The global order: the count saved, on any number of processes.
    assert data_position(saved(position=36), global_batch_size=12, world_size=3, global_order=True) == 36
    # Saved before it, with LitData's per-rank states: no place in the global order.
    old = saved(train_dataloader=[{"num_samples_yielded": 18}] * 2)
    with pytest.raises(InvalidArgument, match="per-rank loader state, from before the data order was one global order"):
        data_position(old, global_batch_size=12, world_size=2, global_order=True)
    # A LitGPT data module's own loader: its per-rank states continue on as many processes, never on another number.
    assert data_position(old, global_batch_size=12, world_size=2, global_order=False) == 36
    with pytest.raises(InvalidArgument, match="saved on 2 processes, this run has 3: .* Resume on 2 processes"):
        data_position(old, global_batch_size=12, world_size=3, global_order=False)
