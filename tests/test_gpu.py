"""The whole chain on one GPU at the paper's widths (`make test-gpu`), and the same body on the CPU at tiny sizes with
the defaults a GPU picks given explicitly (`make test`): one helper, two scales, as LitGPT's `test_model_1device_cuda`
calls what its CPU twin calls.

The chain, each command as a user types it (its required arguments, the budget, and what a one-GPU run needs):
`vocagnolm prepare` -> `vocagnolm score-teacher` -> `litgpt pretrain --recipe vocagnolm` with the paper's YAML, the
teacher online -> the same from the teacher's loss cache -> the cached run resumed from its step 2 -> `vocagnolm
export` of that step -> `vocagnolm evaluate` (one task, a limit) -> `litgpt generate` on the resumed run's `final/` ->
`vocagnolm plan --measure true` on the paper recipe with its 7B teacher's config.

On one GPU (marked `gpu`; skipped where torch sees no CUDA device): the student is TinyLlama-1.1B's config and the
teacher Qwen2.5-0.5B's (a 151,936-row head), both with random weights, with their real tokenizers (tests/fixtures), on
400 GSM8K problems of data/ (about 39 blocks of 2,048 tokens). Each command runs in a subprocess of its own process
group, so that an abort (a CUDA fault: SIGABRT) fails the test with its output and a command past its time is killed
with its workers. The recipe's budget: 3 optimizer steps of 8 sequences, the recipe's micro-batch (one per step). The
whole takes at most CHAIN_SECONDS, compiles included, each command at most its share (GPU.seconds). A 1.1B student's
checkpoint with its AdamW state is 13 GB: the chain deletes the shards it reads no further (DISK_GB at most at once).

On the CPU (marked `slow`, in `make test`, about 25 s): the same body with 2-layer models of width 64, tokenizers of
512 tokens trained on the corpus, sequences of 128 tokens and 18 problems, each command in this process (`cli.main`,
or LitGPT's `main` behind the recipe dispatch), where every `torch.compile` runs the "aot_eager" backend (dynamo and
AOT autograd, no code generated: inductor would take minutes of a CPU) and what a GPU picks by default is given:
score-teacher's bf16 and compile, plan --measure's compiled scoring, AdamW's fused kernel. The paper's YAML already
sets the recipe's (compile, a bf16-mixed student, a bf16 teacher).

Every command's line, exit status, seconds and the tail of its output go into one log, the file CHAIN_LOG names
(default: chain.log in the test's folder), followed by the figures docs/performance.md quotes from a GPU's run: plan
--measure's table (MFU of each step, the cached step against LitGPT's, planned and measured memory), each training
run's throughput and final save, and each command's seconds.
"""

import contextlib
import io
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
import torch
from conftest import QWEN, RECIPES, ROOT, TINYLLAMA, make_checkpoint, model_config_fields, tiny_config
from litgpt.config import Config
from test_plan import measured_rows
from test_recipe import metrics

from litgpt_vocagnolm.demo.tokenizer_training import train_student_tokenizer, train_teacher_tokenizer

CHAIN_LOG = "VOCAGNOLM_CHAIN_LOG"  # the log's path; `make test-gpu` sets it and prints it
RECIPE = RECIPES / "tinyllama-qwen2.5-math-7b-instruct.yaml"
STEPS, SAVED_STEP = 3, 2  # optimizer steps of each run; the one step the cached run saves, where the resumed starts
GLOBAL_BATCH = 8  # the recipe's micro-batch: one micro-batch per optimizer step on one device
CACHE = "data/teacher_loss/teacher"  # where score-teacher writes by default for a teacher folder named "teacher"
CHAIN_SECONDS = 480  # the whole chain on one H100, compiles and the checkpoints' writing included
DISK_GB = 45  # free disk the GPU chain needs at its peak: checkpoints of both models, a step's and a final's shards
PLAN_BAND = (0.85, 1.15)  # measured peak / plan, as tests/test_plan.py holds the estimate to what the CPU measures
EVAL_LIMIT = 8  # GSM8K questions evaluated (Table 1's whole test sets take hours)
TAIL = 4000  # characters of a command's output in the log and in a failure's message


@dataclass(frozen=True)
class Scale:
    """What differs between the GPU's chain and its CPU twin: the models' sizes, the documents, and what each command
    is given besides what the chain gives them all."""

    student: Config
    teacher: Config
    documents: int
    seq_len: int
    prepare: tuple[str, ...] = ()
    score_teacher: tuple[str, ...] = ()
    student_args: tuple[str, ...] = ()
    """The student's size (`--model_config`, `--train.max_seq_length`) for the recipe and the plan; the paper's YAML
    names TinyLlama-1.1B at sequence 2,048."""
    plan: tuple[str, ...] = ()
    seconds: dict[str, int] = field(default_factory=dict)
    """Each command's limit, by its label; none for a command not named."""
    plan_band: tuple[float, float] | None = None
    """Where the measured peak of each work must lie against the plan's; None: not checked."""
    tokenizer_size: int | None = None
    """None: TinyLlama's and Qwen2.5's own tokenizers (tests/fixtures); else a TinyLlama-like and a Qwen-like BPE of
    this many tokens, trained on the corpus as tests/test_as_typed.py trains them."""


GPU = Scale(
    student=Config.from_name("tiny-llama-1.1b"),
    teacher=Config.from_name("Qwen2.5-0.5B"),
    documents=400,
    seq_len=2048,
    # What each command may take on one H100, cold compiles included: about 1.5x what it should take at the pace the
    # docs/performance.md reports plus process start, compilation and checkpoint writing, which no run has
    # measured yet. CHAIN_SECONDS bounds their sum.
    seconds={
        "prepare": 45,
        "score-teacher": 75,
        "online": 150,
        "cached": 100,
        "resumed": 90,
        "export": 45,
        "evaluate": 75,
        "generate": 45,
        "plan": 300,
    },
    plan_band=PLAN_BAND,
)

TINY_STUDENT = tiny_config("student", 512, n_layer=2, n_embd=64, block_size=128)
TINY_STUDENT_ARGS = ("--model_config", json.dumps(model_config_fields(TINY_STUDENT)), "--train.max_seq_length", "128")
CPU = Scale(
    student=TINY_STUDENT,
    teacher=tiny_config("teacher", 512, n_layer=2, n_embd=64),  # block 256: longer than a window of 129 tokens
    documents=18,
    seq_len=128,
    prepare=("--max_seq_length", "128"),
    score_teacher=("--precision", "bf16-true", "--compile", "true"),  # a GPU's defaults
    student_args=TINY_STUDENT_ARGS,
    plan=(*TINY_STUDENT_ARGS, "--teacher.checkpoint_dir", "teacher"),
    # A CPU's resident memory at these sizes is mostly the allocator's and the compiler's, not the step's: no band.
    # With a 151,665-row head the teacher alone would make this twin take minutes (bf16 products on a CPU).
    tokenizer_size=512,
)

Execute = Callable[[list[str], Path, float | None], tuple[int | str, str]]


def console_script(name: str) -> str:
    """`name`'s console script as pip installed it for this interpreter: in its scripts folder (a virtual
    environment's bin/, the system's), or the user's where pip fell back to a user install."""
    folders = [sysconfig.get_path("scripts"), sysconfig.get_path("scripts", sysconfig.get_preferred_scheme("user"))]
    found = shutil.which(name, path=os.pathsep.join(folders))
    assert found, f"no `{name}` console script in {folders}: install litgpt-vocagnolm (`make test-gpu WHEELS=DIR`)"
    return found


def in_subprocess(args: list[str], cwd: Path, timeout: float | None) -> tuple[int | str, str]:
    """The command as typed, in a process group of its own (killed whole at `timeout`: its loader and compile workers
    too); its exit status (negative: the signal that ended it) and its output, stdout and stderr interleaved."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # the two streams interleaved as they were written
    command = [console_script(args[0]), *args[1:]]
    process = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = process.communicate(timeout=timeout)
        return process.returncode, output
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        return f"killed after {timeout:.0f} s", output


def in_this_process(args: list[str], cwd: Path, timeout: float | None) -> tuple[int | str, str]:
    """The command's entry point in this process, as a fresh process would run it (dynamo's graphs reset): `cli.main`
    for `vocagnolm`, the recipe dispatch in front of LitGPT's `main` for `litgpt`. Untimed."""
    import litgpt.__main__

    from litgpt_vocagnolm import cli

    torch._dynamo.reset()
    output, here, argv = io.StringIO(), Path.cwd(), sys.argv
    rc: int | str = 0
    try:
        os.chdir(cwd)
        sys.argv = args
        with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
            cli.main(args[1:]) if args[0] == "vocagnolm" else cli.litgpt_main(litgpt.__main__.main)
    except SystemExit as exit:
        rc = 0 if exit.code is None else exit.code if isinstance(exit.code, int) else 1
    except Exception:
        rc = "an exception"
        output.write(traceback.format_exc())
    finally:
        os.chdir(here)
        sys.argv = argv
    return rc, output.getvalue()


class Commands:
    """Runs the chain's commands in `root`, one after the other, and writes each into the log: its line, exit status,
    seconds and the tail of its output. A command fails the test unless it exits 0 within its limit (`seconds`, by
    label) and within what is left of `deadline` seconds from when this was made."""

    def __init__(self, root: Path, log: Path, execute: Execute, seconds: dict[str, int], deadline: float | None):
        self.root, self.log, self.execute, self.seconds = root, log, execute, seconds
        self.end = None if deadline is None else time.monotonic() + deadline
        self.outputs: dict[str, str] = {}
        self.took: dict[str, float] = {}
        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"The chain in {root}: torch {torch.__version__}, {device}\n\n")

    def __call__(self, label: str, line: str, *more: str) -> str:
        """Runs `line` (as a shell would split it) followed by `more`; returns its output."""
        args = [*shlex.split(line), *more]
        limit = self.seconds.get(label)
        left = None if self.end is None else max(0.0, self.end - time.monotonic())
        t0 = time.monotonic()
        rc, output = self.execute(args, self.root, min((t for t in (limit, left) if t is not None), default=None))
        self.took[label], self.outputs[label] = time.monotonic() - t0, output
        ran = f"{label}: $ {shlex.join(args)}\nrc {rc} after {self.took[label]:.1f} s (limit {limit} s)"
        self.write(f"{ran}\n{output[-TAIL:]}\n\n")
        assert rc == 0, f"{ran}, log {self.log}:\n{output[-TAIL:]}"
        return output

    def write(self, text: str) -> None:
        with open(self.log, "a", encoding="utf-8") as f:
            f.write(text)


def chain(scale: Scale, root: Path, commands: Commands) -> None:
    """The chain at `scale` in `root`, with what each step must show."""
    t0 = time.monotonic()
    records = (ROOT / "data" / "gsm8k" / "train.jsonl").read_text().splitlines()[: scale.documents]
    texts = [json.loads(line)["question"] + "\n\n" + json.loads(line)["answer"] for line in records]
    (root / "corpus.jsonl").write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    tokenizers = (TINYLLAMA, QWEN)
    if scale.tokenizer_size:
        tokenizers = (
            train_student_tokenizer(texts, scale.tokenizer_size, root / "student-tokenizer"),
            train_teacher_tokenizer(texts, scale.tokenizer_size, root / "teacher-tokenizer"),
        )
    make_checkpoint(root / "student", scale.student, tokenizers[0])
    make_checkpoint(root / "teacher", scale.teacher, tokenizers[1], seed=1)
    commands.took["checkpoints"] = time.monotonic() - t0

    prepare = "vocagnolm prepare --student student --teacher teacher --input corpus.jsonl --output data"
    commands("prepare", prepare, *scale.prepare)
    blocks = json.loads((root / "data" / "manifest.json").read_text())["splits"]["train"]["blocks"]
    assert blocks >= STEPS * GLOBAL_BATCH  # each run trains every block once at most
    commands("score-teacher", "vocagnolm score-teacher --data data --teacher teacher", *scale.score_teacher)

    # The paper's run on one GPU: the checkpoints' paths, a budget of STEPS steps, each step's metrics in a CSV file.
    train = (
        f"litgpt pretrain --recipe vocagnolm --config {shlex.quote(str(RECIPE))} --devices 1 --num_nodes 1"
        " --initial_checkpoint_dir student --tokenizer_dir student --data.path data --teacher.checkpoint_dir teacher"
        f" --train.global_batch_size {GLOBAL_BATCH} --train.max_tokens {STEPS * GLOBAL_BATCH * scale.seq_len}"
        " --train.log_interval 1 --logger_name csv"
    )
    out, step = root / "out", f"out/cached/step-{SAVED_STEP:08d}"
    online = commands("online", f"{train} --out_dir out/online", *scale.student_args)
    assert "Teacher teacher (" in online and (out / "online" / "final" / "lit_model.pth").is_file()
    shutil.rmtree(out / "online" / "final")  # what follows reads its metrics only
    from_cache = f"{train} --teacher.cache {CACHE} --train.save_interval {SAVED_STEP} --out_dir out/cached"
    cached = commands("cached", from_cache, *scale.student_args)
    assert "Teacher teacher (" not in cached and [p.name for p in (out / "cached").glob("step-*")] == [Path(step).name]
    follows_the_online_teacher(metrics(out / "cached"), metrics(out / "online"))
    drop_shards(out / "cached" / "final")  # its lit_model.pth stays, for the resumed run's

    # The YAML names an initial checkpoint, which a resume from a given step may not be given too.
    resume = f"{train} --teacher.cache {CACHE} --initial_checkpoint_dir null --resume {step} --out_dir out/resumed"
    resumed = commands("resumed", resume, *scale.student_args)
    assert f"Resuming training from {step} after {SAVED_STEP * GLOBAL_BATCH} blocks" in resumed
    continues_the_run(out / "resumed", out / "cached")
    drop_shards(out / "resumed" / "final")

    commands("export", f"vocagnolm export {step} exported")
    drop_shards(root / step)
    evaluated = commands("evaluate", f"vocagnolm evaluate exported --tasks gsm8k --limit {EVAL_LIMIT}")
    assert "| model | GSM8K | AVG |" in evaluated and (root / "exported" / "evaluate" / "results.csv").is_file()
    generated = commands("generate", "litgpt generate out/resumed/final")
    # LitGPT read final/ (its weights, config and tokenizer) and printed the prompt and what follows it.
    assert re.search(r"^What food do llamas eat\?", generated, re.MULTILINE) and "Time for inference 1: " in generated

    plan = commands("plan", f"vocagnolm plan --config {shlex.quote(str(RECIPE))} --measure true", *scale.plan)
    measured_as_planned(plan[plan.index("Measured here") :], scale.plan_band)
    commands.write(figures(commands))


def follows_the_online_teacher(cached: list[dict], online: list[dict]) -> None:
    """The cached run's steps against the online run's, within what the cache's float16 rounding of each teacher loss
    allows (tests/test_teacher_cache.py derives these tolerances)."""
    assert [row["iter"] for row in cached] == [row["iter"] for row in online] == list(range(1, STEPS + 1))
    for c, o in zip(cached, online):
        assert c["selected_fraction"] == pytest.approx(o["selected_fraction"], abs=1e-6)
        assert c["loss"] == pytest.approx(o["loss"], rel=2e-3)
        assert c["teacher_loss"] == pytest.approx(o["teacher_loss"], rel=1e-3)


def continues_the_run(resumed: Path, uninterrupted: Path) -> None:
    """The resumed run's steps are the uninterrupted run's last ones, and its final weights that run's."""
    later = [row for row in metrics(uninterrupted) if row["iter"] > SAVED_STEP]
    rows = metrics(resumed)
    assert [row["iter"] for row in rows] == [row["iter"] for row in later] == list(range(SAVED_STEP + 1, STEPS + 1))
    for r, u in zip(rows, later):
        assert (r["loss"], r["teacher_loss"]) == pytest.approx((u["loss"], u["teacher_loss"]), rel=1e-4)
    weights = [
        torch.load(d / "final" / "lit_model.pth", mmap=True, weights_only=True) for d in (resumed, uninterrupted)
    ]
    assert weights[0]["step_count"] == weights[1]["step_count"] == STEPS
    for name, tensor in weights[1]["model"].items():
        torch.testing.assert_close(weights[0]["model"][name], tensor, rtol=1e-4, atol=1e-5, msg=name)


def drop_shards(checkpoint: Path) -> None:
    """Deletes a checkpoint's shards of the student and its AdamW state (13 GB at 1.1B parameters), once nothing
    reads them."""
    for shard in checkpoint.glob("*.distcp"):
        shard.unlink()


def measured_as_planned(printed: str, band: tuple[float, float] | None) -> None:
    """plan --measure's table: the recipe's online step at its micro-batch and half of it, the cached step, scoring and
    LitGPT's step, each measured; each peak within `band` of the plan's."""
    rows = measured_rows(printed)
    assert set(rows) == {("online", 8), ("online", 4), ("cached", 8), ("scoring", 8), ("LitGPT's step", 8)}
    for (work, micro_batch), (planned_gb, peak_gb, _, speed, _, _) in rows.items():
        assert float(peak_gb) > 0 and float(speed.replace(",", "")) > 0, (work, micro_batch)
        if band and planned_gb != "n/a":
            assert band[0] <= float(peak_gb) / float(planned_gb) <= band[1], (work, micro_batch, planned_gb, peak_gb)
    assert re.search(r"Cached step / LitGPT's step, tokens/s at micro-batch 8: [\d.]+x", printed)


def figures(commands: Commands) -> str:
    """What docs/performance.md quotes from this run: plan --measure's report, each training run's throughput and final
    save, score-teacher's and evaluate's pace, and the seconds of each command."""
    outputs = commands.outputs
    lines = ["== Figures", "vocagnolm plan --measure true:"]
    lines += outputs["plan"][outputs["plan"].index("Measured here") :].rstrip().splitlines()
    for run in ("online", "cached", "resumed"):
        lines += [f"{run}:", *final_save(outputs[run]), *(l for l in outputs[run].splitlines() if l.startswith("| - "))]
    pace = re.findall(r"tokens_per_sec=([\d,]+)", outputs["score-teacher"])
    lines.append(f"score-teacher: {pace[-1] if pace else 'n/a'} teacher tokens/s (its last progress line)")
    lines += [
        line
        for line in outputs["evaluate"].splitlines()
        if line.startswith(("Decoding", f"gsm8k: {EVAL_LIMIT} questions"))
    ]
    lines += ["Seconds:", *(f"  {label:<14} {seconds:6.1f}" for label, seconds in commands.took.items())]
    return "\n".join(lines) + "\n"


def final_save(output: str) -> list[str]:
    """A training run's final save as it printed it: "Saving checkpoint to '.../final'" and the seconds of each of its
    phases after it (a library's warnings may come between)."""
    lines = output.splitlines()
    start = next((i for i, line in enumerate(lines) if re.match(r"Saving checkpoint to '[^']*final'", line)), None)
    assert start is not None, "the run printed no final save"
    return [lines[start], *(line for line in lines[start + 1 :] if re.fullmatch(r"  \S.* in [\d.]+ s", line))]


def log_path(default: Path) -> Path:
    return Path(os.environ.get(CHAIN_LOG) or default).absolute()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: run `make test-gpu` on a GPU machine")
def test_chain_on_one_gpu(tmp_path):
    free = shutil.disk_usage(tmp_path).free / 1e9
    assert free >= DISK_GB, (
        f"{free:.0f} GB free in {tmp_path}, the chain needs {DISK_GB}: put pytest's folder on a larger disk"
        " (PYTEST_ADDOPTS=--basetemp=DIR make test-gpu ...)"
    )
    commands = Commands(tmp_path, log_path(tmp_path / "chain.log"), in_subprocess, GPU.seconds, CHAIN_SECONDS)
    chain(GPU, tmp_path, commands)


@pytest.mark.slow
def test_chain_on_the_cpu(tmp_path, monkeypatch, one_thread):
    import litgpt_vocagnolm.planning.measure
    import litgpt_vocagnolm.training.recipe

    # Every torch.compile (each block's, and plan --measure's of LitGPT's whole model) with "aot_eager"; scoring in
    # plan --measure compiled, as on a GPU (score-teacher is told by its --compile).
    compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model=None, **kw: compile(model, **{**kw, "backend": "aot_eager"}))
    monkeypatch.setattr(litgpt_vocagnolm.planning.measure, "compiles_by_default", lambda device: True)
    # AdamW's fused kernel, in the recipe and in plan --measure's steps, as on a GPU.
    monkeypatch.setattr(litgpt_vocagnolm.training.recipe, "fused_optimizer", lambda device: True)
    monkeypatch.setattr(litgpt_vocagnolm.planning.measure, "fused_optimizer", lambda device: True)
    commands = Commands(tmp_path, log_path(tmp_path / "chain.log"), in_this_process, CPU.seconds, None)
    chain(CPU, tmp_path, commands)
