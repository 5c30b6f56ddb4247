"""Same command, same numbers: a run's losses do not depend on how many processes compute it, from any start.

From a random initialisation (no `--initial_checkpoint_dir`: every weight drawn from the seed and its name,
`gpt.initialize_weights`), 1, 2 and 4 gloo processes train the same optimizer steps (4 blocks each, one per
micro-batch: one process accumulates all four, four processes one each) for `ce`, `random` and `vocagnolm`, at scope
`batch` and `global` (the top-k over the whole step, ranked in the data's order), and log the same loss at every step
within float reduction noise. The processes of each size run all the settings one after the other (`test_layouts`'s
`worker`), so that each size starts its processes once.
"""

import pytest
import torch
import torch.multiprocessing as mp
from test_layouts import STEPS, losses, run_args, worker
from test_loss_distributed import free_port

from litgpt_vocagnolm.loss.methods import GuidanceArgs
from litgpt_vocagnolm.training.recipe import setup

SETTINGS = [("ce", "batch"), ("random", "batch"), ("random", "global"), ("vocagnolm", "batch"), ("vocagnolm", "global")]
BLOCKS = 4  # per optimizer step


@pytest.mark.slow
def test_every_step_has_the_same_loss_on_1_2_and_4_processes_from_random_weights(
    tmp_path, tinyllama_mistral_data, mistral_teacher
):
    def runs(processes: int) -> list[dict]:
        return [
            run_args(
                tmp_path / f"{method}-{scope}-{processes}",
                tinyllama_mistral_data,
                mistral_teacher,
                None,  # no initial checkpoint: random weights
                world=BLOCKS,
                devices=processes,
                guidance=GuidanceArgs(method=method, scope=scope, top_k=0.3),
            )
            for method, scope in SETTINGS
        ]

    for run in runs(1):
        setup(**run)
    for processes in (2, 4):
        mp.spawn(worker, args=(free_port(), processes, runs(processes), None), nprocs=processes, join=True)

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
    # The settings differ from each other: the comparison above is not of one curve with itself.
    assert not torch.equal(curves[("vocagnolm", "global"), 1], curves[("vocagnolm", "batch"), 1])
    assert not torch.equal(curves[("random", "global"), 1], curves[("random", "batch"), 1])
    assert not torch.equal(curves[("ce", "batch"), 1], curves[("random", "batch"), 1])
