"""Same command, same numbers: a run's losses do not depend on how many processes compute it, from any start.

From a random initialisation (no `--initial_checkpoint_dir`: every weight drawn from the seed and its name,
`gpt.initialize_weights`), 1, 2 and 4 gloo processes train the same optimizer steps (4 blocks each, one per
micro-batch: one process accumulates all four, four processes one each) for `ce`, `random` and `vocagnolm`, at scope
`batch` and `global` (the top-k over the whole step, ranked in the data's order), read the same blocks in every step
(`traced_data`) and log the same loss at every step within float reduction noise. The processes of each size run all
the settings one after the other (`test_layouts`'s `worker`), so that each size starts its processes once.
"""

import csv
from pathlib import Path

import pytest
import ranks
import torch
from conftest import tiny_config
from litgpt.args import EvalArgs, TrainArgs
from test_layouts import STEPS, losses, run_args, worker
from traced_data import TracedData, trained

from litgpt_vocagnolm.loss.methods import GuidanceArgs
from litgpt_vocagnolm.training.recipe import setup
from litgpt_vocagnolm.training.teacher import TeacherArgs

SETTINGS = [("ce", "batch"), ("random", "batch"), ("random", "global"), ("vocagnolm", "batch"), ("vocagnolm", "global")]
BLOCKS = 4  # per optimizer step


@pytest.mark.slow
def test_every_step_has_the_same_loss_on_1_2_and_4_processes_from_random_weights(tmp_path, cached_split):
    data, cache = cached_split  # 32 train blocks, 2 validation blocks, the teacher's loss cache

    def runs(processes: int) -> list[dict]:
        """Each setting's run on `processes` processes. The last one's data records the blocks every rank reads, and
        it validates on the whole split at its end: on 4 ranks two of them hold no validation block and run an empty
        forward (`recipe.validate`)."""
        train = TrainArgs(
            global_batch_size=BLOCKS,
            micro_batch_size=1,
            max_tokens=STEPS * BLOCKS * 128,
            max_seq_length=128,
            max_norm=1.0,
            lr_warmup_steps=1,
            min_lr=1e-3,
        )
        found = []
        for method, scope in SETTINGS:
            run = run_args(
                tmp_path / f"{method}-{scope}-{processes}",
                data,
                None,
                None,  # no initial checkpoint: random weights
                world=BLOCKS,
                devices=processes,
                guidance=GuidanceArgs(method=method, scope=scope, top_k=0.3),
                teacher=TeacherArgs(cache=cache),
                train=train,
                model_config=tiny_config("student", 32000, n_layer=2, n_embd=64, block_size=128),  # the data's blocks
            )
            if (method, scope) == SETTINGS[-1]:
                trace = tmp_path / f"trace-{processes}"
                run |= {"data": TracedData(path=data, num_workers=0, trace=trace), "eval": EvalArgs(max_iters=100)}
            found.append(run)
        return found

    for run in runs(1):
        setup(**run)
    for processes in (2, 4):
        ranks.start(worker, (runs(processes),), processes)

    curves = {
        (setting, processes): losses(run["out_dir"])
        for processes in (1, 2, 4)
        for setting, run in zip(SETTINGS, runs(processes))
    }
    for setting in SETTINGS:
        expected = curves[setting, 1]
        assert len(expected) == STEPS
        for processes in (2, 4):
            torch.testing.assert_close(
                curves[setting, processes], expected, rtol=1e-5, atol=1e-5, msg=f"{setting} on {processes}"
            )
    # The same blocks in every step, whatever the processes: each step 4 blocks, one micro-batch each.
    blocks = {n: trained(tmp_path / f"trace-{n}", n, accumulation=BLOCKS // n) for n in (1, 2, 4)}
    assert len(blocks[1]) == STEPS and all(len(set(step)) == BLOCKS for step in blocks[1])
    assert blocks[2] == blocks[1] and blocks[4] == blocks[1]
    # The 2 validation blocks, read whole on 1, 2 and 4 ranks: the same loss.
    validation = [final_val_loss(tmp_path / f"{'-'.join(SETTINGS[-1])}-{n}") for n in (1, 2, 4)]
    assert validation == pytest.approx([validation[0]] * 3, rel=1e-5)
    # The settings differ from each other: the comparison above is not of one curve with itself.
    assert not torch.equal(curves[("vocagnolm", "global"), 1], curves[("vocagnolm", "batch"), 1])
    assert not torch.equal(curves[("random", "global"), 1], curves[("random", "batch"), 1])
    assert not torch.equal(curves[("ce", "batch"), 1], curves[("random", "batch"), 1])


def final_val_loss(run_dir: Path) -> float:
    (path,) = (run_dir / "out").glob("logs/**/metrics.csv")
    return [float(row["val_loss"]) for row in csv.DictReader(path.open()) if row["val_loss"]][-1]
