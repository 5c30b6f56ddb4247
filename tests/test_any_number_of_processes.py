"""Same command, same numbers: a run's losses do not depend on how many processes compute it, from any start.

From a random initialisation (no `--initial_checkpoint_dir`: every weight drawn from the seed and its name,
`gpt.initialize_weights`), 1 and 2 gloo processes (4 in `make test-long`) train the same optimizer steps (4 blocks
each, one per micro-batch: one process accumulates all four, four processes one each) for `ce`, `random` and
`vocagnolm`, at scope `batch` and `global` (the top-k over the whole step, ranked in the data's order), read the same
blocks in every step (`traced_data`) and log the same loss at every step within float reduction noise. The processes
of each size run all the settings one after the other (`test_layouts`'s `worker`), so that each size starts its
processes once.
"""

import csv
from pathlib import Path

import pytest
import ranks
import torch
from conftest import CachedSplit
from litgpt.args import EvalArgs
from test_layouts import STEPS, losses, run_args, worker
from traced_data import TracedData, trained

from litgpt_vocagnolm.loss.methods import GuidanceArgs
from litgpt_vocagnolm.training.recipe import setup
from litgpt_vocagnolm.training.teacher import TeacherArgs

SETTINGS = [("ce", "batch"), ("random", "batch"), ("random", "global"), ("vocagnolm", "batch"), ("vocagnolm", "global")]
BLOCKS = 4  # per optimizer step


def runs(root: Path, split: CachedSplit, processes: int) -> list[dict]:
    """Each setting's run on `processes` processes. The last one's data records the blocks every rank reads, and it
    validates on the whole split at its end: its 3 blocks leave a rank of 2 (and of 4) a micro-batch short, which
    runs an empty forward (`recipe.validate`)."""
    found = []
    for method, scope in SETTINGS:
        run = run_args(
            root / f"{method}-{scope}-{processes}",
            split,
            None,  # no initial checkpoint: random weights
            world=BLOCKS,
            devices=processes,
            guidance=GuidanceArgs(method=method, scope=scope, top_k=0.3),
            teacher=TeacherArgs(cache=split.cache),
        )
        if (method, scope) == SETTINGS[-1]:
            trace = root / f"trace-{processes}"
            run |= {"data": TracedData(path=split.data, num_workers=0, trace=trace), "eval": EvalArgs(max_iters=100)}
        found.append(run)
    return found


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, cached_split) -> Path:
    """Every setting's run on one process (the folder of their runs): what the runs on more processes must give."""
    root = tmp_path_factory.mktemp("one-process")
    for run in runs(root, cached_split, 1):
        setup(**run)
    return root


def assert_same_as_one_process(root: Path, reference: Path, processes: int) -> None:
    """The runs in `root` on `processes` processes give what one process gave (the runs in `reference`): each
    setting's loss at every step, the blocks of each step, the validation loss."""
    for method, scope in SETTINGS:
        expected = losses(reference / f"{method}-{scope}-1" / "out")
        assert len(expected) == STEPS
        found = losses(root / f"{method}-{scope}-{processes}" / "out")
        torch.testing.assert_close(found, expected, rtol=1e-5, atol=1e-5, msg=f"{method}, {scope} on {processes}")
    # The same blocks in every step, whatever the processes: each step 4 blocks, one micro-batch each.
    blocks = trained(reference / "trace-1", 1, accumulation=BLOCKS)
    assert len(blocks) == STEPS and all(len(set(step)) == BLOCKS for step in blocks)
    assert trained(root / f"trace-{processes}", processes, accumulation=BLOCKS // processes) == blocks
    # The validation blocks, read whole on 1 and on `processes` ranks: the same loss.
    traced = "-".join(SETTINGS[-1])
    expected = final_val_loss(reference / f"{traced}-1")
    assert final_val_loss(root / f"{traced}-{processes}") == pytest.approx(expected, rel=1e-5)


@pytest.mark.slow
def test_every_step_has_the_same_loss_on_1_and_2_processes_from_random_weights(tmp_path, cached_split, one_process):
    ranks.start(worker, (runs(tmp_path, cached_split, 2),), processes=2)
    assert_same_as_one_process(tmp_path, one_process, 2)
    # The settings differ from each other: the comparison is not of one curve with itself.
    curves = {(method, scope): losses(one_process / f"{method}-{scope}-1" / "out") for method, scope in SETTINGS}
    assert not torch.equal(curves["vocagnolm", "global"], curves["vocagnolm", "batch"])
    assert not torch.equal(curves["random", "global"], curves["random", "batch"])
    assert not torch.equal(curves["ce", "batch"], curves["random", "batch"])


@pytest.mark.long
def test_every_step_has_the_same_loss_on_4_processes_from_random_weights(tmp_path, cached_split, one_process):
    ranks.start(worker, (runs(tmp_path, cached_split, 4),), processes=4)
    assert_same_as_one_process(tmp_path, one_process, 4)


def final_val_loss(run_dir: Path) -> float:
    (path,) = (run_dir / "out").glob("logs/**/metrics.csv")
    return [float(row["val_loss"]) for row in csv.DictReader(path.open()) if row["val_loss"]][-1]
