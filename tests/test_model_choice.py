"""The student a user asks for, as LitGPT users give it: a config name (`--model_name`), a config file
(`--model_config`, such as the model_config.yaml `litgpt download` writes beside lit_model.pth) or a checkpoint folder
(`--initial_checkpoint_dir` alone). What is typed on the command line wins over the recipe's `--config`, and a model of
the recipe set aside is said; what trains is what --print_config shows, what hyperparameters.yaml records and what
LitGPT loads from the checkpoint. And `--train.tie_embeddings true` trains as LitGPT's tied GPT does.

Each command runs as typed, in this process (`cli.main`), on the packaged recipes (`demo-cpu`, the paper's
`tinyllama-qwen2.5-math-7b`) with their own settings; a run is given a budget of one step and the data prepared here.
"""

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import MISTRAL, ROOT, TINYLLAMA, prepare_pair, tiny_config
from litgpt.config import Config
from litgpt.model import GPT
from litgpt.utils import save_config
from test_advice import fix, options, refusal, runs, typed
from test_recipe import metrics

from litgpt_vocagnolm.data.prepared import iter_blocks
from litgpt_vocagnolm.loss.cross_entropy import IGNORE_INDEX

pytestmark = pytest.mark.usefixtures("one_thread")
STUDENT = tiny_config(
    "student", 32000, n_layer=2, n_embd=64, block_size=128
)  # TinyLlama's vocabulary, demo-cpu's block
PAPER = "tinyllama-qwen2.5-math-7b"  # a paper recipe: `model_name: tiny-llama-1.1b`, TinyLlama's checkpoint


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """Six GSM8K problems prepared at demo-cpu's 128 tokens: a few train blocks and one or more for validation."""
    folder = tmp_path_factory.mktemp("model-choice")
    corpus = folder / "gsm8k-6.jsonl"
    corpus.write_text("\n".join((ROOT / "data" / "gsm8k" / "train.jsonl").read_text().splitlines()[:6]) + "\n")
    return prepare_pair(folder / "data", corpus, TINYLLAMA, MISTRAL, max_seq_length=128)


def checkpoint(folder: Path, config: Config, tied: bool = False, seed: int = 0) -> Path:
    """A LitGPT checkpoint folder of `config` (weights, model_config.yaml); with `tied`, the head and the embedding one
    tensor, as litgpt/pretrain.py ties them (`model.transformer.wte.weight = model.lm_head.weight`)."""
    folder.mkdir(parents=True)
    torch.manual_seed(seed)
    model = GPT(config)
    if tied:
        model.transformer.wte.weight = model.lm_head.weight
    torch.save(model.state_dict(), folder / "lit_model.pth")
    save_config(config, folder)
    return folder


def one_step(data: Path, out_dir: Path, blocks: int = 16) -> list[str]:
    """demo-cpu's data path and out_dir here, and a budget of one optimizer step of `blocks` blocks."""
    return [
        "--data.path", str(data), "--out_dir", str(out_dir), "--train.global_batch_size", str(blocks),
        "--train.micro_batch_size", str(blocks), "--train.max_tokens", str(blocks * 128), "--train.log_interval", "1",
        "--eval.max_iters", "1",
    ]  # fmt: skip


def printed(capsys, *argv: str | Path) -> tuple[dict, str]:
    """What `vocagnolm ARGV --print_config` shows (the run's settings, as hyperparameters.yaml records them) and what it
    says on stderr."""
    code, out, err = typed(capsys, *argv, "--print_config")
    assert code == 0, err[-3000:]
    return yaml.safe_load(out), err


# A name, a file, a checkpoint folder: what is typed wins


def test_a_typed_model_name_wins_over_the_recipes_model_config_in_pretrain_and_plan(capsys):
    settings, said = printed(capsys, "pretrain", "--config", "demo-cpu", "--model_name", "pythia-14m")
    assert (settings["model_name"], settings["model_config"]) == ("pythia-14m", None)
    assert said == (
        "--model_name pythia-14m: the student is 'pythia-14m'; the model_config of --config demo-cpu"
        " ('demo-cpu-student') is not used.\n"
    )
    assert "demo-cpu.yaml: student pythia-14m, no teacher" in runs(
        capsys, "plan", "--config", "demo-cpu", "--model_name", "pythia-14m"
    )


@pytest.mark.parametrize(
    "name",
    [
        "pythia-14m",
        "SmolLM2-135M",
        "Qwen2.5-0.5B",
        "Llama-3.1-8B",  # rope_adjustments
        "Gemma-3-1b-it",  # rope_indices, sliding_window_indices, rope_local_base_freq
        "Mixtral-8x7B-v0.1",  # experts
        "OLMo-2-1124-7B",  # norm_qk
    ],
)
def test_a_model_config_yaml_as_litgpt_writes_it_is_the_student(name, tmp_path, capsys):
    """The model_config.yaml `litgpt download` writes beside lit_model.pth (`save_config`), over a paper recipe's
    `model_name`: every field LitGPT writes is read back."""
    save_config(Config.from_name(name), tmp_path)
    settings, said = printed(capsys, "pretrain", "--config", PAPER, "--model_config", tmp_path / "model_config.yaml")
    assert settings["model_name"] is None and Config(**settings["model_config"]) == Config.from_name(name)
    recipes = f"the model_name of --config {PAPER} ('tiny-llama-1.1b')"
    assert said == f"--model_config: the student is {name!r}; {recipes} is not used.\n"


def test_a_model_config_file_replaces_the_recipes_and_a_field_typed_changes_it(tmp_path, capsys):
    """The file's fields, Config's defaults for those it lacks (not demo-cpu's: RMSNorm, LLaMAMLP, 344 wide MLP)."""
    fields = {"name": "mine", "block_size": 128, "vocab_size": 32000, "n_layer": 1, "n_head": 2, "n_embd": 32}
    (tmp_path / "mine.json").write_text(json.dumps(fields))
    settings, said = printed(capsys, "pretrain", "--config", "demo-cpu", "--model_config", tmp_path / "mine.json")
    assert Config(**settings["model_config"]) == Config(**fields) and said == ""
    settings, _ = printed(
        capsys,
        "pretrain",
        "--config",
        "demo-cpu",
        "--model_config",
        tmp_path / "mine.json",
        "--model_config.n_layer",
        "3",
    )
    assert Config(**settings["model_config"]) == Config(**fields | {"n_layer": 3})


@pytest.mark.parametrize(
    "argv, student",
    [
        (["--model_name", "pythia-14m", "--model_config.block_size", "64"], ("pythia-14m", 64, 6)),
        (["--model_config.block_size", "64", "--model_name", "pythia-14m"], ("pythia-14m", 64, 6)),  # either order
        (["--config", PAPER, "--model_config.block_size", "4096"], ("tiny-llama-1.1b", 4096, 22)),
        (["--config", "demo-cpu", "--model_config.block_size", "256"], ("demo-cpu-student", 256, 2)),
        (["--config", "demo-cpu", "--model_config", "null", "--model_name", "pythia-14m"], ("pythia-14m", None, None)),
    ],
)
def test_a_field_typed_changes_the_student_however_it_is_named(argv, student, capsys):
    """(`--model_config null` clears the recipe's config: the name alone then gives the student.)"""
    settings, said = printed(capsys, "pretrain", *argv)
    assert (settings["model_name"] is None) == (settings["model_config"] is not None)  # one of them
    config = settings["model_config"] or {"name": settings["model_name"], "block_size": None, "n_layer": None}
    assert (config["name"], config["block_size"], config["n_layer"]) == student and "is not used" not in said


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--model_name", "pythia-14m", "--model_config", '{"name": "mine"}'],
            "--model_name pythia-14m and --model_config both give the student: give one",
        ),
        (["--model_config", "nowhere.yaml"], "--model_config nowhere.yaml: no such file. Give a YAML or JSON file"),
        (["--model_config", "FOLDER"], "--model_config FOLDER is a folder: give its model_config.yaml, --model_config"),
    ],
)
def test_a_student_given_twice_or_a_config_file_not_there_is_one_line(argv, message, tmp_path, capsys):
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    argv = [str(folder) if arg == "FOLDER" else arg for arg in argv]
    assert refusal(capsys, "pretrain", "--config", "demo-cpu", *argv).startswith(message.replace("FOLDER", str(folder)))


def test_a_config_file_that_is_not_one_is_refused_naming_the_field(tmp_path, capsys):
    (tmp_path / "bad.yaml").write_text("name: mine\nn_layers: 3\n")
    code, _, said = typed(capsys, "pretrain", "--model_config", tmp_path / "bad.yaml")
    assert code == 2 and said.count("\n") == 1
    reason = "(Validation failed: Key 'n_layers' is not expected)"
    assert f"error: --model_config: {tmp_path / 'bad.yaml'} is not a model config {reason}: give a YAML or JSON" in said


# A checkpoint folder: its model, or a refusal that names where each side came from


@pytest.mark.slow
def test_a_checkpoint_typed_alone_is_the_student_that_trains_resumes_and_loads_in_litgpt(tmp_path, data, capsys):
    """As `litgpt generate` and `litgpt finetune` build a checkpoint's model: its model_config.yaml over demo-cpu's
    model; hyperparameters.yaml records it, so the run resumes from it; resumed as another model, it is refused."""
    start = checkpoint(tmp_path / "start", STUDENT)
    out, final = tmp_path / "out", tmp_path / "out" / "final"
    code, _, said = typed(
        capsys, "pretrain", "--config", "demo-cpu", "--initial_checkpoint_dir", start, *one_step(data, out)
    )
    assert code == 0, said[-3000:]
    assert (
        f"{start / 'model_config.yaml'}: the student is 'student'; the model_config of --config demo-cpu"
        " ('demo-cpu-student') is not used." in said.splitlines()
    )
    assert Config.from_file(final / "model_config.yaml") == STUDENT
    recorded = yaml.safe_load((final / "hyperparameters.yaml").read_text())
    assert recorded["model_name"] is None and Config(**recorded["model_config"]) == STUDENT
    GPT(STUDENT).load_state_dict(torch.load(final / "lit_model.pth", weights_only=True)["model"], strict=True)
    assert "demo-cpu.yaml: student student," in runs(
        capsys, "plan", "--config", "demo-cpu", "--initial_checkpoint_dir", start
    )

    two_steps = ["--resume", "auto", "--train.max_tokens", str(2 * 16 * 128)]
    message = refusal(capsys, "pretrain", "--config", "demo-cpu", *one_step(data, out), *two_steps)
    assert message.startswith(f"--resume: {final} was trained as 'student', this run's student is 'demo-cpu-student'")
    runs(capsys, "pretrain", "--config", final / "hyperparameters.yaml", *two_steps)
    assert [row["iter"] for row in metrics(out)] == [1, 2]


def test_a_checkpoint_folder_not_downloaded_yet_gives_the_model_its_name_names(capsys):
    """As LitGPT's `Config.from_checkpoint` finds a model, and `plan` a teacher: the folder `litgpt download` will
    make, planned before it is there."""
    folder = ["--initial_checkpoint_dir", "checkpoints/Qwen/Qwen2.5-0.5B"]
    settings, said = printed(capsys, "pretrain", "--config", PAPER, *folder)
    assert (settings["model_name"], settings["model_config"]) == ("Qwen2.5-0.5B", None)
    assert said.startswith("checkpoints/Qwen/Qwen2.5-0.5B (no model_config.yaml there yet: its name): the student is")
    assert f"{PAPER}.yaml: student Qwen2.5-0.5B, teacher online" in runs(capsys, "plan", "--config", PAPER, *folder)


def test_a_checkpoint_of_another_model_is_refused_naming_both_sides_and_each_fix_works(tmp_path, capsys):
    start = checkpoint(tmp_path / "start", STUDENT)
    typed_dir = ["--initial_checkpoint_dir", str(start)]
    message = refusal(capsys, "pretrain", "--config", "demo-cpu", "--model_name", "pythia-14m", *typed_dir)
    assert message.startswith(
        f"--initial_checkpoint_dir {str(start)!r} holds another architecture than the student 'pythia-14m'"
        " (--model_name pythia-14m; "
    )
    its_model = options(fix(message, "To continue that checkpoint"))
    assert its_model == ["--model_config", str(start / "model_config.yaml")]
    printed(capsys, "pretrain", "--config", "demo-cpu", *its_model, *typed_dir)
    printed(capsys, "pretrain", "--config", "demo-cpu", "--model_name", "pythia-14m", *typed_dir[:1], "null")

    recipe = tmp_path / "recipe.yaml"  # a recipe of the user's that names the checkpoint
    recipe.write_text(yaml.safe_dump({"initial_checkpoint_dir": str(start)}))
    message = refusal(capsys, "pretrain", "--config", "demo-cpu", "--config", recipe, "--model_name", "pythia-14m")
    assert message.startswith(
        f"the initial_checkpoint_dir of --config {recipe} {str(start)!r} holds another architecture than the student"
        " 'pythia-14m' (--model_name pythia-14m; "
    )
    message = refusal(capsys, "pretrain", "--config", "demo-cpu", "--config", recipe)
    assert "than the student 'demo-cpu-student' (the model_config of --config demo-cpu; " in message


# --train.tie_embeddings


@pytest.mark.slow
def test_tied_embeddings_train_as_litgpts_tied_gpt_and_the_checkpoint_loads_in_litgpt(tmp_path, data, capsys):
    """One step of SGD (lr 1, no clipping, no decay) over the whole train split, so the blocks' order does not count:
    the loss and the weights after it are those of LitGPT's GPT with `lm_head.weight` tied to `transformer.wte.weight`,
    whose gradient is the embedding's and the head's summed."""
    start = checkpoint(tmp_path / "tied", STUDENT, tied=True)
    blocks = list(iter_blocks(data))
    runs(
        capsys,
        "pretrain", "--config", "demo-cpu", "--initial_checkpoint_dir", start, "--train.tie_embeddings", "true",
        *one_step(data, tmp_path / "out", blocks=len(blocks)), "--optimizer", "SGD", "--optimizer.lr", "1",
        "--optimizer.weight_decay", "0", "--train.min_lr", "1", "--train.max_norm", "1e9",
    )  # fmt: skip

    litgpt = GPT(STUDENT)
    litgpt.transformer.wte.weight = litgpt.lm_head.weight
    litgpt.load_state_dict(torch.load(start / "lit_model.pth"))
    ids = torch.stack([torch.from_numpy(block["student_ids"]) for block in blocks])  # (N, 129)
    targets = ids[:, 1:].clone()
    for row, block in enumerate(blocks):
        targets[row, block["num_tokens"] - 1 :] = IGNORE_INDEX  # padding
    loss = F.cross_entropy(litgpt(ids[:, :-1]).flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)
    loss.backward()
    with torch.no_grad():
        for param in litgpt.parameters():
            param -= param.grad

    (row,) = metrics(tmp_path / "out")
    assert row["loss"] == pytest.approx(loss.item(), rel=1e-5)
    final = tmp_path / "out" / "final"
    trained = torch.load(final / "lit_model.pth", weights_only=True)["model"]
    assert torch.equal(trained["lm_head.weight"], trained["transformer.wte.weight"])  # what LitGPT's generate loads
    assert not torch.equal(trained["lm_head.weight"], torch.load(start / "lit_model.pth")["lm_head.weight"])  # moved
    for name, expected in litgpt.state_dict().items():
        torch.testing.assert_close(trained[name], expected, rtol=1e-4, atol=1e-6, msg=name)
    # `litgpt generate` builds LitGPT's GPT from the checkpoint's config (no tying) and loads strictly.
    GPT(Config.from_file(final / "model_config.yaml")).load_state_dict(trained, strict=True)
