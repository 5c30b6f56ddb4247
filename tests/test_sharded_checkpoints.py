"""Sharded checkpoints (DCP): checksums that catch damage in place, the used out_dir refused, the final export that
LitGPT loads, and resuming on another number of processes."""

import contextlib
import csv
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import pytest
import ranks
import torch
from conftest import CachedSplit, make_checkpoint
from litgpt.args import EvalArgs, TrainArgs
from litgpt.model import GPT
from test_checkpoints import setup_args
from test_layouts import STUDENT, run_args, worker
from test_recipe import metrics
from traced_data import TracedData, trained

from litgpt_vocagnolm import cli
from litgpt_vocagnolm.errors import InvalidArgument
from litgpt_vocagnolm.loss.methods import GuidanceArgs
from litgpt_vocagnolm.models.weights import CHECKSUMS, check_checkpoint_dir
from litgpt_vocagnolm.training.checkpoints import find_resume_checkpoint
from litgpt_vocagnolm.training.recipe import setup
from litgpt_vocagnolm.training.teacher import TeacherArgs
from litgpt_vocagnolm.training.train_state import TRAIN_STATE, data_position


def train(tmp_path: Path, data: Path, steps: int, **overrides) -> Path:
    """A tiny one-process run of `steps` optimizer steps (2 x 64 tokens each), a checkpoint after every step, and a
    final validation of one micro-batch (LitGPT's default reads 100, most of such a run's time)."""
    train_args = TrainArgs(
        global_batch_size=2,
        micro_batch_size=2,
        max_tokens=steps * 2 * 64,
        max_norm=1.0,
        max_seq_length=64,
        save_interval=1,
    )
    setup(**setup_args(tmp_path, data, train=train_args, eval=EvalArgs(max_iters=1), **overrides))
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
    killed = shutil.ignore_patterns("step-00000003", "step-00000004", "final", "logs")  # as if killed after step 2
    shutil.copytree(whole, resumed_dir / "out", ignore=killed)
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
    cli.main(["export", str(out_dir / "step-00000002"), str(tmp_path / "exported")])  # as typed
    check_checkpoint_dir(tmp_path / "exported", "exported", tokenizer=True)  # what `litgpt generate` needs
    exported = torch.load(tmp_path / "exported" / "lit_model.pth", weights_only=True)
    final = torch.load(out_dir / "final" / "lit_model.pth", weights_only=True)  # the same step, exported at the end
    assert exported["step_count"] == final["step_count"] == 2
    for name, tensor in final["model"].items():
        assert torch.equal(exported["model"][name], tensor), name


@pytest.mark.slow
def test_a_run_resumed_on_as_many_processes_ends_bit_for_bit_as_the_uninterrupted_one(global_order):
    """Saved on 2 processes (FSDP2 over gloo, each rank its shard), resumed from step 2 on 2: the step count, the token
    budget and the schedule stay the run's, the end is bit for bit the uninterrupted run's, and the final lit_model.pth
    loads in LitGPT. The run is the global order's below, which resumes it on another number of processes too."""
    runs, _ = global_order
    assert len(list((runs.root / "whole-2" / f"step-{SAVED:08d}").glob("__*_0.distcp"))) == 2  # one shard per rank
    _, losses, out = runs.resumed(2, 2)
    resumed = runs.root / "resumed-2-2"
    assert f"Resuming training from {resumed / f'step-{SAVED:08d}'} after {SAVED * GLOBAL_BATCH} blocks" in out
    final = torch.load(resumed / "final" / "lit_model.pth", weights_only=True)
    assert (final["step_count"], final["iter_num"]) == (STEPS, STEPS * GLOBAL_BATCH // 2)  # the run's steps
    assert len(losses) == STEPS - SAVED  # the budget is the run's, not a new one
    reference = torch.load(runs.root / "whole-2" / "final" / "lit_model.pth", weights_only=True)
    for name, tensor in reference["model"].items():
        assert torch.equal(final["model"][name], tensor), name
    assert not (resumed / "final" / "hyperparameters.yaml").read_text().startswith("#")  # no change of shape to note
    GPT(STUDENT).load_state_dict(final["model"])


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
    setup(**setup_args(tmp_path, tinyllama_mistral_data, train=train_args, eval=EvalArgs(max_iters=1), resume="auto"))
    out = capsys.readouterr().out
    assert "Resumed from step 2 with train.micro_batch_size 2 -> 1." in out
    final = torch.load(tmp_path / "out" / "final" / "lit_model.pth", weights_only=True)
    assert (final["step_count"], final["iter_num"]) == (3, 6)  # one more step of 2 micro-batches, not 4 more steps
    assert "iter 6 step 3" in out and "step 4" not in out
    hparams = (tmp_path / "out" / "final" / "hyperparameters.yaml").read_text()
    assert hparams.startswith("# Resumed from step 2 with train.micro_batch_size 2 -> 1.\n")


STEPS, GLOBAL_BATCH, SAVED = 5, 12, 2  # the global-order runs: steps of 12 blocks, one per micro-batch, saved at step 2


def printing_worker(rank: int, runs: list[dict], printed: Path) -> None:
    """`test_layouts.worker`, what the rank prints written to `printed/rank-R.txt`."""
    with open(printed / f"rank-{rank}.txt", "w") as f, contextlib.redirect_stdout(f):
        worker(rank, runs)


@dataclass
class GlobalOrder:
    """Runs of STEPS steps over `split` (35 train blocks, so that step 3 ends epoch 1 and begins epoch 2) from one
    student checkpoint, the teacher's cached losses selecting the tokens; each process records the blocks it reads
    (`TracedData`). One process runs in this one, several in forked ranks (`ranks.start`)."""

    root: Path
    split: CachedSplit
    student: Path
    """The student's checkpoint."""

    def run(self, name: str, processes: int, resume: bool | str = False) -> tuple[list[list[int]], list[float], str]:
        """The run in `root/name` on `processes` processes: the blocks of each step, each step's loss, what rank 0
        printed."""
        args = run_args(
            self.root / name,
            self.split,
            self.student,
            world=GLOBAL_BATCH,
            out_dir=self.root / name,
            teacher=TeacherArgs(checkpoint_dir=self.split.teacher, cache=self.split.cache),
            guidance=GuidanceArgs(method="vocagnolm", top_k=0.4),
            train=TrainArgs(
                save_interval=SAVED,
                log_interval=1,
                global_batch_size=GLOBAL_BATCH,
                micro_batch_size=1,
                lr_warmup_steps=1,
                max_tokens=STEPS * GLOBAL_BATCH * 128,
                max_seq_length=128,
                max_norm=1.0,
                min_lr=1e-3,
            ),
            eval=EvalArgs(interval=100, max_iters=100, final_validation=True),  # the whole split at the end
            devices=processes,
            resume=resume,
        )
        args["data"] = TracedData(path=self.split.data, num_workers=0, trace=self.root / f"{name}-trace")
        printed = self.root / f"{name}-printed"
        printed.mkdir()
        if processes == 1:
            printing_worker(0, [args], printed)
        else:
            ranks.start(printing_worker, ([args], printed), processes)
        steps = trained(self.root / f"{name}-trace", processes, accumulation=GLOBAL_BATCH // processes)
        return steps, [row["loss"] for row in metrics(self.root / name)], (printed / "rank-0.txt").read_text()

    def resumed(self, before: int, after: int) -> tuple[list[list[int]], list[float], str]:
        """The run saved on `before` processes, resumed from step SAVED on `after`, as if killed after it."""
        name = f"resumed-{before}-{after}"
        ignored = shutil.ignore_patterns(*(f"step-{step:08d}" for step in range(SAVED + 1, STEPS + 1)), "final", "logs")
        shutil.copytree(self.root / f"whole-{before}", self.root / name, ignore=ignored)
        return self.run(name, after, resume="auto")

    def final_val_loss(self, name: str) -> float:
        (path,) = (self.root / name).glob("logs/**/metrics.csv")
        return [float(row["val_loss"]) for row in csv.DictReader(path.open()) if row["val_loss"]][-1]


@pytest.fixture(scope="module")
def global_order(tmp_path_factory, cached_split) -> tuple[GlobalOrder, dict]:
    """The global order's runs (issue 31), and the uninterrupted run on 1 and 2 processes: {processes: (blocks of
    each step, losses, printed)}. Once for this module's tests, which resume them."""
    root = tmp_path_factory.mktemp("global-order")
    student = make_checkpoint(root / "student", STUDENT, cached_split.student, seed=3)
    runs = GlobalOrder(root, cached_split, student)
    return runs, {processes: runs.run(f"whole-{processes}", processes) for processes in (1, 2)}


@pytest.mark.slow
def test_every_block_once_and_the_same_losses_on_1_and_2_processes_and_resumed_on_the_other(global_order):
    """The global order (issue 31): from one student checkpoint, runs on 1 and 2 processes train the same blocks in
    every step and log the same losses (from random weights, with other methods: tests/test_any_number_of_processes.py);
    saved at step 2 (mid-epoch) and resumed 2 -> 1 and 1 -> 2 (resharded), they go on with the uninterrupted run's
    blocks and losses, so every block of the epoch is trained once. On 3 processes: the test below, `long`."""
    runs, whole = global_order
    train_blocks = json.loads((runs.split.data / "manifest.json").read_text())["splits"]["train"]["blocks"]
    steps, losses, _ = whole[1]
    blocks = [block for step in steps for block in step]
    assert len(steps) == STEPS and sorted(blocks[:train_blocks]) == list(range(train_blocks))  # epoch 1: each once
    assert len(set(blocks[train_blocks:])) == STEPS * GLOBAL_BATCH - train_blocks  # epoch 2 begins in step 3,
    assert blocks[train_blocks:] != blocks[: STEPS * GLOBAL_BATCH - train_blocks]  # in another order
    assert whole[2][0] == steps
    torch.testing.assert_close(torch.tensor(whole[2][1]), torch.tensor(losses), rtol=1e-4, atol=1e-4)
    # The 3 validation blocks, rank 1 of 2 a micro-batch short (an empty forward): the loss of one process.
    assert runs.final_val_loss("whole-2") == pytest.approx(runs.final_val_loss("whole-1"), rel=1e-4)
    for before, after in ((2, 1), (1, 2)):
        continues_the_global_order(runs, whole, before, after)


@pytest.mark.long
def test_a_run_saved_on_2_processes_resumes_on_3_with_the_same_blocks_and_losses(global_order):
    """The test above's run saved on 2 processes, resumed on 3, a number it never ran on (4 micro-batches a rank)."""
    runs, whole = global_order
    continues_the_global_order(runs, whole, 2, 3)


def continues_the_global_order(runs: GlobalOrder, whole: dict, before: int, after: int) -> None:
    """The run saved on `before` processes, resumed on `after`: the uninterrupted run's blocks and losses."""
    steps, losses, _ = whole[1]
    name = f"resumed-{before}-{after}"
    resumed_steps, resumed_losses, out = runs.resumed(before, after)
    assert f"Resuming training from {runs.root / name / f'step-{SAVED:08d}'} after {SAVED * GLOBAL_BATCH} blocks" in out
    assert f"Resumed from step {SAVED} with processes {before} -> {after}" in out
    assert whole[before][0][:SAVED] + resumed_steps == steps  # every block of epoch 1 once, then epoch 2 as before
    torch.testing.assert_close(torch.tensor(resumed_losses), torch.tensor(losses[SAVED:]), rtol=1e-4, atol=1e-4)
    final = torch.load(runs.root / name / "final" / "lit_model.pth", weights_only=True)
    assert (final["step_count"], final["iter_num"]) == (STEPS, STEPS * GLOBAL_BATCH // after)
    position = json.loads((runs.root / name / "final" / "train_state.json").read_text())["position"]
    assert position == STEPS * GLOBAL_BATCH


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
