"""A golden loss curve: the packaged recipe `demo-cpu`, run by its name as `make demo-cpu` runs it, must train to the
recorded losses.

A refactor that changes what the recipe computes (data order, loss, schedule, initialisation) shows here. The curve in
tests/assets/losses/demo-cpu.json was recorded with the commands below; record it again, and say why in the commit,
only when a change is meant to alter the numbers.

`make test` runs the recipe's first 6 steps (in this process) against the curve's; `make test-long` runs all 20 as
typed, each command in a process of its own, against the whole curve and its validation losses.
"""

import csv
import json
import subprocess
from pathlib import Path

import pytest
from conftest import BIN, QWEN, ROOT, TINYLLAMA, typed_here

GOLDEN = ROOT / "tests" / "assets" / "losses" / "demo-cpu.json"


def commands(data: Path, out: Path, *overrides: str) -> list[list[str]]:
    """`make demo-cpu`'s prepare, then the recipe by its name with `--train.log_interval 1` (as the curve was
    recorded) and `overrides`."""
    prepare = [str(BIN / "vocagnolm"), "prepare", "--student", str(TINYLLAMA), "--teacher", str(QWEN)]
    prepare += ["--input", str(ROOT / "data" / "gsm8k" / "train.jsonl"), "--text_key", "question,answer"]
    prepare += ["--output", str(data), "--max_seq_length", "128"]
    pretrain = [str(BIN / "litgpt"), "pretrain", "--recipe", "vocagnolm", "--config", "demo-cpu"]
    pretrain += ["--data.path", str(data), "--out_dir", str(out), "--train.log_interval", "1", *overrides]
    return [prepare, pretrain]


def logged(out: Path, name: str) -> list[float]:
    (path,) = out.glob("logs/**/metrics.csv")
    with open(path) as f:
        return [float(row[name]) for row in csv.DictReader(f) if row[name]]


@pytest.mark.slow
def test_demo_cpu_recipe_follows_the_start_of_its_golden_loss_curve(tmp_path):
    """The recipe stopped after 6 of its 20 steps (`--train.max_steps 6`). A run's length sets its learning rate only
    after the warm-up (5 steps: the cosine decays over the run), so each loss of steps 1-6, taken before its step's
    update, is the 20-step run's: the golden curve's first 6, as recorded."""
    for command in commands(tmp_path / "data", tmp_path / "out", "--train.max_steps", "6"):
        run = typed_here(*command)
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    golden = json.loads(GOLDEN.read_text())
    loss = logged(tmp_path / "out", "loss")
    assert len(loss) == 6
    # Float32 on one CPU kind repeats to the last bit; the tolerance leaves room for other CPUs' kernels only.
    assert loss == pytest.approx(golden["loss"][:6], rel=1e-4)


@pytest.mark.slow
@pytest.mark.long
def test_demo_cpu_recipe_follows_its_golden_loss_curve(tmp_path):
    for command in commands(tmp_path / "data", tmp_path / "out"):
        run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]

    golden = json.loads(GOLDEN.read_text())
    loss, val_loss = logged(tmp_path / "out", "loss"), logged(tmp_path / "out", "val_loss")
    assert len(loss) == len(golden["loss"]) == 20
    # Float32 on one CPU kind repeats to the last bit; the tolerance leaves room for other CPUs' kernels only.
    assert loss == pytest.approx(golden["loss"], rel=1e-4)
    assert val_loss == pytest.approx(golden["val_loss"], rel=1e-4)
