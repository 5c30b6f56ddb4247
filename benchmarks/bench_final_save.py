"""The recipe's final save against LitGPT's own final save of the same state, side by side in one run.

Ours (`checkpoints.Checkpointer.save_final`): the student and its AdamW state written sharded with
`torch.distributed.checkpoint` (what a resume reads), every file hashed into checksums.json, and the student once more
as `lit_model.pth` (what `litgpt generate` reads), written while the shards hash. LitGPT's (litgpt/pretrain.py 0.5.13
`save_checkpoint` on one device): `fabric.save` of the whole state into one `lit_model.pth`, the model config and the
tokenizer files beside it (its `save_hyperparameters`, which re-parses the command line, is left out). Both on one
process, in the same file system, from the same model and optimizer state (one AdamW step taken), in alternating order,
each round into a fresh folder; printed: the medians and their ratio (the goal: at most 1.5x).

The student is `tiny-llama-1.1b` at its width with fewer layers (`--n_layer`; 1 of 22 by default: 175M parameters,
2.1 GB of float32 weights and AdamW state).

    python benchmarks/bench_final_save.py [--n_layer 1] [--rounds 3] [--device cpu|cuda] [--smoke]
"""

import argparse
import contextlib
import io
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
from bench_checkpoint import student_config
from litgpt.utils import copy_config_files, save_config
from smoke import parse_args  # benchmarks/ is on sys.path when this file runs as a script

from litgpt_vocagnolm.models.gpt import GPT
from litgpt_vocagnolm.training.checkpoints import Checkpointer

TOKENIZER = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "tokenizers" / "tinyllama-1.1b"


def litgpt_final_save(fabric: L.Fabric, state: dict, out_dir: Path) -> None:
    """litgpt/pretrain.py's `save_checkpoint(fabric, state, tokenizer_dir, out_dir / "final" / "lit_model.pth")`."""
    checkpoint_file = out_dir / "final" / "lit_model.pth"
    checkpoint_file.parent.mkdir(parents=True, exist_ok=True)
    fabric.save(checkpoint_file, state)
    copy_config_files(TOKENIZER, checkpoint_file.parent)
    save_config(state["model"].config, checkpoint_file.parent)


def our_final_save(fabric: L.Fabric, state: dict, out_dir: Path) -> str:
    """The recipe's final save; returns what it printed (its phases and their seconds)."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        Checkpointer(fabric, state, out_dir, TOKENIZER, hparams={}).save_final()
    return printed.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n_layer", type=int, default=1, help="transformer blocks (tiny-llama-1.1b has 22)")
    parser.add_argument("--n_embd", type=int, default=2048, help="width (tiny-llama-1.1b's is 2048)")
    parser.add_argument("--rounds", type=int, default=3, help="saves of each kind, alternating")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--directory", type=Path, default=None, help="where to save (default: a temporary folder)")
    args = parse_args(parser, smoke={"n_layer": 1, "n_embd": 128, "rounds": 1})

    fabric = L.Fabric(accelerator=args.device, devices=1, precision="32-true")
    config = student_config(args.n_layer, args.n_embd)
    with fabric.init_module():
        model = GPT(config)
    model = fabric.setup(model)
    optimizer = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=1e-4))
    tokens = torch.randint(0, config.vocab_size, (1, 16), device=fabric.device)
    model(tokens, targets=tokens).sum().backward()
    optimizer.step()  # AdamW's state exists
    state = {"model": model, "optimizer": optimizer, "iter_num": 1, "step_count": 1, "position": 1}
    parameters = sum(p.numel() for p in model.parameters())
    print(
        f"tiny-llama-1.1b, width {args.n_embd}, {args.n_layer} of 22 layers: {parameters / 1e6:.0f}M parameters,"
        f" {parameters * 12 / 1e9:.2f} GB of float32 weights and AdamW state; one process, {fabric.device.type}."
    )
    seconds: dict[str, list[float]] = {"ours": [], "litgpt": []}
    with tempfile.TemporaryDirectory(dir=args.directory) as tmp:
        for round in range(args.rounds):
            order = ("ours", "litgpt") if round % 2 == 0 else ("litgpt", "ours")
            for kind in order:
                out_dir = Path(tmp) / f"{kind}-{round}"
                t0 = time.perf_counter()
                printed = our_final_save(fabric, state, out_dir) if kind == "ours" else None
                if kind == "litgpt":
                    litgpt_final_save(fabric, state, out_dir)
                seconds[kind].append(time.perf_counter() - t0)
                if printed is not None:
                    print(f"round {round + 1}, ours:\n{printed.rstrip()}")
                shutil.rmtree(out_dir)
    ours, litgpt = (statistics.median(seconds[kind]) for kind in ("ours", "litgpt"))
    print(f"| final save | seconds (median of {args.rounds}) | rounds |")
    print("|---|---:|---|")
    for kind, label in (("ours", "ours (sharded + checksums + lit_model.pth)"), ("litgpt", "LitGPT's (one file)")):
        print(f"| {label} | {statistics.median(seconds[kind]):.2f} | {', '.join(f'{s:.2f}' for s in seconds[kind])} |")
    print(f"final save / LitGPT's final save: {ours / litgpt:.2f}x")


if __name__ == "__main__":
    main()
