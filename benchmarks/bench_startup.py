"""How soon each command answers: the time from starting it to its first line of output (its --help, or the one line
of a refusal), against `python -c "import torch"` on the same machine in the same run.

A newcomer's mistakes each cost a command's start: a command or refusal that needs no model should import no torch,
Lightning or LitGPT (cli.py, data/__init__.py, _hook.py). Each command runs as typed, through this environment's console
scripts, in a fresh process with unbuffered output (as a terminal shows it), from an empty folder; the rounds are
interleaved (each round runs every command once, in turn), so that a change in the machine's load reaches every command
alike, and the median of the rounds is printed. One more run of each, under `python -X importtime`, says which of the
heavy packages it loaded (not with `--no_imports`, as `--smoke` runs it: tests/test_newcomer.py checks what the commands
that need no model load).

    python benchmarks/bench_startup.py [--rounds 5] [--no_imports] [--smoke]
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from smoke import parse_args  # benchmarks/ is on sys.path when this file runs as a script

BIN = Path(sys.executable).parent  # this environment's console scripts
TINYLLAMA = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "tokenizers" / "tinyllama-1.1b"
HEAVY = ("torch", "lightning", "litgpt", "litdata", "transformers", "matplotlib")
BASELINE = 'python -c "import torch"'
MISSING_INPUT = ["--student", str(TINYLLAMA), "--teacher", str(TINYLLAMA), "--input", "nosuch.jsonl", "--output", "out"]
# label: (what it needs, the command line). "no model": answered without torch (LitGPT's console script refuses an
# unknown recipe or --config before LitGPT loads: _hook.py); "LitGPT": a recipe's parser (its options are LitGPT's
# classes), or a command whose module runs a model.
COMMANDS = {
    BASELINE: ("baseline", [sys.executable, "-c", "import torch; print('imported')"]),
    "vocagnolm --help": ("no model", ["vocagnolm", "--help"]),
    "vocagnolm prepare --help": ("no model", ["vocagnolm", "prepare", "--help"]),
    "vocagnolm prepare, no such --input": ("no model", ["vocagnolm", "prepare", *MISSING_INPUT]),
    "vocagnolm inspect --help": ("no model", ["vocagnolm", "inspect", "--help"]),
    "vocagnolm recipes": ("no model", ["vocagnolm", "recipes"]),
    "litgpt pretrain --recipe vocagnlm": ("no model", ["litgpt", "pretrain", "--recipe", "vocagnlm"]),
    "litgpt pretrain --recipe vocagnolm --config nosuch": (
        "no model",
        ["litgpt", "pretrain", "--recipe", "vocagnolm", "--config", "nosuch"],
    ),
    "vocagnolm plan, a misspelt option": (
        "LitGPT",
        ["vocagnolm", "plan", "--config", "demo-cpu", "--gpu_memroy", "40"],
    ),
    "vocagnolm evaluate --help": ("LitGPT", ["vocagnolm", "evaluate", "--help"]),
    "litgpt pretrain --recipe vocagnolm --help": ("LitGPT", ["litgpt", "pretrain", "--recipe", "vocagnolm", "--help"]),
}


def command_line(argv: list[str]) -> list[str]:
    """`argv` with its console script's path (`vocagnolm`, `litgpt`: this environment's)."""
    return [str(BIN / argv[0]), *argv[1:]] if argv[0] in ("vocagnolm", "litgpt") else argv


def first_line_seconds(argv: list[str], cwd: str) -> float:
    """Seconds from starting `argv` to its first line of output (stdout or stderr); the rest of its output is not
    waited for."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # each line as printed, as a terminal sees it
    start = time.perf_counter()
    with subprocess.Popen(
        command_line(argv), cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as process:
        line = process.stdout.readline()
        seconds = time.perf_counter() - start
        process.kill()
    if not line.strip():
        raise RuntimeError(f"{' '.join(argv)} printed nothing")
    return seconds


def heavy_imports(argv: list[str], cwd: str) -> list[str]:
    """Which of HEAVY the command loads, by `python -X importtime` (a console script is a Python file): those whose
    modules it imported. A package's own name alone is an import begun (LitGPT's console script's `from
    litgpt.__main__ import main`, which a refusal may end before any of LitGPT runs)."""
    script = command_line(argv)
    command = [sys.executable, "-X", "importtime", *(script[1:] if script[0] == sys.executable else script)]
    printed = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600).stderr
    names = re.findall(r"^import time: +\d+ \| +\d+ \| +([\w.]+)$", printed, flags=re.MULTILINE)
    loaded = {name.split(".")[0] for name in names if "." in name and not name.endswith(".__main__")}
    return [name for name in HEAVY if name in loaded]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="runs of each command, interleaved; the median is shown")
    parser.add_argument("--no_imports", action="store_true", help="not the run of each under -X importtime")
    args = parse_args(parser, smoke={"rounds": 1, "no_imports": True})
    seconds = {label: [] for label in COMMANDS}
    with tempfile.TemporaryDirectory() as cwd:
        load = os.getloadavg()[0]
        for _ in range(args.rounds):
            for label, (_, argv) in COMMANDS.items():
                seconds[label].append(first_line_seconds(argv, cwd))
        loaded = {} if args.no_imports else {label: heavy_imports(argv, cwd) for label, (_, argv) in COMMANDS.items()}
    median = {label: statistics.median(times) for label, times in seconds.items()}
    print(
        f"Time to the first line of output, the median of {args.rounds} rounds of fresh processes, on {os.cpu_count()}"
        f" CPUs (load average {load:.1f} at the start):"
    )
    print("| command | first line s | / import torch | loads |\n|---|---:|---:|---|")
    for label, value in median.items():
        loads = (", ".join(loaded[label]) or "none") if label in loaded else "not measured"
        print(f"| {label} | {value:.2f} | {value / median[BASELINE]:.2f}x | {loads} |")
    for group, title in (("no model", "needing no model"), ("LitGPT", "loading LitGPT")):
        ratios = [median[label] / median[BASELINE] for label, (kind, _) in COMMANDS.items() if kind == group]
        print(f"Commands and refusals {title} / import torch: {min(ratios):.2f}-{max(ratios):.2f}x")


if __name__ == "__main__":
    main()
