"""The `vocagnolm` recipe end to end on CPU: tiny models, real tokenizers, the real console scripts."""

import csv
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from conftest import (
    BIN,
    LLEMMA,
    MISTRAL,
    QWEN,
    RECIPES,
    ROOT,
    TINYLLAMA,
    built_once,
    make_checkpoint,
    model_config_fields,
    student_config_yaml,
    tiny_config,
    typed_here,
)
from jsonargparse import CLI, capture_parser
from litgpt.config import Config
from test_loss_distributed import free_port
from test_user_errors import assert_one_line

from litgpt_vocagnolm.loss.methods import GuidanceArgs
from litgpt_vocagnolm.training.recipe import setup
from litgpt_vocagnolm.training.teacher import Teacher, TeacherArgs

TESTS = Path(__file__).resolve().parent


def recipe_config(tmp_path: Path, data_path: Path, teacher_dir: Path | None, **overrides) -> Path:
    """A YAML for `--config`, like recipes/demo-cpu.yaml but smaller; `overrides` replace top-level keys."""
    config = {
        "model_config": yaml.safe_load(student_config_yaml(tmp_path / "student.json").read_text()),
        "out_dir": str(tmp_path / "out"),
        "precision": "32-true",
        "tokenizer_dir": str(TINYLLAMA),
        "data": {
            "class_path": "litgpt_vocagnolm.data.VocAgnoData",
            "init_args": {"path": str(data_path), "num_workers": 0},
        },
        "train": {
            "save_interval": 4,
            "log_interval": 1,
            "global_batch_size": 4,
            "micro_batch_size": 2,
            "lr_warmup_steps": 1,
            "max_tokens": 12 * 4 * 64,
            "max_seq_length": 64,
            "max_norm": 1.0,
            "min_lr": 1e-3,
        },
        "eval": {"interval": 100, "max_iters": 2, "final_validation": True},
        "optimizer": {"class_path": "torch.optim.AdamW", "init_args": {"lr": 1e-2}},
        "devices": 1,
        "logger_name": "csv",
        "seed": 7,
        "teacher": {"checkpoint_dir": None if teacher_dir is None else str(teacher_dir)},
        "guidance": {"method": "vocagnolm", "top_k": 0.4},
        "compile": False,
    }
    config.update(overrides)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def litgpt_pretrain(
    config: Path, *args: str, env: dict | None = None, timeout: int = 600
) -> subprocess.CompletedProcess:
    command = [str(BIN / "litgpt"), "pretrain", "--recipe", "vocagnolm", "--config", str(config), *args]
    out = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    return out


def pretrain_here(config: Path, *args: str) -> subprocess.CompletedProcess:
    """`litgpt_pretrain` in this process (`typed_here`): the same command, for a run whose process is not the point."""
    out = typed_here(BIN / "litgpt", "pretrain", "--recipe", "vocagnolm", "--config", config, *args)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    return out


def metric_rows(out_dir: Path) -> list[dict[str, float]]:
    """Every row of the CSV logs in `out_dir`, run after run (a resumed run logs into a new version_N/)."""
    rows = []
    for path in sorted(out_dir.glob("logs/csv/version_*/metrics.csv"), key=lambda p: int(p.parent.name[8:])):
        with open(path) as f:
            rows += [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]
    return rows


def metrics(out_dir: Path) -> list[dict[str, float]]:
    """The rows of the training steps' metrics (`metric_rows`)."""
    return [row for row in metric_rows(out_dir) if "loss" in row]


@pytest.mark.parametrize("path", sorted((RECIPES).glob("*.yaml")), ids=lambda p: p.name)
def test_recipe_yamls_parse_against_setup(path):
    parser = capture_parser(lambda: CLI(setup, args=[]))
    config = parser.instantiate_classes(parser.parse_args(["--config", str(path)]))
    assert isinstance(config.guidance, GuidanceArgs)
    if path.name.startswith("tinyllama-"):  # the paper's settings (Sec. 4, App. B)
        assert config.model_name == "tiny-llama-1.1b"
        assert (config.guidance.method, config.guidance.top_k, config.guidance.aggregation) == ("vocagnolm", 0.4, "max")
        assert (config.guidance.unmapped, config.guidance.compare) == ("include", "token")
        assert config.train.global_batch_size * config.train.max_seq_length == 2**21  # 2M tokens
        assert config.train.max_tokens == 15_000_000_000 and config.train.min_lr == 8e-6
        assert config.optimizer["init_args"]["lr"] == 8e-5
        assert config.devices * config.num_nodes == 32


@pytest.mark.slow
def test_guided_training_end_to_end_with_qwen_teacher(tmp_path, tinyllama_qwen_data, qwen_teacher):
    """TinyLlama-tokenizer student, Qwen2.5-tokenizer teacher (6% vocabulary overlap), through `litgpt pretrain
    --recipe vocagnolm`, then `litgpt generate` (both in this process: `typed_here`)."""
    config = recipe_config(tmp_path, tinyllama_qwen_data, qwen_teacher)
    out = pretrain_here(config, "--train.max_tokens", str(6 * 4 * 64), "--train.save_interval", "2")
    assert "vocabulary overlap" in out.stdout
    rows = metrics(tmp_path / "out")
    assert len(rows) == 6
    assert sum(r["loss"] for r in rows[-3:]) < sum(r["loss"] for r in rows[:3])  # the loss falls
    for row in rows:  # ceil(0.4 * mapped) of the mapped tokens of each micro-batch
        assert 0.4 <= row["selected_fraction"] <= 0.4 + 2 / (row["mapped_fraction"] * 2 * 64)
        assert 0.9 < row["mapped_fraction"] <= 1.0
    final = tmp_path / "out" / "final"
    assert {"lit_model.pth", "model_config.yaml", "hyperparameters.yaml", "tokenizer.json"} <= {
        p.name for p in final.iterdir()
    }
    saved = yaml.safe_load((final / "hyperparameters.yaml").read_text())
    assert saved["guidance"]["method"] == "vocagnolm" and saved["teacher"]["checkpoint_dir"] == [str(qwen_teacher)]
    assert saved["data"]["class_path"] == "litgpt_vocagnolm.data.VocAgnoData"  # as the recipes' YAML names it
    assert sorted(p.name for p in (tmp_path / "out").glob("step-*")) == [
        "step-00000002",
        "step-00000004",
        "step-00000006",
    ]

    # LitGPT's own tools take the checkpoint.
    generate = typed_here(
        BIN / "litgpt", "generate", final, "--prompt", "Natalia sold", "--max_new_tokens", "5", "--precision", "32-true"
    )
    assert generate.returncode == 0, generate.stderr[-3000:]
    assert "Natalia sold" in generate.stdout


@pytest.mark.slow
def test_kld_with_llemma_trains_over_the_student_vocabulary(tmp_path, tinyllama_llemma_data, llemma_teacher):
    """Table 1's KLD row: Llemma's vocabulary holds TinyLlama's with the same ids and 16 more tokens, so the method is
    accepted, and the recipe passes the student's vocabulary size down to the loss (rho1 passes the same check)."""
    config = recipe_config(tmp_path, tinyllama_llemma_data, llemma_teacher, guidance={"method": "kld"})
    pretrain_here(config, "--train.max_tokens", str(3 * 4 * 64), "--train.save_interval", "null")
    rows = metrics(tmp_path / "out")
    assert len(rows) == 3 and all(math.isfinite(row["loss"]) and row["distill_loss"] > 0 for row in rows)
    assert (tmp_path / "out" / "final" / "lit_model.pth").is_file()


# A 2-layer student with grouped-query attention (4 query heads, 2 key-value groups): test_convert_from_litgpt.py
# converts the two-process run's final checkpoint, whose attention LitGPT's conversion splits into q, k and v.
GQA_STUDENT = Config(
    **model_config_fields(tiny_config("student", 32000, n_layer=2, block_size=64)) | {"n_head": 4, "n_query_groups": 2}
)
TWO_PROCESS_STEPS = 4  # of 2 micro-batches of one block (one a rank on 2 processes)


def two_process_config(directory: Path, data_path: Path, teacher_dir: Path, student: Path, devices: int) -> Path:
    """`recipe_config` in `directory` (made) for `two_process_run` and the one process it is compared with: the
    `GQA_STUDENT` continued from `student`, its blocks wrapped for activation checkpointing as the paper's runs wrap
    them."""
    directory.mkdir()
    config = recipe_config(
        directory,
        data_path,
        teacher_dir,
        devices=devices,
        initial_checkpoint_dir=str(student),
        fsdp={"activation_checkpointing": True},
    )
    settings = yaml.safe_load(config.read_text())
    settings["model_config"] = model_config_fields(GQA_STUDENT) | {"n_query_groups": GQA_STUDENT.n_query_groups}
    settings["train"] |= {"micro_batch_size": 1, "global_batch_size": 2, "save_interval": None}
    settings["train"]["max_tokens"] = TWO_PROCESS_STEPS * 2 * 64
    config.write_text(yaml.safe_dump(settings))
    return config


@pytest.fixture(scope="session")
def two_process_run(tmp_path_factory, worker_id, tinyllama_mistral_data, mistral_teacher) -> Path:
    """`litgpt pretrain --recipe vocagnolm` on 2 processes (FSDP2 over gloo), once per session for pytest-xdist's
    workers (`built_once`): its folder, with student/ (the checkpoint it continued from) and run/ (its config.yaml and
    out/). Two tests read it: test_two_process_fsdp_matches_one_process and test_convert_from_litgpt.py's."""

    def build(folder: Path) -> None:
        # Continued from a checkpoint, as continual pretraining does: initialising on the meta device and materialising
        # each shard draws the random numbers in another order than one process does.
        student = make_checkpoint(folder / "student", GQA_STUDENT, TINYLLAMA, seed=3)
        litgpt_pretrain(two_process_config(folder / "run", tinyllama_mistral_data, mistral_teacher, student, 2))

    return built_once(tmp_path_factory, worker_id, "two-process-run", build)


@pytest.mark.slow
def test_two_process_fsdp_matches_one_process(tmp_path, two_process_run, tinyllama_mistral_data, mistral_teacher):
    """FSDP2 (ModelParallelStrategy, gloo) on 2 CPU processes = 1 process accumulating the same 2 micro-batches: the
    loss curve and the logged step metrics. The one process is this one (`typed_here`), from the same checkpoint."""
    config = two_process_config(
        tmp_path / "one", tinyllama_mistral_data, mistral_teacher, two_process_run / "student", devices=1
    )
    pretrain_here(config)
    curves = {}
    for devices, run_dir in ((1, tmp_path / "one"), (2, two_process_run / "run")):
        # The step metrics are reduced over the ranks as the loss is: 2 ranks' micro-batches = 1 rank's 2.
        curves[devices] = [[row[name] for name in ("loss", "student_loss")] for row in metrics(run_dir / "out")]
        assert (run_dir / "out" / "final" / "lit_model.pth").is_file()
    assert len(curves[1]) == len(curves[2]) == TWO_PROCESS_STEPS
    torch.testing.assert_close(torch.tensor(curves[2]), torch.tensor(curves[1]), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_kill_and_resume_past_a_damaged_checkpoint_equals_uninterrupted_run(
    tmp_path, tinyllama_mistral_data, mistral_teacher
):
    """kill -9 of a run's process, its newest checkpoint damaged, then `--resume auto` (in this process, as the
    uninterrupted run): the resumed run ends with the uninterrupted one's weights."""
    args = ["--train.save_interval", "2", "--train.max_tokens", str(8 * 4 * 64)]
    (tmp_path / "whole").mkdir()
    pretrain_here(recipe_config(tmp_path / "whole", tinyllama_mistral_data, mistral_teacher), *args)

    (tmp_path / "killed").mkdir()
    killed = recipe_config(tmp_path / "killed", tinyllama_mistral_data, mistral_teacher)
    command = [str(BIN / "litgpt"), "pretrain", "--recipe", "vocagnolm", "--config", str(killed), *args]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    checkpoint = tmp_path / "killed" / "out" / "step-00000004"  # appears once complete
    deadline = time.time() + 300
    while not checkpoint.exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert checkpoint.exists() and not (tmp_path / "killed" / "out" / "final").exists()
    # The newest checkpoint damaged (a node lost while the file system flushed it): resume from the one before.
    newest = max((tmp_path / "killed" / "out").glob("step-*"))
    shard = newest / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:1000])

    out = pretrain_here(killed, *args, "--resume", "auto")
    assert f"Skipping {newest}: {shard} does not match its checksum" in out.stdout
    resumed_step = int(re.search(r"Resuming training from \S*step-(\d+)", out.stdout)[1])
    assert resumed_step == int(newest.name.removeprefix("step-")) - 2
    # Speed counts the tokens this run trained (2 micro-batches of 2 x 64 per step), not those before the resume.
    run_tokens = (8 - resumed_step) * 2 * 2 * 64
    assert f"| - This run      : {run_tokens:,} tokens" in out.stdout
    seconds = float(re.search(r"Training Time : ([\d.]+) s", out.stdout)[1])
    assert float(re.search(r"Tok/sec       : ([\d.]+)", out.stdout)[1]) == pytest.approx(run_tokens / seconds, rel=0.01)
    resumed = torch.load(tmp_path / "killed" / "out" / "final" / "lit_model.pth", weights_only=True)
    reference = torch.load(tmp_path / "whole" / "out" / "final" / "lit_model.pth", weights_only=True)
    assert (resumed["step_count"], resumed["iter_num"]) == (reference["step_count"], reference["iter_num"]) == (8, 16)
    for name, tensor in reference["model"].items():
        torch.testing.assert_close(resumed["model"][name], tensor, rtol=0, atol=1e-6, msg=name)


SLURM_JOB = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NAME": "vocagnolm",
    "SLURM_NNODES": "1",
    "SLURM_NODEID": "0",
    "SLURM_NODELIST": "localhost",
}


def slurm_task(rank: int, tasks: int, bin_dir: Path, port: int) -> dict[str, str]:
    """The environment srun gives task `rank` of a one-node job, with a stub `scontrol` (see `stub_scontrol`) first on
    PATH."""
    slurm = {
        "SLURM_NTASKS": str(tasks),
        "SLURM_NTASKS_PER_NODE": str(tasks),
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(rank),
        "MASTER_PORT": str(port),
    }
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    python_path = os.pathsep.join([str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, **SLURM_JOB, **slurm, "PATH": path, "PYTHONPATH": python_path, "PYTHONUNBUFFERED": "1"}


def stub_scontrol(bin_dir: Path) -> Path:
    """A `scontrol` that appends its arguments to bin_dir/scontrol.calls; returns that file."""
    bin_dir.mkdir()
    calls = bin_dir / "scontrol.calls"
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> "{calls}"\n')
    (bin_dir / "scontrol").chmod(0o755)
    return calls


def start_and_signal(
    command: list[str], envs: list[dict], signalled: int, signum: signal.Signals = signal.SIGUSR1
) -> list[tuple[int, str]]:
    """Starts one process per environment (as srun starts tasks), each in its own process group; once training has
    started, sends `signum` to every process of task `signalled`'s group (its loader workers too, as Slurm signals every
    process of a step, and Ctrl-C every process of the terminal's foreground group). Returns each task's (exit status,
    output)."""
    processes = [
        subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for env in envs
    ]
    lines = []
    for line in processes[0].stdout:  # rank 0 prints
        lines.append(line)
        if line.startswith("Epoch 1 | iter"):  # a step is done: the loader's workers run
            os.killpg(processes[signalled].pid, signum)
            break
    outputs = [process.communicate(timeout=600)[0] for process in processes]
    return [(process.returncode, out) for process, out in zip(processes, ["".join(lines) + outputs[0], *outputs[1:]])]


STEPS = 8  # of 2 micro-batches of 2 blocks of 64 tokens


def signal_run_args(steps: int = STEPS) -> list[str]:
    """The runs that the signal and resume tests compare: no step checkpoint, a constant learning rate (so that a
    finished shorter run is the beginning of a longer one; a decaying one is resumed by
    `test_kill_and_resume_past_a_damaged_checkpoint_equals_uninterrupted_run`),
    validation every 4 steps."""
    budget = ["--train.save_interval", "null", "--train.max_tokens", str(steps * 4 * 64), "--eval.interval", "4"]
    return [*budget, "--train.lr_warmup_steps", "0", "--train.min_lr", "1e-2"]


def signal_run_config(directory: Path, data_path: Path, teacher_dir: Path) -> Path:
    """`recipe_config` in `directory` (made) with one loader worker, which the signals reach too."""
    directory.mkdir(exist_ok=True)
    data = {"class_path": "litgpt_vocagnolm.data.VocAgnoData", "init_args": {"path": str(data_path), "num_workers": 1}}
    return recipe_config(directory, data_path, teacher_dir, data=data)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tinyllama_mistral_data, mistral_teacher) -> tuple[Path, str]:
    """A run of `signal_run_args` from start to end, in this process: its out_dir and its console output."""
    directory = tmp_path_factory.mktemp("uninterrupted")
    out = pretrain_here(signal_run_config(directory, tinyllama_mistral_data, mistral_teacher), *signal_run_args())
    return directory / "out", out.stdout


def assert_same_run(out_dir: Path, reference: Path) -> None:
    """The losses that `out_dir`'s runs logged, step by step, and its final weights are `reference`'s."""
    losses, expected = ([(row["step"], row["loss"]) for row in metrics(path)] for path in (out_dir, reference))
    assert [step for step, _ in losses] == [step for step, _ in expected] == list(range(1, STEPS + 1))
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), rtol=0, atol=1e-6)
    resumed = torch.load(out_dir / "final" / "lit_model.pth", weights_only=True)
    whole = torch.load(reference / "final" / "lit_model.pth", weights_only=True)
    assert (resumed["step_count"], resumed["iter_num"]) == (whole["step_count"], whole["iter_num"]) == (STEPS, 16)
    for name, tensor in whole["model"].items():
        torch.testing.assert_close(resumed["model"][name], tensor, rtol=0, atol=1e-6, msg=name)


@pytest.mark.slow
def test_metrics_are_logged_at_the_optimizer_step_the_console_prints(uninterrupted):
    """metrics.csv's `step`, of the training lines, the validations and the final validation, is the optimizer step
    that the console's lines print (`step N`), whatever the micro-batches per step (here 2)."""
    out_dir, stdout = uninterrupted
    printed = [int(step) for step in re.findall(r"^Epoch \d+ \| iter \d+ step (\d+) \|", stdout, flags=re.M)]
    rows = metric_rows(out_dir)
    assert [row["step"] for row in rows if "loss" in row] == printed == list(range(1, STEPS + 1))
    assert [row["iter"] for row in rows if "loss" in row] == [2 * step for step in printed]
    assert [row["step"] for row in rows if "val_loss" in row] == [4, 8, 8]  # --eval.interval 4, then the final


def signalled_run(tmp_path: Path, data_path: Path, teacher_dir: Path, signum: signal.Signals) -> tuple[Path, dict]:
    """The run of `signal_run_args` as task 0 of a one-task Slurm job (a stub `scontrol`), sent `signum` once it has
    trained a step, to it and its loader worker: it ends its step, saves it, says in one line where `--resume auto`
    continues and exits: 75 after `scontrol requeue` of the job on SIGUSR1, 128 + the signal's number and no requeue
    on the others. Returns its config and environment."""
    calls = stub_scontrol(tmp_path / "bin")
    env = slurm_task(0, 1, tmp_path / "bin", port=free_port())
    config = signal_run_config(tmp_path / "job", data_path, teacher_dir)
    command = [str(BIN / "litgpt"), "pretrain", "--recipe", "vocagnolm", "--config", str(config), *signal_run_args()]
    requeued = "requeue 4242\n" if signum == signal.SIGUSR1 else ""
    ((status, out),) = start_and_signal(command, [env], signalled=0, signum=signum)
    assert status == (os.EX_TEMPFAIL if requeued else 128 + signum), out[-5000:]
    assert "Traceback" not in out, out[-5000:]  # from the main process or its loader worker
    stopped = int(re.search(rf"^Stopped after step (\d+) on {signum.name}", out, flags=re.M)[1])
    job = tmp_path / "job" / "out"
    checkpoint = job / f"step-{stopped:08d}"
    assert (
        f"Stopped after step {stopped} on {signum.name}: saved {str(checkpoint)!r}; the same command with --resume auto"
        " continues from there.\n" in out
    )
    announced = f"{signum.name}: the run stops after its next log or checkpoint step, saving it; a second"
    assert out.count(announced) == (0 if requeued else 1)
    assert (calls.read_text() if calls.exists() else "") == requeued
    assert 1 <= stopped < STEPS
    assert [p.name for p in job.glob("step-*")] == [checkpoint.name] and not (job / "final").exists()
    saved = json.loads((checkpoint / "train_state.json").read_text())
    assert (saved["step_count"], saved["iter_num"]) == (stopped, 2 * stopped)
    return config, env


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=lambda signum: signum.name)
def test_a_signal_saves_the_step_and_exits(tmp_path, tinyllama_mistral_data, mistral_teacher, signum):
    """Ctrl-C, and scancel or preemption (SIGTERM), to the run and its loader worker: `signalled_run`. The run that
    each leaves is resumed in `make test-long` (the test below); SIGUSR1's, in `make test`, is resumed from the same
    step checkpoint by the same `--resume auto`, whichever signal stopped the run."""
    signalled_run(tmp_path, tinyllama_mistral_data, mistral_teacher, signum)


@pytest.mark.slow
@pytest.mark.parametrize(
    "signum",
    [
        signal.SIGUSR1,
        pytest.param(signal.SIGINT, marks=pytest.mark.long),
        pytest.param(signal.SIGTERM, marks=pytest.mark.long),
    ],
    ids=lambda signum: signum.name,
)
def test_a_signal_saves_the_step_exits_and_resume_finishes_as_uninterrupted(
    tmp_path, tinyllama_mistral_data, mistral_teacher, uninterrupted, signum
):
    """Slurm's warning before the time limit (`--signal=SIGUSR1@120`), Ctrl-C, and scancel or preemption (SIGTERM):
    the run stops (`signalled_run`). Resumed (the requeued job, or the same command again), it ends as an
    uninterrupted one."""
    config, env = signalled_run(tmp_path, tinyllama_mistral_data, mistral_teacher, signum)
    requeued = "requeue 4242\n" if signum == signal.SIGUSR1 else ""
    job, calls = tmp_path / "job" / "out", tmp_path / "bin" / "scontrol.calls"
    (checkpoint,) = job.glob("step-*")
    out = litgpt_pretrain(config, *signal_run_args(), "--resume", "auto", env=env)
    assert f"Resuming training from {checkpoint}" in out.stdout
    assert (calls.read_text() if calls.exists() else "") == requeued  # it finished: no requeue
    assert_same_run(job, uninterrupted[0])


@pytest.mark.slow
def test_a_second_ctrl_c_stops_at_once_saving_nothing(tmp_path, tinyllama_mistral_data, mistral_teacher):
    """Ctrl-C, then Ctrl-C again while the run goes on to its stop: it ends at once, exit status 130, without the
    stop's checkpoint, in one line naming the checkpoint `--resume auto` would take."""
    config = recipe_config(tmp_path, tinyllama_mistral_data, mistral_teacher)
    # The stop is read on log and save steps: Ctrl-C after step 10's line is read at step 14, the second comes before.
    args = ["--train.save_interval", "7", "--train.log_interval", "10", "--train.max_tokens", str(40 * 4 * 64)]
    command = [str(BIN / "litgpt"), "pretrain", "--recipe", "vocagnolm", "--config", str(config), *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.startswith("Epoch 1 | iter 20 step 10 |"):
            os.killpg(process.pid, signal.SIGINT)
        elif line.startswith("SIGINT: the run stops after its next log or checkpoint step"):
            os.killpg(process.pid, signal.SIGINT)
            break
    out = "".join(lines) + process.communicate(timeout=300)[0]
    assert process.returncode == 130, out[-5000:]
    assert "Traceback" not in out and "Stopped after" not in out, out[-5000:]
    assert [p.name for p in (tmp_path / "out").glob("step-*")] == ["step-00000007"]  # not the stop's, step 14
    assert not (tmp_path / "out" / "final").exists()
    newest = tmp_path / "out" / "step-00000007"
    line = f"Stopped at once on a second SIGINT, saving nothing: --resume auto would continue from {str(newest)!r}"
    assert out.count(line) == 1 and f"{line} (step 7).\n" in out


@pytest.mark.slow
def test_resume_auto_continues_a_finished_run_on_a_larger_budget_and_refuses_the_same(
    tmp_path, tinyllama_mistral_data, mistral_teacher, uninterrupted
):
    """A finished run that saved no step checkpoint, only final/, continues from its last step with `--resume auto`
    and a larger `--train.max_tokens`, and ends as the longer run does, step by step. With its budget trained already,
    it is refused in one line, its final/ kept: never started afresh over it. (Every run in this process.)"""
    config = signal_run_config(tmp_path, tinyllama_mistral_data, mistral_teacher)
    out_dir = tmp_path / "out"
    pretrain_here(config, *signal_run_args(steps=STEPS // 2))
    assert not list(out_dir.glob("step-*"))
    out = pretrain_here(config, *signal_run_args(), "--resume", "auto")
    assert f"Resuming training from {out_dir / 'final'} after {STEPS // 2 * 4} blocks" in out.stdout
    assert_same_run(out_dir, uninterrupted[0])

    finished = (out_dir / "final" / "checksums.json").read_text()
    command = [BIN / "litgpt", "pretrain", "--recipe", "vocagnolm", "--config", config]
    refused = typed_here(*command, *signal_run_args(), "--resume", "auto")
    assert_one_line(
        refused,
        "litgpt pretrain --recipe vocagnolm",
        f"{out_dir / 'final'} holds a finished run, trained to step {STEPS}, and this run's budget (--train.max_tokens,"
        f" --train.max_steps) is {STEPS} steps of 256 tokens: nothing is left to train.",
    )
    assert (out_dir / "final" / "checksums.json").read_text() == finished


@pytest.mark.slow
def test_sigusr1_to_one_rank_stops_every_rank_after_the_same_step(tmp_path, tinyllama_mistral_data, mistral_teacher):
    """Two tasks as srun starts them (FSDP2 over gloo); only rank 1 gets the signal: both end the same step, one
    checkpoint is saved, rank 0 alone requeues, both exit 75 (a rank that stopped alone would hang the other)."""
    calls = stub_scontrol(tmp_path / "bin")
    port = free_port()
    config = recipe_config(tmp_path, tinyllama_mistral_data, mistral_teacher, devices=2)
    command = [
        str(BIN / "litgpt"),
        "pretrain",
        "--recipe",
        "vocagnolm",
        "--config",
        str(config),
        "--train.micro_batch_size",
        "1",
        "--train.global_batch_size",
        "2",
        "--train.save_interval",
        "null",
        "--train.max_tokens",
        str(24 * 2 * 64),
    ]
    envs = [slurm_task(rank, 2, tmp_path / "bin", port) for rank in range(2)]
    (status_0, out_0), (status_1, out_1) = start_and_signal(command, envs, signalled=1)
    assert status_0 == status_1 == os.EX_TEMPFAIL, out_0[-3000:] + out_1[-3000:]
    stopped = int(re.search(r"Stopped after step (\d+) on SIGUSR1", out_0).group(1))
    assert 1 <= stopped < 24
    assert [p.name for p in (tmp_path / "out").glob("step-*")] == [f"step-{stopped:08d}"]
    # Every rank writes its shard: the checkpoint completes, with this step's counters, only if rank 1 saved it too.
    saved = json.loads((tmp_path / "out" / f"step-{stopped:08d}" / "train_state.json").read_text())
    assert (saved["step_count"], saved["iter_num"], saved["world_size"]) == (stopped, stopped, 2)
    assert len(list((tmp_path / "out" / f"step-{stopped:08d}").glob("__*_0.distcp"))) == 2
    assert calls.read_text() == "requeue 4242\n"


def _setup_error(tmp_path, data, teacher, **kwargs) -> str:
    from litgpt.args import TrainArgs

    from litgpt_vocagnolm.data.prepared import VocAgnoData

    args = dict(
        model_name="pythia-14m",
        out_dir=tmp_path / "out",
        data=VocAgnoData(path=data),
        tokenizer_dir=TINYLLAMA,
        train=TrainArgs(max_tokens=1000, max_norm=1.0),
        teacher=TeacherArgs(checkpoint_dir=teacher),
        devices=1,
    )
    args.update(kwargs)
    with pytest.raises((ValueError, FileNotFoundError)) as error:
        setup(**args)
    assert not (tmp_path / "out").exists()  # failed before any model, logger or output
    return str(error.value)


def test_bad_configuration_fails_before_any_model(tmp_path, tinyllama_mistral_data, mistral_teacher, qwen_teacher):
    message = _setup_error(tmp_path, tinyllama_mistral_data, qwen_teacher)  # data prepared for Mistral's tokenizer
    assert "teacher tokenizer is not the one" in message and "sha256" in message

    message = _setup_error(tmp_path, tinyllama_mistral_data, mistral_teacher, tokenizer_dir=MISTRAL)
    assert "student tokenizer is not the one" in message

    empty = tmp_path / "empty-teacher"
    empty.mkdir()
    message = _setup_error(tmp_path, tinyllama_mistral_data, empty)
    assert "lacks ['lit_model.pth', 'model_config.yaml']" in message

    with pytest.raises(ValueError, match=r"top_k must be in \(0, 1\]"):
        GuidanceArgs(top_k=1.5)

    message = _setup_error(tmp_path, tinyllama_mistral_data, mistral_teacher, guidance=GuidanceArgs(method="kld"))
    assert "needs a teacher with the student's vocabulary" in message

    message = _setup_error(tmp_path, tinyllama_mistral_data, None)
    assert "--teacher.checkpoint_dir" in message


def test_same_vocabulary_methods_pass_the_checks_with_llemma(tinyllama_llemma_data, llemma_teacher):
    from litgpt.args import TrainArgs

    from litgpt_vocagnolm.data.prepared import VocAgnoData
    from litgpt_vocagnolm.training.checks import check_setup

    train = TrainArgs(max_tokens=1000, max_norm=1.0)
    for method in ("rho1", "kld"):
        data = VocAgnoData(path=tinyllama_llemma_data)
        check_setup(
            tiny_config("student", 32000),
            data,
            train,
            TeacherArgs(checkpoint_dir=llemma_teacher),
            GuidanceArgs(method=method),
            tokenizer_dir=TINYLLAMA,
        )


def test_teacher_vocabulary_larger_than_padded_size_fails(tmp_path, tinyllama_qwen_data):
    config = tiny_config("too-small", 32000)  # Qwen's tokenizer has 151,665 tokens
    teacher = make_checkpoint(tmp_path / "teacher", config, QWEN)
    message = _setup_error(tmp_path, tinyllama_qwen_data, teacher)
    assert "151665" in message and "padded_vocab_size" in message


def test_student_vocabulary_smaller_than_its_tokenizer_fails(tmp_path, tinyllama_mistral_data, mistral_teacher):
    for method in ("vocagnolm", "ce"):  # TinyLlama's tokenizer has 32,000 tokens
        message = _setup_error(
            tmp_path,
            tinyllama_mistral_data,
            mistral_teacher,
            guidance=GuidanceArgs(method=method),
            model_config=tiny_config("student", 16000),
        )
        assert "--tokenizer_dir" in message and "32000 tokens but the model only 16000 (padded_vocab_size" in message


def test_ce_checks_the_student_tokenizer_too(tmp_path, tinyllama_mistral_data):
    """The data was prepared with TinyLlama's tokenizer; Mistral's would train and ship in every checkpoint."""
    ce = GuidanceArgs(method="ce")
    message = _setup_error(tmp_path, tinyllama_mistral_data, None, tokenizer_dir=MISTRAL, guidance=ce)
    assert "student tokenizer is not the one" in message and "sha256" in message
    message = _setup_error(tmp_path, tinyllama_mistral_data, None, tokenizer_dir=None, guidance=ce)
    assert "--tokenizer_dir" in message


@pytest.mark.parametrize("devices, global_batch_size, expected", [(3, 4, "3 x 2 = 6, so that"), (1, 5, "use 4 or 6,")])
def test_global_batch_not_divisible_by_devices_times_micro_batch_fails(
    tmp_path, tinyllama_mistral_data, mistral_teacher, devices, global_batch_size, expected
):
    from litgpt.args import TrainArgs

    train = TrainArgs(global_batch_size=global_batch_size, micro_batch_size=2, max_tokens=1000, max_norm=1.0)
    message = _setup_error(tmp_path, tinyllama_mistral_data, mistral_teacher, devices=devices, train=train)
    assert f"--train.global_batch_size {global_batch_size} must be a multiple of (--devices x --num_nodes) x" in message
    assert expected in message


@pytest.mark.parametrize("steps", [1, 3])
def test_a_run_shorter_than_its_warm_up_trains_and_ends(tmp_path, tinyllama_mistral_data, capsys, steps):
    """100 warm-up steps asked, fewer taken: warm-up capped one short of the run, so 3 steps get lr/2, lr (the peak),
    then the end of the cosine decay, min_lr; 1 step gets min_lr. Uncapped, the schedule divides by zero at the last
    step and no final/ is written."""
    from litgpt.args import EvalArgs, TrainArgs

    from litgpt_vocagnolm.data.prepared import VocAgnoData

    lr, min_lr = 1e-2, 1e-3
    setup(
        model_config=tiny_config("student", 32000, block_size=64),
        out_dir=tmp_path / "out",
        precision="32-true",
        data=VocAgnoData(path=tinyllama_mistral_data, num_workers=0),
        tokenizer_dir=TINYLLAMA,
        devices=1,
        train=TrainArgs(
            global_batch_size=2,
            micro_batch_size=2,
            max_tokens=steps * 2 * 64,
            max_seq_length=64,
            lr_warmup_steps=100,
            max_norm=1.0,
            min_lr=min_lr,
            save_interval=None,
            log_interval=1,
        ),
        eval=EvalArgs(interval=100, max_iters=1),
        logger_name="csv",
        guidance=GuidanceArgs(method="ce"),
        optimizer={"class_path": "torch.optim.AdamW", "init_args": {"lr": lr}},
    )
    assert f"Warm-up capped at {steps - 1} steps: the run has {steps}" in capsys.readouterr().out
    expected = {1: [min_lr], 3: [lr / 2, lr, min_lr]}[steps]
    assert [row["learning_rate"] for row in metrics(tmp_path / "out")] == pytest.approx(expected)
    assert torch.load(tmp_path / "out" / "final" / "lit_model.pth", weights_only=True)["step_count"] == steps


def test_a_step_larger_than_the_train_split_says_how_often_it_reads_each_block(tinyllama_mistral_data, capsys):
    """A global batch of more blocks than the train split holds reads blocks more than once a step: said at start, with
    the split's size (from the manifest), and not said for a global batch that the split holds."""
    from types import SimpleNamespace

    import lightning as L
    from litgpt.args import TrainArgs

    from litgpt_vocagnolm.data.order import train_loader
    from litgpt_vocagnolm.data.prepared import VocAgnoData
    from litgpt_vocagnolm.loss.methods import GuidanceArgs, GuidedLoss
    from litgpt_vocagnolm.training.micro_batch import Guide
    from litgpt_vocagnolm.training.step import Loop

    blocks = json.loads((tinyllama_mistral_data / "manifest.json").read_text())["splits"]["train"]["blocks"]
    data = VocAgnoData(tinyllama_mistral_data, num_workers=0)
    data.connect(batch_size=4, max_seq_length=64)
    fabric = L.Fabric(devices=1, accelerator="cpu")
    state = {"model": SimpleNamespace(max_seq_length=64), "iter_num": 0, "step_count": 0}
    guide = Guide([], GuidedLoss(GuidanceArgs(method="ce")))
    for global_batch_size in (blocks // 4 * 4, 2 * blocks // 4 * 4 + 4):
        train = TrainArgs(global_batch_size=global_batch_size, micro_batch_size=4, max_tokens=10**6)
        Loop.start(fabric, state, train_loader(data, 0, 0, 1), train, guide)
        said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("Each optimizer step reads")]
        if global_batch_size <= blocks:
            assert said == []
        else:
            assert said == [
                f"Each optimizer step reads {global_batch_size:,} blocks from a train split of {blocks:,}: every block"
                f" {global_batch_size / blocks:.2f} times on average. Lower --train.global_batch_size, or prepare more"
                " data, to read each block at most once a step."
            ]


def test_slurm_environment_is_detected(monkeypatch):
    """What srun sets for task 11 of a 4 x 8 job: Fabric must form the 32-process group from it."""
    import lightning as L
    from lightning.fabric.plugins.environments import SLURMEnvironment
    from lightning.fabric.strategies import ModelParallelStrategy

    for name in list(os.environ):
        if name.startswith("SLURM_"):
            monkeypatch.delenv(name)
    for name in ("MASTER_ADDR", "MASTER_PORT"):  # Fabric sets them from SLURM_*: undone after the test (set first, so
        monkeypatch.setenv(name, "")  # that monkeypatch records them), or a later multi-process test would look for
        monkeypatch.delenv(name)  # its main process on "gpu07"
    slurm = {
        "SLURM_NTASKS": "32",
        "SLURM_NTASKS_PER_NODE": "8",
        "SLURM_NNODES": "4",
        "SLURM_PROCID": "11",
        "SLURM_LOCALID": "3",
        "SLURM_NODEID": "1",
        "SLURM_NODELIST": "gpu[07-10]",
        "SLURM_JOB_ID": "1234",
        "SLURM_JOB_NAME": "vocagnolm",
    }
    for name, value in slurm.items():
        monkeypatch.setenv(name, value)
    strategy = ModelParallelStrategy(parallelize_fn=lambda m, mesh: m, data_parallel_size=32, tensor_parallel_size=1)
    fabric = L.Fabric(accelerator="cpu", devices=8, num_nodes=4, strategy=strategy)
    environment = fabric._connector.cluster_environment
    assert isinstance(environment, SLURMEnvironment)
    assert (environment.world_size(), environment.global_rank(), environment.local_rank(), environment.node_rank()) == (
        32,
        11,
        3,
        1,
    )
    assert environment.main_address == "gpu07"

    sbatch = (RECIPES / "slurm" / "vocagnolm.sbatch").read_text()
    assert "#SBATCH --nodes=4" in sbatch and "#SBATCH --ntasks-per-node=8" in sbatch
    # The shape comes from the allocation: these 8 tasks per node on 4 nodes, whatever the header asked for.
    assert "srun litgpt pretrain --recipe vocagnolm" in sbatch
    assert '--devices "$TASKS_PER_NODE" --num_nodes "$SLURM_NNODES" --resume auto' in sbatch


@pytest.mark.parametrize(
    "script, args, srun",
    [
        (
            "vocagnolm.sbatch",
            ["recipes/x.yaml", "--train.max_tokens", "1e9"],
            "litgpt pretrain --recipe vocagnolm --config recipes/x.yaml --devices 8 --num_nodes 4 --resume auto"
            " --train.max_tokens 1e9",
        ),
        (
            "score-teacher.sbatch",
            ["data/x", "checkpoints/y"],
            "vocagnolm score-teacher --data data/x --teacher checkpoints/y --devices 8 --num_nodes 4",
        ),
    ],
)
def test_sbatch_scripts_make_their_log_directory_then_submit_themselves(tmp_path, script, args, srun):
    """Slurm opens `--output=logs/...` before the script runs: run with bash, a script makes logs/ and submits itself;
    as the job (here 4 nodes x 8 tasks), it runs srun with the allocation's shape. Requeued runs append to the log."""
    path = RECIPES / "slurm" / script
    text = path.read_text()
    assert "#SBATCH --output=logs/%x-%j.out" in text and "#SBATCH --open-mode=append" in text
    assert "#SBATCH --requeue" in text
    if script == "vocagnolm.sbatch":
        assert "#SBATCH --signal=USR1@120" in text  # to the tasks (B:USR1 would reach only the batch shell)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sbatch", "srun"):
        (bin_dir / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> "{tmp_path / "calls"}"\n')
        (bin_dir / tool).chmod(0o755)
    (bin_dir / "scontrol").write_text('#!/bin/sh\necho "NodeName=gpu07 NodeAddr=10.1.0.7"\n')  # hostnames, node
    (bin_dir / "scontrol").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    work = tmp_path / "repo"
    work.mkdir()
    job = {"SLURM_JOB_ID": "7", "SLURM_NNODES": "4", "SLURM_NTASKS_PER_NODE": "8", "SLURM_JOB_NODELIST": "gpu[07-10]"}
    for job_env in ({}, job):
        run = subprocess.run(
            ["bash", str(path), *args], cwd=work, env={**env, **job_env}, capture_output=True, text=True, timeout=60
        )
        assert run.returncode == 0, run.stderr
    assert (work / "logs").is_dir()
    assert (tmp_path / "calls").read_text().splitlines() == [f"sbatch {path} {' '.join(args)}", f"srun {srun}"]


@pytest.mark.parametrize("method", ["ce", "vocagnolm", "chunk", "random", "uld", "rho1", "kld"])
def test_every_method_trains_through_forward_and_loss(method, tinyllama_mistral_data, tinyllama_llemma_data):
    """One micro-batch of real prepared data per method: finite loss, gradients on the student only. rho1 and kld
    with Table 1's same-vocabulary teacher, Llemma (32,016 tokens: TinyLlama's 32,000 and 16 more)."""
    from litgpt_vocagnolm.data.prepared import VocAgnoData
    from litgpt_vocagnolm.loss.methods import GuidedLoss
    from litgpt_vocagnolm.models.gpt import GPT
    from litgpt_vocagnolm.training.micro_batch import Guide, forward_and_loss

    same_vocab = method in ("rho1", "kld")
    guidance = GuidanceArgs(method=method, num_chunks=4)
    data = VocAgnoData(path=tinyllama_llemma_data if same_vocab else tinyllama_mistral_data, num_workers=0)
    data.connect(batch_size=2, max_seq_length=64, num_chunks=guidance.num_chunks_if_chunked)
    guidance.check_tokenizers(same_vocabulary=data.same_vocabulary(TINYLLAMA, LLEMMA if same_vocab else MISTRAL))
    batch = next(iter(data.train_dataloader()))
    torch.manual_seed(0)
    teacher_vocab = 32016 if same_vocab else 32000
    student, teacher = GPT(tiny_config("s", 32000, block_size=64)), GPT(tiny_config("t", teacher_vocab, block_size=256))
    teacher.requires_grad_(False)
    guided = GuidedLoss(guidance, vocab_size=data.manifest["student"]["vocab_size"])
    guide = Guide([Teacher(mode="online", model=teacher)], guided)
    loss_sum, weight_sum, metrics = forward_and_loss(student, guide, batch, positions=torch.arange(2))
    loss_sum.backward()
    valid = (batch.targets != -100).sum()
    assert torch.isfinite(loss_sum) and 0 < weight_sum <= valid
    if method in ("vocagnolm", "chunk", "random", "rho1"):  # trains ceil(0.4 * mapped) plus the unmapped tokens
        mapped = round(metrics["mapped_fraction"].item() * valid.item())
        assert weight_sum == math.ceil(0.4 * mapped) + (valid - mapped)
    else:
        assert weight_sum == valid
    if method in ("uld", "kld"):
        assert metrics["distill_loss"] > 0
    assert all(p.grad is not None for p in student.parameters()) and all(p.grad is None for p in teacher.parameters())


def test_a_warning_after_the_run_does_not_kill_the_finished_process(tmp_path):
    """Slurm's SIGUSR1 may come while a finished run tears down (seen under a real Slurm: the job then counts as
    failed). Leaving `stop_signal` ignores it where the default would end the process, and keeps a caller's handler;
    Ctrl-C and SIGTERM get theirs back."""
    from litgpt_vocagnolm.training.slurm import stop_signal

    previous = signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        with stop_signal(tmp_path) as stop:
            os.kill(os.getpid(), signal.SIGUSR1)
            assert stop.wait(5) and stop.cancel is None
        assert signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN
        assert {signum: signal.getsignal(signum) for signum in handlers} == handlers
        os.kill(os.getpid(), signal.SIGUSR1)  # would end pytest under SIG_DFL

        def handler(signum, frame):
            pass

        signal.signal(signal.SIGUSR1, handler)
        with stop_signal(tmp_path):
            pass
        assert signal.getsignal(signal.SIGUSR1) is handler
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_loader_workers_outlive_a_sigterm_that_their_parent_did_not_send():
    """scancel and Slurm's preemption send SIGTERM to every process of the job: a loader worker (`keep_workers`) goes
    on serving, where torch's handler would end it and fail the loader; from the loader's own process, SIGTERM still
    ends it, as torch's handler does (a worker that does not stop when shut down)."""
    from torch.utils.data import DataLoader

    from litgpt_vocagnolm.training.slurm import keep_workers

    class Pids(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 1000

        def __getitem__(self, index: int) -> int:
            return os.getpid()

    batches = iter(keep_workers(DataLoader(Pids(), batch_size=2, num_workers=1)))
    (pid,) = set(next(batches).tolist())
    subprocess.run([sys.executable, "-c", f"import os; os.kill({pid}, {int(signal.SIGTERM)})"], check=True)
    time.sleep(0.5)
    assert all(set(next(batches).tolist()) == {pid} for _ in range(20))
    (worker,) = batches._workers
    os.kill(pid, signal.SIGTERM)
    worker.join(timeout=30)
    assert worker.exitcode == 0
