"""Saving and resuming a training checkpoint on two processes: sharded (each rank writes its own shard with
`torch.distributed.checkpoint`, what the recipe does) against gathered (the whole state gathered on rank 0 and written
as one file: Fabric's `ModelParallelStrategy(save_distributed_checkpoint=False)`, what the recipe did before).

The student is the real `tiny-llama-1.1b` width (n_embd 2048, 32,000-token vocabulary, intermediate 5632) with fewer
layers (`--n_layer`, 2 of 22 by default), sharded with the recipe's `parallelize` (FSDP2 over gloo, two CPU
processes), with its AdamW state (one optimizer step taken). Each (layout, save or resume) runs in fresh processes, so
that each peak is its own: printed are the seconds and the peak resident memory of the process that peaks highest
(`ru_maxrss`), beside the resident memory before the save or the load began (model, optimizer state and runtime).
`--launch_per layout` saves and resumes in the same processes instead (half the process starts, for `--smoke`; the
resume's peak is then at least the save's).

    python benchmarks/bench_checkpoint.py [--n_layer 2] [--smoke]
"""

import argparse
import functools
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
from lightning.fabric.strategies import ModelParallelStrategy
from litgpt.config import Config
from litgpt.pretrain import initialize_weights
from smoke import parse_args  # benchmarks/ is on sys.path when this file runs as a script

from litgpt_vocagnolm.models.gpt import GPT
from litgpt_vocagnolm.training.checkpoints import Checkpointer, find_resume_checkpoint
from litgpt_vocagnolm.training.distributed import FSDPArgs, parallelize

MB = 1024**2
LAYOUTS, PHASES = ("sharded", "gathered"), ("save", "resume")


def resident_mb() -> float:
    """This process's resident memory now (VmRSS), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def student_config(n_layer: int, n_embd: int) -> Config:
    """`tiny-llama-1.1b` with `n_layer` layers, at width `n_embd` (heads of 64 and MLP 2.75x wide, as its own)."""
    config = Config.from_name("tiny-llama-1.1b", n_layer=n_layer)
    if n_embd == config.n_embd:
        return config
    return Config.from_name(
        "tiny-llama-1.1b",
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_embd // 64,
        n_query_groups=1,
        intermediate_size=n_embd * 11 // 4,
    )


def run(layout: str, phases: list[str], config: Config, directory: Path) -> None:
    """`phases` of `layout` in turn on two processes (a child run)."""
    parallelize_fn = functools.partial(parallelize, fsdp=FSDPArgs(), num_nodes=1)  # the student sharded over both
    strategy = ModelParallelStrategy(
        parallelize_fn=parallelize_fn,
        data_parallel_size=2,
        tensor_parallel_size=1,
        save_distributed_checkpoint=layout == "sharded",
    )
    fabric = L.Fabric(accelerator="cpu", devices=2, strategy=strategy, precision="32-true")
    fabric.launch()
    for phase in phases:
        measure(fabric, layout, phase, config, directory)


def measure(fabric: L.Fabric, layout: str, phase: str, config: Config, directory: Path) -> None:
    """One (layout, phase) of a fresh student and optimizer; rank 0 writes {seconds, peak and start MiB of each rank}
    to a JSON."""
    with fabric.init_module(empty_init=True):  # as the recipe: on the meta device, each rank materialises its shard
        model = GPT(config)
    initialize_weights(fabric, model, n_layer=config.n_layer, n_embd=config.n_embd)
    model = fabric.setup(model)
    optimizer = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=1e-4))
    model(torch.randint(0, 32000, (1, 16))).sum().backward()
    optimizer.step()  # AdamW's state exists
    optimizer.zero_grad()
    state = {"model": model, "optimizer": optimizer, "iter_num": 1, "step_count": 1, "position": 1}
    checkpointer = Checkpointer(fabric, state, directory / layout, None, hparams={})
    target = directory / layout / "step-00000001"
    if layout == "gathered":
        target.mkdir(parents=True, exist_ok=True)
    fabric.barrier()
    start_mb = resident_mb()
    t0 = time.perf_counter()
    if layout == "sharded" and phase == "save":
        checkpointer.save(1)
    elif layout == "sharded":
        checkpointer.load(find_resume_checkpoint(fabric, True, target.parent))
    elif phase == "save":
        fabric.save(target / "lit_model.pth", state)
    else:
        fabric.load(target / "lit_model.pth", state, weights_only=True)
    fabric.barrier()
    seconds = time.perf_counter() - t0
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    ranks = fabric.all_gather(torch.tensor([peak_mb, start_mb])).tolist()
    if fabric.global_rank == 0:
        (directory / f"{layout}-{phase}.json").write_text(json.dumps({"seconds": seconds, "ranks": ranks}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n_layer", type=int, default=2, help="transformer blocks (tiny-llama-1.1b has 22)")
    parser.add_argument("--n_embd", type=int, default=2048, help="width (tiny-llama-1.1b's is 2048)")
    parser.add_argument(
        "--launch_per",
        choices=["phase", "layout"],
        default="phase",
        help="fresh processes for each save and resume, or for each layout (see the docstring)",
    )
    parser.add_argument("--layout", choices=LAYOUTS, help=argparse.SUPPRESS)  # a child run
    parser.add_argument("--phases", choices=PHASES, nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--directory", type=Path, help=argparse.SUPPRESS)
    args = parse_args(parser, smoke={"n_layer": 1, "n_embd": 128, "launch_per": "layout"})
    config = student_config(args.n_layer, args.n_embd)
    if args.layout:
        return run(args.layout, args.phases, config, args.directory)

    parameters = sum(p.numel() for p in GPT(config).parameters())
    print(
        f"tiny-llama-1.1b, width {args.n_embd}, {args.n_layer} of 22 layers: {parameters / 1e6:.0f}M parameters,"
        f" {parameters * 12 / 1e9:.2f} GB of float32 weights and AdamW state; 2 CPU processes (gloo)."
    )
    rows = []
    launches = [[phase] for phase in PHASES] if args.launch_per == "phase" else [PHASES]
    with tempfile.TemporaryDirectory() as tmp:
        for layout in LAYOUTS:
            for phases in launches:
                command = [
                    sys.executable,
                    __file__,
                    "--n_layer",
                    str(args.n_layer),
                    "--n_embd",
                    str(args.n_embd),
                    "--layout",
                    layout,
                    "--phases",
                    *phases,
                    "--directory",
                    tmp,
                ]
                subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
            for phase in PHASES:
                result = json.loads((Path(tmp) / f"{layout}-{phase}.json").read_text())
                peak, start = max(result["ranks"], key=lambda rank: rank[0])
                rows.append((layout, phase, result["seconds"], peak, start))
    print(f"| {'checkpoint':<10} | {'':<6} | {'seconds':>7} | {'peak RSS, MiB':>13} | {'RSS before, MiB':>15} |")
    print(f"|{'-' * 12}|{'-' * 8}|{'-' * 9}|{'-' * 15}|{'-' * 17}|")
    for layout, phase, seconds, peak, start in rows:
        print(f"| {layout:<10} | {phase:<6} | {seconds:7.2f} | {peak:13,.0f} | {start:15,.0f} |")
    times = {(layout, phase): (seconds, peak) for layout, phase, seconds, peak, _ in rows}
    for phase in PHASES:
        (s_sec, s_peak), (g_sec, g_peak) = times["sharded", phase], times["gathered", phase]
        print(f"gathered / sharded, {phase}: {g_sec / s_sec:.2f}x the seconds, {g_peak / s_peak:.2f}x the peak memory")


if __name__ == "__main__":
    main()
