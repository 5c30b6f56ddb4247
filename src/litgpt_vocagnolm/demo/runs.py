"""The demo's runs: the package's own commands in-process (`vocagnolm prepare`, `score-teacher`, the recipe), each
with its console output in a log file, and what their logs say."""

import contextlib
import csv
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from litgpt.args import EvalArgs, TrainArgs
from litgpt.config import Config

from litgpt_vocagnolm.data.prepare import prepare
from litgpt_vocagnolm.data.prepared import VocAgnoData, load_manifest
from litgpt_vocagnolm.demo.settings import DemoSizes
from litgpt_vocagnolm.loss.methods import GuidanceArgs
from litgpt_vocagnolm.models.model_configs import llama_config
from litgpt_vocagnolm.training.recipe import setup
from litgpt_vocagnolm.training.score_teacher import score_teacher
from litgpt_vocagnolm.training.teacher import TeacherArgs

LEARNING_RATE = 2e-3  # AdamW, cosine to a tenth of it; tiny models take a large rate


def prepare_data(
    student: Path, teacher: Path, train: Path, heldout: Path, out_dir: Path, max_seq_length: int, window: int
) -> Path:
    """`vocagnolm prepare` with the held-out text as its validation split; its report goes to out_dir.log."""
    with logged(out_dir.with_suffix(".log")):
        prepare(
            student=student,
            teacher=teacher,
            input=[train],
            val_input=[heldout],
            output=out_dir,
            max_seq_length=max_seq_length,
            teacher_max_length=window,
            num_workers=2,
            text_key="text",
        )
    split = load_manifest(out_dir)["splits"]["train"]
    print(
        f"{out_dir.name}: {split['student_tokens']:,} training tokens, {split['mapped_share']:.1%} of them mapped to"
        " teacher tokens."
    )
    return out_dir


def score_run(data_path: Path, teacher_dir: Path, cache: Path) -> None:
    """`vocagnolm score-teacher`: the teacher's per-token losses on the students' data, once; report in cache.log.
    The blocks are read in this process: loader workers of a spawned training process are spawned too, each importing
    torch again (seconds of CPU each) to read a few hundred blocks; the cache is the same bytes either way."""
    with logged(cache.with_suffix(".log")):
        score_teacher(data=data_path, teacher=teacher_dir, output=cache, num_workers=0)


def model_config(name: str, vocab_size: int, layers: int, width: int, block_size: int) -> Config:
    """A Llama-style `litgpt.Config` (RMSNorm, SwiGLU, RoPE), heads of 32 dimensions."""
    return llama_config(
        f"demo-{name}",
        vocab_size,
        layers,
        width,
        n_head=max(1, width // 32),
        intermediate_size=int(8 * width / 3) // 8 * 8,
        block_size=block_size,
    )


@dataclass(frozen=True)
class Guided:
    """How a demo run is guided: its `--guidance.*` and its teachers, one entry per teacher (none: plain `ce`)."""

    guidance: dict[str, Any] = field(default_factory=lambda: {"method": "ce"})
    """`GuidanceArgs`' fields."""
    checkpoint_dirs: tuple[Path, ...] = ()
    """The teachers' checkpoints (`--teacher.checkpoint_dir`)."""
    caches: tuple[Path, ...] = ()
    """Their loss caches (`--teacher.cache`)."""
    other_data: tuple[Path, ...] = ()
    """The prepared data of the teachers after the first (`--data.other_teachers`)."""


def train_run(
    out_dir: Path,
    config: Config,
    data_path: Path,
    tokenizer_dir: Path,
    sizes: DemoSizes,
    tokens: int,
    seed: int,
    guided: Guided = Guided(),
) -> dict[str, Any]:
    """One run of the recipe (`recipe.setup`), its console output in out_dir/train.log; returns what its logs say.

    The budget is rounded down to whole evaluation intervals, so the last evaluation falls on the last step.
    """
    tokens_per_step = sizes.micro_batch_size * sizes.max_seq_length
    interval = max(1, tokens // tokens_per_step // sizes.evaluations)
    steps = interval * sizes.evaluations
    t0 = time.perf_counter()
    with logged(out_dir / "train.log"):
        setup(
            model_config=config,
            out_dir=out_dir,
            precision="32-true",
            data=VocAgnoData(path=data_path, num_workers=0, seed=seed, other_teachers=list(guided.other_data)),
            train=TrainArgs(
                save_interval=None,
                log_interval=interval,
                global_batch_size=sizes.micro_batch_size,
                micro_batch_size=sizes.micro_batch_size,
                max_tokens=steps * tokens_per_step,
                max_seq_length=sizes.max_seq_length,
                lr_warmup_steps=max(1, steps // 20),
                max_norm=1.0,
                min_lr=LEARNING_RATE / 10,
                tie_embeddings=False,
            ),
            eval=EvalArgs(interval=interval, max_iters=sizes.eval_batches, final_validation=False),
            optimizer={
                "class_path": "torch.optim.AdamW",
                "init_args": {"lr": LEARNING_RATE, "weight_decay": 0.1, "betas": [0.9, 0.95]},
            },
            devices=1,
            tokenizer_dir=tokenizer_dir,
            logger_name="csv",
            seed=seed,
            teacher=TeacherArgs(list(guided.checkpoint_dirs) or None, cache=list(guided.caches) or None),
            guidance=GuidanceArgs(**guided.guidance),
        )
    return {**read_metrics(out_dir, tokens_per_step), "seed": seed, "seconds": time.perf_counter() - t0}


def one_thread() -> None:
    """Sets up a training process: one thread, and Lightning's "Seed set to" lines (to the console) silenced."""
    torch.set_num_threads(1)
    logging.getLogger("lightning.fabric.utilities.seed").setLevel(logging.WARNING)


@contextlib.contextmanager
def logged(path: Path) -> Iterator[None]:
    """Sends what a stage prints (progress lines, warnings) to `path`, keeping the demo's console readable."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        yield


def read_metrics(out_dir: Path, tokens_per_step: int) -> dict[str, Any]:
    """The run's held-out curve and last training figures, from LitGPT's CSV log (out_dir/logs/csv/*/metrics.csv)."""
    (path,) = out_dir.glob("logs/csv/*/metrics.csv")
    with open(path, encoding="utf-8") as f:
        rows = [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]
    evaluations = [row for row in rows if "val_bpb" in row]
    logged = [row for row in rows if "loss" in row]
    last = logged[-1]
    shares = [row["reference_share_1"] for row in logged if "reference_share_1" in row]  # several teachers only
    return {
        "second_teacher_share": float(np.mean(shares)) if shares else None,
        "tokens": [int(row["step"]) * tokens_per_step for row in evaluations],  # logged at the optimizer step
        "bpb": [row["val_bpb"] for row in evaluations],
        "heldout_loss": evaluations[-1]["val_loss"],
        "train_loss": last["loss"],
        "student_loss": last.get("student_loss", last["loss"]),
        "tokens_per_sec": last["tokens_per_sec"],
    }


def summarize_run(name: str, run: dict[str, Any]) -> str:
    return (
        f"{name}: held-out {run['bpb'][-1]:.3f} bits per byte after {run['tokens'][-1]:,} tokens"
        f" ({run['tokens_per_sec']:,.0f} tokens/s, {run['seconds']:.0f} s)"
    )
