"""Every script in benchmarks/ at its `--smoke` setting (`pytest -m benchmark` runs these alone), and the figures that
README.md and docs/ quote next to a benchmark's name checked against what the script prints.

A quote is what a reader would look for in the script's output, and must be found there verbatim:
  - a printed label, written in backticks and ending in a colon (`online / ce:` 1.53x), in a table row, paragraph or
    list item that names one benchmark (`bench_train_step.py`);
  - the column names and the row names (first column) of a table that follows a paragraph naming one benchmark.
So a renamed label, column or row, or a removed ratio, fails here, as does a command that names a script or an option
the script no longer has.
"""

import os
import re
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
import torch
from conftest import ROOT

pytestmark = pytest.mark.benchmark

BENCHMARKS = sorted((ROOT / "benchmarks").glob("bench_*.py"))
ON_CUDA = [path for path in BENCHMARKS if '"--device"' in path.read_text(encoding="utf-8")]
# Smoke runs that start many fresh interpreters of their own (peak memory measured per process, gloo ranks per
# layout, each command's start), each importing torch again: they run, and their quotes are checked, in
# `make test-long`.
STARTS_PROCESSES = {"bench_prepare.py", "bench_checkpoint.py", "bench_startup.py"}
ON_CPU = [
    pytest.param(path, marks=pytest.mark.long, id=path.name) if path.name in STARTS_PROCESSES else path
    for path in BENCHMARKS
]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SCRIPT = re.compile(r"\bbench_\w+\.py\b")
LABEL = re.compile(r"`([^`\n]+:)`")  # a printed label as the docs quote it: `cached / ce:`
COMMAND = re.compile(r"python benchmarks/(\w+\.py)([^`]*?)(?=`|\n\s*\n|python |\Z)", re.DOTALL)
FIGURE = re.compile(r"[\d.,%x~+\- ]*")  # a table cell that is a measurement, not a name


def blocks(text: str) -> list[str]:
    """Markdown `text` cut at blank lines; a fenced code block stays whole."""
    found, lines, fenced = [], [], False
    for line in text.splitlines():
        fenced ^= line.strip().startswith("```")
        if line.strip() or fenced:
            lines.append(line)
        elif lines:
            found.append("\n".join(lines))
            lines = []
    return found + ["\n".join(lines)] if lines else found


def cells(row: str) -> list[str]:
    """A table row's cells, without emphasis or backticks."""
    return [cell.strip().strip("*`").strip() for cell in row.strip().strip("|").split("|")]


def quotes(text: str) -> tuple[dict[str, list[str]], list[str]]:
    """What markdown `text` quotes of each benchmark's output ({script name: quotes}), and the quotes it does not tie
    to exactly one benchmark (errors)."""
    found, errors, named = {}, [], set()  # named: the benchmarks of the last paragraph
    for block in blocks(text):
        lines = block.splitlines()
        if block.lstrip().startswith("```") or all(line.startswith("    ") for line in lines):
            continue  # code
        if not all(line.lstrip().startswith("|") for line in lines):  # a paragraph or list item
            named = set(SCRIPT.findall(block))
            units = [(named, LABEL.findall(block))]
        elif any(SCRIPT.search(line) for line in lines):  # a table with a row per benchmark
            units = [(set(SCRIPT.findall(line)), LABEL.findall(line)) for line in lines]
        else:  # a table that shows one benchmark's output, if the paragraph before it names one
            rows = [cells(line) for line in lines if not re.fullmatch(r"[|:\-\s]*", line)]
            names = [*rows[0], *(row[0] for row in rows[1:])]
            units = [(named, [name for name in names if not FIGURE.fullmatch(name)])] if named else []
        for scripts, quoted in units:  # quotes next to no benchmark are another command's
            if quoted and len(scripts) > 1:
                errors.append(f"{quoted} next to {sorted(scripts)}: name the one they come from")
            elif quoted and scripts:
                found.setdefault(next(iter(scripts)), []).extend(quoted)
    return found, errors


def quotes_in_docs() -> tuple[dict[str, list[str]], list[str]]:
    """`quotes` over README.md and docs/."""
    found, errors = {}, []
    for doc in DOCS:
        doc_quotes, doc_errors = quotes(doc.read_text(encoding="utf-8"))
        for script, quoted in doc_quotes.items():
            found.setdefault(script, []).extend(quoted)
        errors += [f"{doc.relative_to(ROOT)}: {error}" for error in doc_errors]
    return found, errors


@pytest.fixture(scope="module")
def smoke_runs(request) -> dict[tuple[str, str], Future]:
    """The smoke runs of the benchmarks this session selected, {(script name, device): finished process}, started on
    first use, one per core at a time, each on one thread (mostly one busy process each, its imports first)."""
    wanted = set()
    for item in request.session.items:
        params = getattr(item, "callspec", None) and item.callspec.params
        if item.module is request.module and params and "script" in params:
            device = "cuda" if item.originalname.endswith("_on_cuda") else "cpu"
            if device == "cpu" or torch.cuda.is_available():
                wanted.add((params["script"].name, device))
    pool = ThreadPoolExecutor(max_workers=os.cpu_count())
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # side by side, OpenMP threads would spin waiting for each other
    runs = {}
    for name, device in sorted(wanted):
        command = [sys.executable, str(ROOT / "benchmarks" / name), "--smoke"]
        command += ["--device", "cuda"] if device == "cuda" else []
        runs[name, device] = pool.submit(
            subprocess.run, command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
        )
    yield runs
    pool.shutdown(cancel_futures=True)


def finished(run: Future) -> str:
    """The run's output, once it has exited 0."""
    result = run.result()
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    lines = result.stdout.strip().splitlines()
    assert lines and re.search(r"\d", lines[-1]), f"no figure in its last line: {result.stdout[-2000:]}"
    return result.stdout


@pytest.mark.parametrize("script", ON_CPU, ids=lambda path: path.name)
def test_benchmark_runs_at_its_smoke_setting(script, smoke_runs):
    finished(smoke_runs[script.name, "cpu"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("script", ON_CUDA, ids=lambda path: path.name)
def test_benchmark_runs_at_its_smoke_setting_on_cuda(script, smoke_runs):
    finished(smoke_runs[script.name, "cuda"])


@pytest.mark.parametrize("script", ON_CPU, ids=lambda path: path.name)
def test_docs_quote_what_the_benchmark_prints(script, smoke_runs):
    quoted = quotes_in_docs()[0].get(script.name, [])
    assert quoted, f"README.md and docs/ quote no figure of {script.name}"
    output = finished(smoke_runs[script.name, "cpu"])
    assert [quote for quote in quoted if quote not in output] == []


def test_docs_name_benchmarks_and_options_that_exist():
    _, errors = quotes_in_docs()
    names = {path.name for path in BENCHMARKS}
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        errors += [f"{doc.name}: no benchmarks/{name}" for name in set(SCRIPT.findall(text)) - names]
        for name, options in COMMAND.findall(text):
            source = (ROOT / "benchmarks" / name).read_text(encoding="utf-8") if name in names else ""
            errors += [
                f"{doc.name}: {name} has no --{option}"
                for option in re.findall(r"(?<![\w-])--(\w+)", options)
                if f'"--{option}"' not in source
            ]
    assert errors == []


def test_a_renamed_label_or_column_is_found():
    """The parsing above on a page shaped like the README's: each kind of quote is found and tied to its script."""
    page = """Intro naming bench_a.py and bench_b.py, quoting nothing.

| script | measured |
|---|---|
| bench_a.py | `a / b:` 1.5x; `c:` 2% |

`benchmarks/bench_b.py` printed (`python benchmarks/bench_b.py --rounds 3`):

| step | peak GB |
|---:|---:|
| **ce** | 2.80 |
| online | **7.94** |

Then `x / y:` 0.9x, with bench_a.py and bench_b.py both named.

`vocagnolm demo` prints `Noise:` beside no benchmark.
"""
    found, errors = quotes(page)
    assert found == {"bench_a.py": ["a / b:", "c:"], "bench_b.py": ["step", "peak GB", "ce", "online"]}
    assert errors == ["['x / y:'] next to ['bench_a.py', 'bench_b.py']: name the one they come from"]
    assert COMMAND.findall(page) == [("bench_b.py", " --rounds 3")]
