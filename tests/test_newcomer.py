"""What a newcomer meets first: a plan made before the data exists, a misspelt recipe, how soon a command answers."""

import re
import subprocess
import sys

import pytest
from conftest import BIN, RECIPES, ROOT, TINYLLAMA

PAPER_RECIPE = RECIPES / "tinyllama-qwen2.5-math-7b-instruct.yaml"


def notes(printed: str) -> list[str]:
    return [line for line in printed.splitlines() if line.startswith("Note: no prepared data")]


@pytest.mark.parametrize("made", [False, True], ids=["no folder", "an empty folder"])
def test_plan_says_when_the_data_is_missing_and_what_the_window_is_then(tmp_path, capsys, made):
    """Planned before `prepare` has run: the window is max_seq_length + 1 (2048 + 1), and one line says so, naming the
    path and what is missing there."""
    from litgpt_vocagnolm.planning.plan import plan

    data = tmp_path / "owm"
    if made:
        data.mkdir()
    plan(["--config", str(PAPER_RECIPE), "--data.path", str(data)])
    printed = capsys.readouterr().out
    missing = "no manifest.json" if made else "no such folder"
    assert notes(printed) == [
        f"Note: no prepared data at {data} ({missing}): the teacher window of 2049 tokens is max_seq_length + 1, a"
        " guess, not the one `vocagnolm prepare` records (its teacher_max_length, padded to a multiple of 64). Give"
        " --data.path of the prepared data or --window, or plan again once the data is prepared."
    ]
    assert "teacher window 2049," in printed


def test_plan_says_nothing_of_the_data_when_the_window_is_given_or_read_or_unused(capsys, tinyllama_qwen_data):
    """No note when --window says the window, when the data is prepared (its window is read), or when the recipe runs
    no teacher (`ce`: no window to guess)."""
    from litgpt_vocagnolm.planning.plan import plan

    for args in (
        ["--config", str(PAPER_RECIPE), "--window", "1888"],
        ["--config", str(PAPER_RECIPE), "--data.path", str(tinyllama_qwen_data), "--train.max_seq_length", "64"],
        ["--config", str(RECIPES / "demo-cpu.yaml"), "--data.path", "nosuch"],
    ):
        plan(args)
        assert notes(capsys.readouterr().out) == [], args


def test_plan_measure_names_the_device_and_what_one_of_the_run_s_devices_is_there():
    """On a GPU the run's devices are GPUs and their hours GPU-hours; on a CPU each is a process of the recipe."""
    import torch

    from litgpt_vocagnolm.planning.device import device_hours, device_name, devices

    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert [devices(1, cpu), devices(32, cpu), devices(1, cuda), devices(32, cuda)] == [
        "1 CPU process",
        "32 CPU processes",
        "1 GPU",
        "32 GPUs",
    ]
    assert (device_hours(cpu), device_hours(cuda)) == ("CPU-hours", "GPU-hours")
    threads = torch.get_num_threads()
    assert re.fullmatch(rf"cpu \({threads} threads?, \d+\.\d GB\)", device_name(cpu))


REGISTERED = "Registered recipes (litgpt.recipes entry points): vocagnolm."


@pytest.mark.parametrize(
    "command, argv",
    [
        ("litgpt pretrain", [str(BIN / "litgpt"), "pretrain"]),
        ("litgpt pretrain", [sys.executable, "-m", "litgpt", "pretrain"]),
        ("vocagnolm pretrain", [str(BIN / "vocagnolm"), "pretrain"]),
    ],
    ids=["litgpt", "python -m litgpt", "vocagnolm"],
)
def test_a_misspelt_recipe_is_refused_in_one_line_with_the_closest_name(command, argv):
    """As a misspelt option is: the command, `error:`, what is wrong and the closest name, then the registered ones."""
    out = subprocess.run([*argv, "--recipe", "vocagnlm"], capture_output=True, text=True, timeout=300)
    line = f"{command}: error: unknown recipe 'vocagnlm': did you mean vocagnolm? {REGISTERED}\n"
    assert (out.returncode, out.stdout, out.stderr) == (2, "", line)


@pytest.mark.parametrize(
    "args, line",
    [
        (["--recipe=qwen"], f"litgpt pretrain: error: unknown recipe 'qwen'. {REGISTERED}\n"),
        (["--recipe"], f"litgpt pretrain: error: --recipe needs a name. {REGISTERED}\n"),
    ],
)
def test_a_recipe_name_close_to_none_or_missing_gets_the_registered_ones(args, line):
    out = subprocess.run([str(BIN / "litgpt"), "pretrain", *args], capture_output=True, text=True, timeout=300)
    assert (out.returncode, out.stdout, out.stderr) == (2, "", line)


def test_a_misspelt_command_is_refused_in_one_line_with_the_closest_name():
    out = subprocess.run([str(BIN / "vocagnolm"), "prepar"], capture_output=True, text=True, timeout=300)
    assert (out.returncode, out.stderr) == (
        2,
        "vocagnolm: error: unknown command 'prepar': did you mean prepare? See vocagnolm --help.\n",
    )


# What a command that needs no model must not load: each costs seconds of CPU to import, far more on a loaded machine.
HEAVY = ("torch", "lightning", "litgpt", "litdata", "transformers", "matplotlib")
# `vocagnolm ARGS` in this interpreter, then its exit status and the modules of HEAVY it loaded.
RUN_AND_LIST = """
import sys
from litgpt_vocagnolm.cli import main
try:
    main(sys.argv[1:])
    status = 0
except SystemExit as stop:
    status = stop.code or 0
print(status, sorted(name for name in {heavy} if name in sys.modules))
"""
MISSING_INPUT = ["--student", str(TINYLLAMA), "--teacher", str(TINYLLAMA), "--input", "nosuch.jsonl", "--output", "out"]


@pytest.mark.parametrize(
    "args, status, said",
    [
        (["prepare", "--help"], 0, "usage: vocagnolm prepare"),
        (["prepare", *MISSING_INPUT], 1, "vocagnolm prepare: error: --input nosuch.jsonl does not exist."),
        (["prepare", *MISSING_INPUT, "--max_seq_len", "64"], 2, "--max_seq_len is not an option: did you mean"),
        (["inspect", "--help"], 0, "usage: vocagnolm inspect"),
        (["recipes"], 0, "tinyllama-qwen2.5-math-7b-instruct"),
        (["plan", "--config", "demo-cp"], 1, "vocagnolm plan: error: --config demo-cp: no such file"),
        (["pretrain", "--config", "demo-cp", "--devices", "1"], 1, "Did you mean demo-cpu?"),
    ],
    ids=[
        "prepare --help",
        "prepare, no such input",
        "prepare, a misspelt option",
        "inspect --help",
        "recipes",
        "plan, a misspelt recipe",
        "pretrain, a misspelt recipe",
    ],
)
def test_a_command_that_needs_no_model_answers_without_loading_torch_or_litgpt(tmp_path, args, status, said):
    """Its --help, its listing and its refusals, in a fresh interpreter: what it printed, and which of HEAVY it loaded
    (none)."""
    code = RUN_AND_LIST.format(heavy=HEAVY)
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert said in out.stdout + out.stderr, out.stderr[-2000:]
    assert out.stdout.splitlines()[-1] == f"{status} []"


@pytest.mark.parametrize(
    "args, said",
    [
        (["--recipe", "vocagnlm"], "litgpt pretrain: error: unknown recipe 'vocagnlm': did you mean vocagnolm?"),
        (["--recipe", "vocagnolm", "--config", "demo-cp"], "Did you mean demo-cpu?"),
    ],
)
def test_litgpt_refuses_a_misspelt_recipe_or_config_before_loading_litgpt(args, said):
    """LitGPT's console script would import LitGPT (torch, Lightning) before our hook ran: a misspelt recipe or
    `--config` is refused as `litgpt` starts to load, before any module of it or of the rest of HEAVY (as `python -X
    importtime` lists what a process imports; the two imports the console script's first line begins show there)."""
    command = [sys.executable, "-X", "importtime", str(BIN / "litgpt"), "pretrain", *args]
    out = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert out.returncode in (1, 2) and said in out.stderr, out.stderr[-2000:]
    loaded = re.findall(r"^import time: +\d+ \| +\d+ \| +([\w.]+)$", out.stderr, flags=re.MULTILINE)
    assert "litgpt_vocagnolm.cli" in loaded
    begun = {"litgpt", "litgpt.__main__"}  # `from litgpt.__main__ import main`: our hook refuses inside it
    assert [name for name in loaded if name.split(".")[0] in HEAVY and name not in begun] == []


# How the demo's last line states its cost, and how README.md and docs/demo.md quote it.
COST = r"in \d+ s, (\d+) s of CPU time \((\d+) s of it starting its (\d+) processes: Python and imports\)"
QUOTED = r"(\d+) s of CPU time \((\d+) s of it starting its (\d+) processes"


def docs_quote_the_cost(processes: int) -> None:
    """docs/demo.md quotes the demo's last line in its words (`COST`); README.md and docs/demo.md quote its CPU time
    and the start-up of `processes` processes."""
    demo_md = " ".join((ROOT / "docs" / "demo.md").read_text().split())
    assert re.search(COST, demo_md), "docs/demo.md quotes the demo's last line in its words"
    for doc in (ROOT / "README.md", ROOT / "docs" / "demo.md"):
        quotes = [tuple(map(int, q)) for q in re.findall(QUOTED, " ".join(doc.read_text().split()))]
        assert quotes and all(0 < s <= c and p == processes for c, s, p in quotes), (doc.name, quotes)


def test_the_docs_quote_the_demo_s_cost_in_the_words_it_prints():
    """The demo's last line as `costs` words it, for the processes the demo starts at its default `--workers`: this
    process and its training processes (the quick demo's own line, from the installed wheel, in
    test_the_docs_quote_the_quick_demo_s_cost_as_it_prints_it, `make test-install`)."""
    import inspect
    import time

    from litgpt_vocagnolm.demo.pipeline import costs, demo

    workers = inspect.signature(demo).parameters["workers"].default
    printed = costs(time.perf_counter(), [0.5] * (1 + workers))  # each process's CPU seconds when it was ready
    cpu, starting, processes = map(int, re.search(COST, " ".join(printed.split())).groups())
    assert 0 < starting <= cpu and processes == 1 + workers == 3
    docs_quote_the_cost(processes)


@pytest.mark.install
def test_the_docs_quote_the_quick_demo_s_cost_as_it_prints_it(quick_demo):
    """The quick demo prints its wall-clock time, its CPU time (its processes' together) and what starting them cost;
    README.md and docs/demo.md quote the CPU time and the start-up of as many processes as it starts, in its words."""
    printed = " ".join((quick_demo / "printed.txt").read_text().split())
    cpu, starting, processes = map(int, re.search(COST, printed).groups())
    assert 0 < starting <= cpu and processes == 3  # this process and the 2 training processes (`--workers 2`)
    docs_quote_the_cost(processes)
