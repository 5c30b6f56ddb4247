"""This package beside the versions `pip install 'litgpt[extra]'` picks, as LitGPT's README installs it, and LitGPT
still working.

`make test-install` checks that this package and tests/litgpt-extra.txt resolve together in one `pip install` (dry run),
and puts those pins (transformers, tokenizers, huggingface-hub, ...: what litgpt[extra] brings where it differs from
this environment, litdata aside, which this package pins: tests/test_wheel_install.py) in .venv/litgpt-extra. The
commands here run with that folder first on their path: LitGPT's own `pretrain` (help, and a few steps of pythia-14m
on two text files, which LitData tokenizes in forked workers, then on the mix of two such folders that its TinyLlama
data module streams), `vocagnolm prepare` on the shipped GSM8K text with the real tokenizers and its default number
of workers, and the recipe on that data, stopped and resumed. LitGPT's other commands (download, finetune, generate,
chat, serve, evaluate, convert) import no LitData.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import BIN, QWEN, ROOT, TINYLLAMA
from test_recipe import recipe_config

pytestmark = [pytest.mark.slow, pytest.mark.install]  # beside the versions litgpt[extra] picks: `make test-install`
EXTRA = Path(sys.prefix) / "litgpt-extra"  # `make test-install` puts tests/litgpt-extra.txt there
PINS = dict(
    line.split("==")
    for line in (ROOT / "tests" / "litgpt-extra.txt").read_text().splitlines()
    if line and not line.startswith("#")
)


def run(*args: str, cwd: Path = ROOT, **env: str) -> subprocess.CompletedProcess:
    """A console script of this environment with the litgpt[extra] pins first on its path (and `env` set)."""
    assert EXTRA.is_dir(), f"{EXTRA} is missing: run `make test-install`."
    env = {**os.environ, "PYTHONPATH": str(EXTRA), "OMP_NUM_THREADS": "1", **env}
    command = [str(BIN / args[0]), *args[1:]]
    out = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    return out


def test_the_commands_see_the_pinned_versions():
    script = "import json, importlib.metadata as m, sys; print(json.dumps({p: m.version(p) for p in sys.argv[1:]}))"
    out = run("python", "-c", script, *PINS)
    assert json.loads(out.stdout) == PINS


def test_litgpt_pretrain_help():
    out = run("litgpt", "pretrain", "--help")
    assert "Pretrain a model." in out.stdout


def litgpt_pretrain(out_dir: Path, *data: str) -> None:
    """LitGPT's own `pretrain` of pythia-14m, 4 steps of 2 x 128 tokens, on its data module `data` (`--data ...`)."""
    run(
        "litgpt",
        "pretrain",
        "pythia-14m",
        "--tokenizer_dir",
        str(TINYLLAMA),
        *data,
        "--train.max_tokens",
        str(4 * 2 * 128),
        "--train.max_seq_length",
        "128",
        "--train.global_batch_size",
        "2",
        "--train.micro_batch_size",
        "2",
        "--eval.max_iters",
        "1",
        "--data.num_workers",
        "0",
        "--out_dir",
        str(out_dir),
        "--logger_name",
        "csv",
        "--precision",
        "32-true",
        # LitGPT's pretrain always compiles the model: about 20 s of this CPU for what is tested here, that LitGPT
        # runs beside this package, not torch's compiler (tests/test_static_step.py compiles the recipe's blocks).
        TORCHDYNAMO_DISABLE="1",
    )
    assert (out_dir / "final" / "lit_model.pth").is_file()


def test_litgpt_pretrain_trains_a_tiny_model_on_its_litdata_modules(tmp_path):
    """LitGPT's data modules on this package's LitData (0.2.44, where litgpt[extra] pins 0.2.59): `TextFiles`
    tokenizes text files with LitData's `optimize` in forked workers and streams them (`StreamingDataset`,
    `TokensLoader`); `TinyLlama` mixes two such folders (`CombinedStreamingDataset`), here TextFiles' own shards."""
    assert run("python", "-c", "import litdata; print(litdata.__version__)").stdout.strip() == "0.2.44"
    texts = tmp_path / "texts"
    texts.mkdir()
    lines = (ROOT / "data" / "gsm8k" / "train.jsonl").read_text(encoding="utf-8").splitlines()
    for k in range(2):  # TextFiles keeps the first file for validation
        answers = [json.loads(line)["answer"] for line in lines[k * 100 : (k + 1) * 100]]
        (texts / f"{k}.txt").write_text("\n".join(answers))
    litgpt_pretrain(tmp_path / "out", "--data", "TextFiles", "--data.train_data_path", str(texts))

    mixed = tmp_path / "tinyllama"  # the layout TinyLlama reads: slimpajama/train, slimpajama/val, starcoder
    (mixed / "slimpajama").mkdir(parents=True)
    for split, folder in (("train", "slimpajama/train"), ("val", "slimpajama/val"), ("train", "starcoder")):
        (mixed / folder).symlink_to(texts / split, target_is_directory=True)
    litgpt_pretrain(tmp_path / "out-mixed", "--data", "TinyLlama", "--data.data_path", str(mixed))


def test_prepare_with_several_workers_then_a_resumed_recipe_run(tmp_path, qwen_teacher):
    data = tmp_path / "data"
    out = run(
        "vocagnolm",
        "prepare",
        "--student",
        str(TINYLLAMA),
        "--teacher",
        str(QWEN),
        "--input",
        str(ROOT / "data" / "gsm8k" / "train.jsonl"),
        "--text_key",
        "question,answer",
        "--output",
        str(data),
        "--max_seq_length",
        "64",
    )
    workers = min(os.cpu_count() or 1, 4)  # one per CPU (the default), for the 4 work units of 4.2 MB
    assert out.stdout.count(f"Starting {workers} workers with 4 items") == 2  # val, then train
    manifest = json.loads((data / "manifest.json").read_text())
    assert sum(manifest["splits"][split]["documents"] for split in ("train", "val")) == 7473  # every record

    config = recipe_config(tmp_path, data, qwen_teacher)
    run(
        "litgpt",
        "pretrain",
        "--recipe",
        "vocagnolm",
        "--config",
        str(config),
        "--train.max_tokens",
        str(4 * 4 * 64),
        "--train.save_interval",
        "2",
    )
    out = run(
        "litgpt",
        "pretrain",
        "--recipe",
        "vocagnolm",
        "--config",
        str(config),
        "--train.max_tokens",
        str(6 * 4 * 64),
        "--train.save_interval",
        "2",
        "--resume",
        "auto",
    )
    assert re.search(r"Resuming training from \S*step-00000004", out.stdout), out.stdout[-2000:]
    final = torch.load(tmp_path / "out" / "final" / "lit_model.pth", weights_only=True)
    assert (final["step_count"], final["iter_num"]) == (6, 12)  # 6 steps of 2 micro-batches
