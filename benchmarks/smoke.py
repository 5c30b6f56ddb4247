"""`--smoke`: each benchmark at its smallest sizes, one round, on a CPU: little work beyond starting its processes
(importing torch, Lightning and LitGPT takes about 5 s of CPU in each). `make test` runs every `bench_*.py` so
(tests/test_benchmarks.py), so that a change to what a benchmark imports cannot break it unseen. Imported by the
scripts of this folder, which is on `sys.path` when one of them runs (and under pytest: pyproject.toml's pythonpath).
"""

import argparse


def parse_args(parser: argparse.ArgumentParser, smoke: dict) -> argparse.Namespace:
    """`parser`'s arguments, with `--smoke` added: given, `smoke`'s values replace the defaults (an option given on
    the command line still wins, as in `--smoke --device cuda`)."""
    shown = {name: " ".join(map(str, value)) if isinstance(value, list) else value for name, value in smoke.items()}
    settings = " ".join(f"--{name} {value}" for name, value in shown.items())
    parser.add_argument("--smoke", action="store_true", help=f"the smallest sizes, one round: {settings}")
    args = parser.parse_args()
    if args.smoke:
        parser.set_defaults(**smoke)
        args = parser.parse_args()
    return args
