"""Tokens/s, MFU and peak memory of the recipe's steps beside the plan, over micro-batches, compiled and eager: a sweep
of `vocagnolm plan --measure true` (`litgpt_vocagnolm.planning.measure`), which runs the recipe's own loop,
`score-teacher`'s forward and LitGPT's own step for the same student on one device, with the real configs and random
weights.

Each setting runs as one GPU of the recipe with one micro-batch per optimizer step (`--devices 1 --num_nodes 1
--train.global_batch_size` = the micro-batch), and prints `plan --measure`'s table:

    python benchmarks/bench_mfu.py [--config tinyllama-qwen2.5-math-7b] [--micro_batches 1,4,8]
        [--compile true,false] [--window 2560]
    python benchmarks/bench_mfu.py --smoke   # the demo-cpu recipe at micro-batch 1, eager: seconds on a CPU
"""

import argparse
import contextlib
import io
from pathlib import Path

from litgpt_vocagnolm.planning.plan import plan

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(RECIPES / "tinyllama-qwen2.5-math-7b.yaml"))
    parser.add_argument("--micro_batches", default="1,4,8", help="comma-separated micro-batch sizes")
    parser.add_argument("--compile", default="true,false", help="comma-separated: true, false or both")
    parser.add_argument("--window", default="2560", help="teacher tokens per sequence (the data's, padded to 64)")
    parser.add_argument("--smoke", action="store_true", help="the tiny CPU recipe at micro-batch 1, eager")
    args = parser.parse_args()
    if args.smoke:  # the plan's own window: the prepared data's, else the sequence's
        args.config, args.micro_batches, args.compile = str(RECIPES / "demo-cpu.yaml"), "1", "false"
        args.window = None
    window = ["--window", args.window] if args.window else []
    for compile in args.compile.split(","):
        for micro_batch in args.micro_batches.split(","):
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                plan(
                    [
                        "--config",
                        args.config,
                        "--devices",
                        "1",
                        "--num_nodes",
                        "1",
                        "--measure",
                        "true",
                        "--compile",
                        compile,
                        *window,
                        "--train.micro_batch_size",
                        micro_batch,
                        "--train.global_batch_size",
                        micro_batch,
                    ]
                )
            text = printed.getvalue()
            print(f"== {Path(args.config).name}, micro-batch {micro_batch}, compile {compile}")
            print(text[text.index("Measured here") :].strip())


if __name__ == "__main__":
    main()
