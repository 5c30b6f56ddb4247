"""Shared fixtures: real tokenizers, a small real corpus prepared once per session, tiny LitGPT checkpoints."""

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from filelock import FileLock
from litgpt.config import Config
from litgpt.model import GPT
from litgpt.utils import save_config

from litgpt_vocagnolm.models.model_configs import llama_config
from litgpt_vocagnolm.training.score_teacher import score_teacher


@pytest.fixture(autouse=True)
def rank_zero_restored():
    """Lightning keeps the process's rank in one global (`rank_zero_only.rank`), which a Fabric built in a test for
    another rank (task 11 of a Slurm job, say) sets and nothing resets: a later run in the same process would then log
    nothing, its loggers' calls being rank zero's only. Each test ends with the rank it started with."""
    from lightning.fabric.utilities import rank_zero as fabric_rank_zero
    from lightning_utilities.core import rank_zero as utilities_rank_zero

    ranks = fabric_rank_zero.rank_zero_only.rank, utilities_rank_zero.rank_zero_only.rank
    yield
    fabric_rank_zero.rank_zero_only.rank, utilities_rank_zero.rank_zero_only.rank = ranks


ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the console scripts of this environment
TOKENIZERS = ROOT / "tests" / "fixtures" / "tokenizers"
RECIPES = ROOT / "recipes"  # the packaged recipes (YAMLs; sbatch scripts in slurm/), which the wheel carries
TINYLLAMA, QWEN, MISTRAL = TOKENIZERS / "tinyllama-1.1b", TOKENIZERS / "qwen2.5", TOKENIZERS / "mistral-7b-v0.1"
LLEMMA = TOKENIZERS / "llemma-7b"  # TinyLlama's 32,000 tokens with the same ids, then 16 infill tokens


def tiny_config(name: str, vocab_size: int, n_layer: int = 1, n_embd: int = 32, block_size: int = 256) -> Config:
    return llama_config(
        name, vocab_size, n_layer, n_embd, n_head=2, intermediate_size=2 * n_embd, block_size=block_size
    )


def make_checkpoint(directory: Path, config: Config, tokenizer_dir: Path, seed: int = 0) -> Path:
    """A LitGPT checkpoint directory as `litgpt download` leaves it: weights, config, tokenizer files."""
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    torch.save(GPT(config).state_dict(), directory / "lit_model.pth")
    save_config(config, directory)
    for file in tokenizer_dir.iterdir():
        if file.name == "tokenizer.json.gz":  # litgpt.Tokenizer reads plain JSON
            import gzip

            (directory / "tokenizer.json").write_bytes(gzip.decompress(file.read_bytes()))
        else:
            shutil.copy(file, directory)
    return directory


@pytest.fixture
def one_thread():
    """One torch thread for the commands a test runs in this process, as OMP_NUM_THREADS=1 gives a subprocess
    (tests/test_as_typed.py says why); it changes nothing they compute."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def read_only_folder(tmp_path) -> Path:
    """A folder this process can't write into: a 0o555 one, or as root (who writes into those, and runs CI here) a
    folder of a read-only mount, such as /proc/sys."""
    if os.geteuid() != 0:
        folder = tmp_path / "locked"
        folder.mkdir(mode=0o555)
        return folder
    if Path("/proc/sys").is_dir() and not os.access("/proc/sys", os.W_OK):
        return Path("/proc/sys")
    pytest.skip("root writes into any folder, and no read-only mount is here")


@pytest.fixture(scope="session")
def gsm8k_sample(tmp_path_factory, worker_id) -> Path:
    """The first 240 GSM8K train records (real math text shipped in data/): one file for all of pytest-xdist's workers,
    so that the data they prepare from it is the same, and so a teacher's cache of it (`mistral_cache`)."""

    def write(folder: Path) -> None:
        lines = (ROOT / "data" / "gsm8k" / "train.jsonl").read_text(encoding="utf-8").splitlines()[:240]
        (folder / "gsm8k.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")

    return built_once(tmp_path_factory, worker_id, "corpus", write) / "gsm8k.jsonl"


def prepare_pair(
    output: Path, corpus: Path, student: Path, teacher: Path, max_seq_length: int = 64, val_input: Path | None = None
) -> Path:
    """GSM8K records prepared for a pair: a tenth of them for validation, or those of `val_input`."""
    from litgpt_vocagnolm.data.prepare import prepare

    prepare(
        student=student,
        teacher=teacher,
        input=[corpus],
        output=output,
        max_seq_length=max_seq_length,
        num_workers=1,
        text_key="question,answer",
        val_fraction=None if val_input else 0.1,
        val_input=val_input,
    )
    return output


@pytest.fixture(scope="session")
def tinyllama_mistral_data(tmp_path_factory, worker_id, gsm8k_sample) -> Path:
    """Prepared once for all of pytest-xdist's workers, as `mistral_cache` is scored on it (LitData's index files of
    two prepares differ, and with them the data manifest's hash that a cache records)."""

    def prepare(folder: Path) -> None:
        prepare_pair(folder / "tl-mistral", gsm8k_sample, TINYLLAMA, MISTRAL)

    return built_once(tmp_path_factory, worker_id, "tl-mistral", prepare) / "tl-mistral"


@pytest.fixture(scope="session")
def tinyllama_qwen_data(tmp_path_factory, gsm8k_sample) -> Path:
    return prepare_pair(tmp_path_factory.mktemp("data") / "tl-qwen", gsm8k_sample, TINYLLAMA, QWEN)


@pytest.fixture(scope="session")
def tinyllama_llemma_data(tmp_path_factory, gsm8k_sample) -> Path:
    return prepare_pair(tmp_path_factory.mktemp("data") / "tl-llemma", gsm8k_sample, TINYLLAMA, LLEMMA)


@pytest.fixture(scope="session")
def llemma_teacher(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("ckpt") / "teacher-llemma", tiny_config("t", 32016), LLEMMA, seed=1)


@pytest.fixture(scope="session")
def mistral_teacher(tmp_path_factory) -> Path:
    return make_checkpoint(
        tmp_path_factory.mktemp("ckpt") / "teacher-mistral", tiny_config("t", 32000), MISTRAL, seed=1
    )


@pytest.fixture(scope="session")
def qwen_teacher(tmp_path_factory) -> Path:
    config = tiny_config("t", 151665, n_embd=16)
    return make_checkpoint(tmp_path_factory.mktemp("ckpt") / "teacher-qwen", config, QWEN, seed=1)


@pytest.fixture(scope="session")
def mistral_cache(tmp_path_factory, worker_id, tinyllama_mistral_data, mistral_teacher) -> tuple[Path, str]:
    """The Mistral teacher's loss cache of `tinyllama_mistral_data` (64 blocks a shard), and what `score_teacher`
    printed: scored once per session, for the tests that only read it (one that changes it copies it first). Its
    --batch_size is far above the data's blocks, capped at a shard's 64; any batch size writes the same bytes here.
    Scored on one worker's data and teacher, it fits every worker's: the same bytes (paths aside) by the same hashes."""

    def score(folder: Path) -> None:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            score_teacher(
                data=tinyllama_mistral_data,
                teacher=mistral_teacher,
                output=folder / "cache",
                num_workers=0,
                batch_size=100_000,
                blocks_per_shard=64,
            )
        (folder / "printed.txt").write_text(printed.getvalue())

    folder = built_once(tmp_path_factory, worker_id, "mistral-cache", score)
    return folder / "cache", (folder / "printed.txt").read_text()


class CachedSplit(NamedTuple):
    data: Path
    cache: Path
    student: Path
    """The student's tokenizer (a folder)."""
    teacher: Path
    """The teacher's checkpoint, whose losses `cache` holds."""


@pytest.fixture(scope="session")
def cached_split(tmp_path_factory, worker_id) -> CachedSplit:
    """16 GSM8K records prepared at 128 tokens for training (35 blocks) and one more for validation (3 blocks: of two
    ranks, one reads a micro-batch fewer), for a student's and a teacher's tokenizer of 512 tokens trained on them
    (tests/test_gpu.py's: like TinyLlama's and like Qwen2.5's), with a 2-layer teacher of that vocabulary and its loss
    cache in shards of 8 blocks: once for all of pytest-xdist's workers (the tests only read them). A student of 512
    words costs a sixtieth of what TinyLlama's 32,000 cost in the head, most of a tiny model's step."""
    from litgpt_vocagnolm.demo.tokenizer_training import train_student_tokenizer, train_teacher_tokenizer

    def build(directory: Path) -> None:
        lines = (ROOT / "data" / "gsm8k" / "train.jsonl").read_text().splitlines()
        (directory / "train.jsonl").write_text("\n".join(lines[:16]) + "\n")
        (directory / "val.jsonl").write_text(lines[16] + "\n")
        texts = [record["question"] + "\n" + record["answer"] for record in map(json.loads, lines[:16])]
        student = train_student_tokenizer(texts, 512, directory / "student")
        teacher = make_checkpoint(
            directory / "teacher",
            tiny_config("teacher", 512, n_layer=2),
            train_teacher_tokenizer(texts, 512, directory / "teacher-tokenizer"),
            seed=1,
        )
        data = prepare_pair(
            directory / "data", directory / "train.jsonl", student, teacher, 128, val_input=directory / "val.jsonl"
        )
        score_teacher(data=data, teacher=teacher, output=directory / "cache", blocks_per_shard=8, num_workers=0)

    directory = built_once(tmp_path_factory, worker_id, "cached-split", build)
    return CachedSplit(directory / "data", directory / "cache", directory / "student", directory / "teacher")


def model_config_fields(config: Config) -> dict:
    """The fields of a tiny `config` that a --model_config file (or a recipe's `model_config:`) holds."""
    keys = ("name", "block_size", "vocab_size", "padding_multiple", "n_layer", "n_head", "n_embd")
    keys += ("rotary_percentage", "parallel_residual", "bias", "norm_class_name", "mlp_class_name", "intermediate_size")
    return {key: getattr(config, key) for key in keys}


def student_config_yaml(path: Path) -> Path:
    """A 1-layer student for TinyLlama's tokenizer, as a --model_config file."""
    path.write_text(json.dumps(model_config_fields(tiny_config("student", 32000, block_size=64))))
    return path


def built_once(tmp_path_factory, worker_id: str, name: str, build: Callable[[Path], None]) -> Path:
    """The folder `name` that `build` fills, once per test session: pytest-xdist's workers share it (the first one
    builds it, the others wait on a file lock; pytest-xdist's documented pattern)."""
    root = tmp_path_factory.getbasetemp()
    if worker_id != "master":
        root = root.parent  # the session's folder, above each worker's
    folder = root / name
    with FileLock(f"{folder}.lock"):
        if not (folder / ".built").is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            (folder / ".built").touch()
    return folder


def checked(*command: str | Path, timeout: int = 900, **kwargs) -> subprocess.CompletedProcess:
    """`command`, which must succeed (its output's end in the failure's message)."""
    out = subprocess.run([str(c) for c in command], capture_output=True, text=True, timeout=timeout, **kwargs)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return out


def build_dist(folder: Path) -> None:
    """The wheel and the source distribution, built by hatchling as `pip wheel --no-build-isolation` builds them."""
    checked(
        sys.executable, "-m", "hatchling", "build", "--target", "wheel", "--target", "sdist", "-d", folder, cwd=ROOT
    )


@pytest.fixture(scope="session")
def dist(tmp_path_factory, worker_id) -> Path:
    """This checkout's wheel and source distribution, built once per session."""
    return built_once(tmp_path_factory, worker_id, "dist", build_dist)


@pytest.fixture(scope="session")
def installed(tmp_path_factory, worker_id, dist) -> Path:
    """A fresh virtual environment (its folder) holding this environment's torch, then `pip install` of the wheel
    there, as a user installs it: with its dependencies, from the package index. Once per session."""

    def build(folder: Path) -> None:
        checked(sys.executable, "-m", "venv", "--without-pip", folder)
        # --no-compile: Python compiles a module when it first imports it, rather than pip the whole of torch.
        pip = [sys.executable, "-m", "pip", "--python", folder / "bin" / "python", "install", "--quiet", "--no-compile"]
        checked(*pip, f"torch=={torch.__version__}")
        checked(*pip, next(dist.glob("*.whl")))

    return built_once(tmp_path_factory, worker_id, "installed", build)


def run_quick_demo(vocagnolm: Path, folder: Path, env: dict | None = None) -> None:
    """`vocagnolm demo --quick true` as a user types it, in the empty `folder`, which it fills with out/demo; what it
    printed is in printed.txt."""
    out = checked(vocagnolm, "demo", "--quick", "true", cwd=folder, env=env)
    (folder / "printed.txt").write_text(out.stdout)


@pytest.fixture(scope="session")
def quick_demo(tmp_path_factory, worker_id) -> Path:
    """The quick demo run by this environment's command (`run_quick_demo`), from an empty folder outside the clone:
    once per session, for tests/test_demo.py and the docs' quote of its cost (tests/test_newcomer.py)."""
    return built_once(
        tmp_path_factory, worker_id, "quick-demo", lambda folder: run_quick_demo(BIN / "vocagnolm", folder)
    )


@pytest.fixture(scope="session")
def installed_quick_demo(tmp_path_factory, worker_id, installed) -> Path:
    """The quick demo run by the installed wheel's command (`installed`), whose corpus is the package's copy
    (tests/test_cli.py checks it read it there)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return built_once(
        tmp_path_factory,
        worker_id,
        "installed-quick-demo",
        lambda folder: run_quick_demo(installed / "bin" / "vocagnolm", folder, env),
    )


def typed_here(*argv: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """`argv` (`vocagnolm ...`, `litgpt pretrain ...` or `python -m litgpt pretrain ...`, as the user types it) run in
    this process, in `cwd`, through the functions its console script ends in, to its exit, with one torch thread as
    OMP_NUM_THREADS=1 gives a subprocess: its status, stdout and stderr, as `subprocess.run` gives a console script's.
    For a test whose point is not a process of its own (no signal, kill or exit of the interpreter, no second
    process): a console script's subprocess imports torch, Lightning and LitGPT again (3-5 s on an idle machine, 10-20
    s on a loaded one) to parse, check and run what this process does the same way. tests/test_cli.py runs the
    console scripts, the .pth hook and `python -m` in real processes. A bug's exception is raised here, with its
    traceback and what the command printed.

    - `vocagnolm ARGS`: `cli.main(ARGS)`, as `vocagnolm` and `python -m litgpt_vocagnolm` call it.
    - `litgpt ARGS`: what the .pth hook makes of LitGPT's console script (_hook.py): the refusals that need no LitGPT
      (`cli.check_before_litgpt`, as `litgpt` starts to load), then LitGPT's `main` as the hook wraps it.
    - `python -m litgpt ARGS`: the wrapped `main` alone, as runpy runs it.
    `sys.argv`, the working folder and torch's threads are restored after."""
    from litgpt_vocagnolm import _hook, cli

    words = [str(word) for word in argv]
    console = words[:3] != ["python", "-m", "litgpt"]
    words = words if console else ["litgpt", *words[3:]]
    if Path(words[0]).name not in ("vocagnolm", "litgpt"):
        raise ValueError(f"{words[0]} is not a console script of this package or LitGPT")
    argv_before, cwd_before, threads = list(sys.argv), os.getcwd(), torch.get_num_threads()
    out, err = io.StringIO(), io.StringIO()
    try:
        sys.argv[:] = [str(BIN / Path(words[0]).name), *words[1:]]  # what LitGPT's main and the recipe dispatch read
        os.chdir(cwd)
        torch.set_num_threads(1)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                if Path(words[0]).name == "vocagnolm":
                    cli.main(words[1:])
                else:
                    if console:
                        cli.check_before_litgpt(words)
                    import litgpt.__main__ as upstream

                    cli.litgpt_main(lambda: _hook.without_recipe(upstream.main))
                code = 0
            except SystemExit as stop:  # as the interpreter ends on it: a message to stderr and status 1
                code = stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
                if not isinstance(stop.code, int | None):
                    print(stop.code, file=sys.stderr)
    except BaseException:
        print(out.getvalue()[-3000:], err.getvalue()[-5000:], sep="\n")  # beside the traceback in pytest's report
        raise
    finally:
        sys.argv[:] = argv_before
        os.chdir(cwd_before)
        torch.set_num_threads(threads)
    return subprocess.CompletedProcess(words, code, out.getvalue(), err.getvalue())
