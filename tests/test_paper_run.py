"""The README's paper run with the user's own paths: checkpoints downloaded somewhere other than `checkpoints/` and the
data prepared elsewhere reach every step through the README's variables S, T and D, with no YAML edited. Steps 2-7
run as typed, stopped where they would start the work (`--dry_run true`, `--print_config`); the sbatch scripts run
with a stand-in `sbatch` and `srun` that record the command a job would run, which then runs the same way.
docs/paper-run.md numbers the steps as the README does."""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import QWEN, ROOT, TINYLLAMA, make_checkpoint, tiny_config
from test_docs import fenced_blocks, shell_lines

from litgpt_vocagnolm import cli

STEP = re.compile(r"# (\d)\) ")  # a step's first comment line in the README's block


def readme_steps() -> tuple[dict[int, list[str]], list[str]]:
    """The README's paper run: each step's command lines by number (continuations joined), and the commands of the
    block after it (the run without Slurm)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = fenced_blocks(text[text.index("## The paper's run") :])
    steps, step = {}, 0
    for _, line in shell_lines(blocks[0][2], blocks[0][1], shell=True):
        if STEP.match(line):
            step = int(STEP.match(line)[1])
        elif line.strip() and not line.startswith("#"):
            steps.setdefault(step, []).append(line)
    return steps, [line for _, line in shell_lines(blocks[1][2], blocks[1][1], shell=True)]


def words(line: str, paths: dict[str, str]) -> list[str]:
    """A command line's words, `$S`, `$T` and `$D` replaced by `paths`."""
    return shlex.split(re.sub(r"\$([A-Z])\b", lambda m: paths[m[1]], line), comments=True)


def run_vocagnolm(argv: list[str], capsys, monkeypatch) -> str:
    """`vocagnolm ...` or `litgpt pretrain --recipe vocagnolm ...` in this process (as test_docs.py runs them): what
    it printed. `--print_config` ends in SystemExit(0)."""
    monkeypatch.setattr(sys, "argv", argv)  # where `litgpt_main` reads its command line, as the .pth hook hands it on
    try:
        if argv[0] == "vocagnolm":
            cli.main(argv[1:])
        else:
            cli.litgpt_main(lambda: pytest.fail("LitGPT's own command ran"))
    except SystemExit as stop:
        assert stop.code in (0, None), capsys.readouterr().err[-3000:]
    return capsys.readouterr().out


def job_command(argv: list[str], tmp_path: Path) -> list[str]:
    """What `bash slurm/SCRIPT ARGS` (`argv`) runs once Slurm starts it on 4 nodes x 8 GPUs: the words it gives
    srun."""
    bin_dir, calls = tmp_path / "fake-slurm", tmp_path / "srun-calls"
    bin_dir.mkdir(exist_ok=True)
    for tool, body in {"srun": f'printf "%s\\n" "$@" > "{calls}"', "scontrol": 'echo "NodeAddr=10.0.0.1"'}.items():
        (bin_dir / tool).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / tool).chmod(0o755)
    job = {"SLURM_JOB_ID": "7", "SLURM_NNODES": "4", "SLURM_NTASKS_PER_NODE": "8", "SLURM_JOB_NODELIST": "gpu1"}
    env = {**os.environ, **job, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return calls.read_text().splitlines()


@pytest.fixture
def elsewhere(tmp_path, monkeypatch) -> dict[str, str]:
    """A folder to run from, with the checkpoints under models/ (as `litgpt download --checkpoint_dir models` leaves
    them), a small OpenWebMath stand-in in data/open-web-math/, and the data to prepare into prepared/: S, T, D."""
    monkeypatch.chdir(tmp_path)
    student = make_checkpoint(
        Path("models/TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T"),
        tiny_config("tiny-student", 32000),
        TINYLLAMA,
    )
    teacher_config = tiny_config("tiny-teacher", 151_936, n_embd=16, block_size=4096)
    teacher = make_checkpoint(Path("models/Qwen/Qwen2.5-Math-7B-Instruct"), teacher_config, QWEN)
    lines = (ROOT / "data/stackexchange/math_stackexchange_33votes.jsonl").read_text(encoding="utf-8").splitlines()
    Path("data/open-web-math").mkdir(parents=True)
    documents = [json.dumps({"text": json.loads(line)["output"]}) + "\n" for line in lines[:40]]
    Path("data/open-web-math/part-0.jsonl").write_text("".join(documents), encoding="utf-8")
    return {"S": str(student), "T": str(teacher), "D": "prepared/owm-tinyllama-qwen2.5"}


def test_the_readme_paper_run_reaches_each_step_with_the_users_paths(elsewhere, tmp_path, capsys, monkeypatch):
    steps, without_slurm = readme_steps()
    assert sorted(steps) == [1, 2, 3, 4, 5, 6, 7]
    assert any(line.startswith("S=") for line in steps[1]) and any(line.startswith("D=") for line in steps[1])
    S, T, D = elsewhere["S"], elsewhere["T"], elsewhere["D"]
    (copy_slurm,) = [line for line in steps[1] if line.startswith("vocagnolm recipes --copy slurm")]
    run_vocagnolm(words(copy_slurm, elsewhere), capsys, monkeypatch)

    # 2-3: prepare reads both tokenizers from S and T and writes to D (step 3 stopped at its dry run here).
    for step in (2, 3):
        (line,) = steps[step]
        argv = words(line, elsewhere)
        assert argv[argv.index("--output") + 1] == D
        printed = run_vocagnolm(argv + ([] if "--dry_run" in argv else ["--dry_run", "true"]), capsys, monkeypatch)
        assert "student tokens" in printed and not Path(D).exists()  # a dry run writes nothing

    # 4: the scoring job scores D with T, and writes D/teacher_loss/<T's folder name> by default.
    (line,) = steps[4]
    assert job_command(words(line, elsewhere), tmp_path)[:6] == [
        "vocagnolm",
        "score-teacher",
        "--data",
        D,
        "--teacher",
        T,
    ]

    # 5: the plan reads the teacher's config from T (this one's name, not Qwen2.5-Math-7B-Instruct's).
    (line,) = steps[5]
    assert "teacher online (tiny-teacher)" in run_vocagnolm(words(line, elsewhere), capsys, monkeypatch)

    # 6 and the run without Slurm: the recipe's settings hold S, T and D, and step 4's cache.
    (line,) = steps[6]
    job = job_command(words(line, elsewhere), tmp_path)
    configs = [
        yaml.safe_load(run_vocagnolm([*argv, "--print_config"], capsys, monkeypatch))
        for argv in (job, words(without_slurm[0], elsewhere))
    ]
    for config in configs:
        assert (config["initial_checkpoint_dir"], config["tokenizer_dir"]) == (S, S)
        assert (config["teacher"]["checkpoint_dir"], config["data"]["init_args"]["path"]) == ([T], D)
    assert configs[0]["teacher"]["cache"] == [f"{D}/teacher_loss/{Path(T).name}"]

    # 7: evaluate reads the checkpoint step 6 writes last.
    (line,) = steps[7]
    assert words(line, elsewhere)[2] == f"{configs[0]['out_dir']}/final"


def test_docs_paper_run_numbers_the_steps_as_the_readme_does():
    """docs/paper-run.md's section N holds the command of the README's step N."""
    steps, _ = readme_steps()
    text = (ROOT / "docs" / "paper-run.md").read_text(encoding="utf-8")
    sections = dict(re.findall(r"^## (\d)\. (.*?)(?=^## |\Z)", text, flags=re.MULTILINE | re.DOTALL))
    assert sorted(map(int, sections)) == sorted(steps)
    for number, lines in steps.items():
        for line in lines:
            if not re.match(r"[A-Z]=", line):  # the variables, which later sections set again
                command = " ".join(line.split()[:2])  # `vocagnolm prepare`, `bash slurm/vocagnolm.sbatch`...
                assert command in sections[str(number)], (number, command)
