"""User errors, by command: one plain line and exit status 1 (its traceback with --debug), numbers refused where they
enter, paths checked before any work, and folders that keep what the user had in them."""

import json
import os
import re
import shutil
import subprocess

import pytest
from conftest import BIN, MISTRAL, RECIPES, ROOT, TINYLLAMA, make_checkpoint, tiny_config, typed_here
from litgpt.args import EvalArgs, TrainArgs

from litgpt_vocagnolm.cli import COMMANDS, main, plain_user_errors
from litgpt_vocagnolm.demo.settings import DemoSizes
from litgpt_vocagnolm.errors import InvalidArgument, PathMissing, PathTaken

PAPER_RECIPE = RECIPES / "tinyllama-qwen2.5-math-7b.yaml"  # TinyLlama (block 2048), Qwen2.5-Math-7B (4096)


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env or {})}
    return subprocess.run(list(args), cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)


def assert_one_line(out: subprocess.CompletedProcess, prog: str, message: str) -> None:
    assert out.returncode == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith(f"{prog}: error: ")]
    assert len(errors) == 1 and message in errors[0], out.stderr[-3000:]


# The entry points: `vocagnolm <command>` and `litgpt pretrain --recipe vocagnolm`: a console script's real process
# (its exit status, VOCAGNOLM_DEBUG in its environment) once, then the functions the console scripts end in, run here
# (`typed_here`), which print the same line and exit with the same status.


@pytest.mark.slow  # console scripts in subprocesses
def test_user_error_is_one_line_and_debug_shows_its_traceback(tmp_path):
    args = (
        str(BIN / "vocagnolm"),
        "prepare",
        "--student",
        str(TINYLLAMA),
        "--teacher",
        str(MISTRAL),
        "--input",
        str(tmp_path / "none.jsonl"),
        "--output",
        str(tmp_path / "out"),
        "--num_workers",
        "0",
    )
    assert_one_line(run(*args), "vocagnolm prepare", "--num_workers must be at least 1, got 0.")
    for out in (run(*args, "--debug"), run(*args, env={"VOCAGNOLM_DEBUG": "1"})):
        assert out.returncode == 1 and "Traceback" in out.stderr, out.stderr[-3000:]
        assert out.stderr.strip().endswith("InvalidArgument: --num_workers must be at least 1, got 0."), out.stderr
    assert not (tmp_path / "out").exists()


def test_recipe_user_error_is_one_line():
    out = typed_here("litgpt", "pretrain", "--recipe", "vocagnolm", "--train.micro_batch_size", "0")
    assert_one_line(out, "litgpt pretrain --recipe vocagnolm", "--train.micro_batch_size must be at least 1, got 0.")
    out = typed_here("vocagnolm", "pretrain", "--guidance.top_k", "5")  # a check in an argument dataclass
    assert_one_line(out, "vocagnolm pretrain", "guidance.top_k must be in (0, 1]")  # the command as typed


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_refuses_an_abbreviated_option(command, capsys):
    """Before: `prepare --max_seq_len 128` was taken as --max_seq_length, while `pretrain` refused an abbreviation.
    Each command's first option long enough to abbreviate, less its last two letters."""
    with pytest.raises(SystemExit):
        main([command, "--help"])
    options = sorted(set(re.findall(r"(?<![\w-])--\w[\w.-]*", capsys.readouterr().out)))
    abbreviation = next(o[:-2] for o in options if len(o) > 8 and sum(p.startswith(o[:-2]) for p in options) == 1)
    with pytest.raises(SystemExit) as exit_:
        main([command, abbreviation, "1"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"error: {abbreviation} is not an option" in err, err


@pytest.mark.parametrize("command", ["pretrain", "prepare", "plan"])
def test_a_config_that_is_a_folder_says_so(tmp_path, command, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--config", str(tmp_path)])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (
        f"vocagnolm {command}: error: --config {tmp_path} is a directory, not a file: give the path of a YAML file."
        " See --help.\n"
    )


def test_only_user_errors_lose_their_traceback(capsys):
    with pytest.raises(SystemExit) as exit_:
        with plain_user_errors("vocagnolm x", debug=False):
            raise PathMissing("data/nope is missing. Run `vocagnolm prepare`.")
    assert exit_.value.code == 1
    assert capsys.readouterr().err == "vocagnolm x: error: data/nope is missing. Run `vocagnolm prepare`.\n"
    with pytest.raises(ZeroDivisionError):  # a bug keeps its traceback
        with plain_user_errors("vocagnolm x", debug=False):
            1 / 0
    with pytest.raises(InvalidArgument):
        with plain_user_errors("vocagnolm x", debug=True):
            raise InvalidArgument("bad")
    # As torch's DataLoader re-raises an error of its worker: the worker's traceback, then the error's last line.
    wrapped = "Caught InvalidArgument in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
    wrapped += '  File "x.py", line 1, in f\nInvalidArgument: chunk-0-0.bin is damaged.\nPrepare again.'
    with pytest.raises(SystemExit):
        with plain_user_errors("vocagnolm x", debug=False):
            raise InvalidArgument(wrapped)
    assert capsys.readouterr().err == "vocagnolm x: error: chunk-0-0.bin is damaged.\nPrepare again.\n"
    with pytest.raises(SystemExit) as exit_:  # only a path the user gave can be refused by the file system
        with plain_user_errors("vocagnolm x", debug=False):
            raise PermissionError(13, "Permission denied", "/data/out")
    assert exit_.value.code == 1
    assert capsys.readouterr().err == (
        "vocagnolm x: error: [Errno 13] Permission denied: '/data/out'. Give a path this user may write to (and"
        " read).\n"
    )
    with pytest.raises(SystemExit) as exit_:  # Ctrl-C before the recipe takes SIGINT over (`slurm.stop_signal`)
        with plain_user_errors("litgpt pretrain --recipe vocagnolm", debug=False):
            raise KeyboardInterrupt
    assert exit_.value.code == 130
    assert capsys.readouterr().err == "litgpt pretrain --recipe vocagnolm: interrupted.\n"


# prepare


@pytest.mark.parametrize(
    "option, value",
    [
        ("num_workers", 0),
        ("num_workers", -2),
        ("max_seq_length", 0),
        ("teacher_max_length", -1),
        ("val_fraction", 0.0),
        ("val_fraction", 1.5),
    ],
)
def test_prepare_refuses_numbers_out_of_range(tmp_path, option, value):
    from litgpt_vocagnolm.data.prepare import prepare

    with pytest.raises(InvalidArgument, match=f"--{option} must"):
        prepare(
            student=TINYLLAMA,
            teacher=MISTRAL,
            input=tmp_path / "none.jsonl",
            output=tmp_path / "out",
            **{option: value},
        )


def test_prepare_refuses_an_output_it_cannot_create(tmp_path, gsm8k_sample):
    from litgpt_vocagnolm.data.prepare import prepare

    (tmp_path / "a-file").write_text("mine")
    with pytest.raises(PathTaken, match="a-file is a file, not a folder"):
        prepare(student=TINYLLAMA, teacher=MISTRAL, input=gsm8k_sample, output=tmp_path / "a-file" / "data")


def test_prepare_refuses_a_read_only_output(read_only_folder, gsm8k_sample):
    from litgpt_vocagnolm.data.prepare import prepare

    with pytest.raises(InvalidArgument, match="is not writable"):
        prepare(student=TINYLLAMA, teacher=MISTRAL, input=gsm8k_sample, output=read_only_folder / "data")


def test_prepare_names_a_text_file_named_parquet(tmp_path):
    from litgpt_vocagnolm.data.prepare import prepare

    (tmp_path / "notes.parquet").write_text("just text\n")
    with pytest.raises(InvalidArgument, match=r"--input .*notes.parquet: .*Give Parquet files .*name text files .txt"):
        prepare(student=TINYLLAMA, teacher=MISTRAL, input=tmp_path / "notes.parquet", output=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_prepare_caps_a_teacher_window_beyond_what_a_block_holds(tmp_path, gsm8k_sample, capsys):
    from litgpt_vocagnolm.data.prepare import prepare

    prepare(
        student=TINYLLAMA,
        teacher=MISTRAL,
        input=gsm8k_sample,
        output=tmp_path / "out",
        max_seq_length=32,
        teacher_max_length=100_000_000,
        num_workers=1,
        text_key="question,answer",
        val_fraction=0.1,
    )
    longest = 27  # bytes of TinyLlama's longest token: a block of 33 student tokens holds at most 33 x 28 teacher ones
    assert f"--teacher_max_length 100,000,000 capped at {33 * (longest + 1):,}" in capsys.readouterr().out
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["teacher_max_length"] == 33 * (longest + 1)


# training: `litgpt pretrain --recipe vocagnolm`


@pytest.mark.parametrize(
    "train, eval, devices, num_nodes, flag",
    [
        (TrainArgs(micro_batch_size=0), EvalArgs(), 1, 1, "--train.micro_batch_size"),
        (TrainArgs(micro_batch_size=-4), EvalArgs(), 1, 1, "--train.micro_batch_size"),
        (TrainArgs(global_batch_size=0), EvalArgs(), 1, 1, "--train.global_batch_size"),
        (TrainArgs(max_tokens=-1, max_norm=1.0), EvalArgs(), 1, 1, "--train.max_tokens"),
        (TrainArgs(max_tokens=100, max_norm=0.0), EvalArgs(), 1, 1, "--train.max_norm"),
        (TrainArgs(save_interval=0), EvalArgs(), 1, 1, "--train.save_interval"),
        (TrainArgs(), EvalArgs(interval=0), 1, 1, "--eval.interval"),
        (TrainArgs(), EvalArgs(), 0, 1, "--devices"),
        (TrainArgs(), EvalArgs(), -1, 1, "--devices"),
        (TrainArgs(), EvalArgs(), 1, 0, "--num_nodes"),
    ],
)
def test_recipe_refuses_numbers_out_of_range(tmp_path, train, eval, devices, num_nodes, flag):
    from litgpt_vocagnolm.training.recipe import setup

    with pytest.raises(InvalidArgument, match=f"{flag} must"):
        setup(
            model_name="pythia-14m",
            out_dir=tmp_path / "out",
            train=train,
            eval=eval,
            devices=devices,
            num_nodes=num_nodes,
        )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "optimizer, message",
    [
        ("Adamx", "--optimizer: module 'torch.optim' has no attribute 'Adamx'. Name a torch.optim class"),
        ({"class_path": "torch.optim.AdamW", "init_args": {"lr": -1}}, "--optimizer: Invalid learning rate: -1. Name"),
    ],
)
def test_recipe_refuses_an_optimizer_it_cannot_build_before_loading_anything(tmp_path, optimizer, message):
    from litgpt_vocagnolm.training.recipe import setup

    with pytest.raises(InvalidArgument, match=re.escape(message)):
        setup(model_name="pythia-14m", out_dir=tmp_path / "out", optimizer=optimizer)
    assert not (tmp_path / "out").exists()


def test_recipe_refuses_an_out_dir_it_cannot_create_before_loading_anything(tmp_path):
    from litgpt_vocagnolm.training.recipe import setup

    (tmp_path / "a-file").write_text("mine")
    with pytest.raises(PathTaken, match="a-file is a file, not a folder"):
        setup(model_name="pythia-14m", out_dir=tmp_path / "a-file" / "run")  # data: not even looked at yet


def test_damaged_chunk_names_the_file_and_the_fix(tmp_path, tinyllama_mistral_data):
    from litgpt_vocagnolm.data.prepared import VocAgnoData

    data = shutil.copytree(tinyllama_mistral_data, tmp_path / "data")
    chunk = data / "train" / json.loads((data / "train" / "index.json").read_text())["chunks"][0]["filename"]
    with open(chunk, "r+b") as f:  # damaged in place: the same size, so the start-up checks pass
        f.write(b"\xff" * 4096)
    module = VocAgnoData(path=data, num_workers=0)
    module.connect(batch_size=4, max_seq_length=64)
    module.check_files()
    with pytest.raises(InvalidArgument) as error:
        for _ in module.train_dataloader():
            pass
    assert f"{chunk} is damaged" in str(error.value) and "vocagnolm prepare" in str(error.value)


# plan: what can't run is refused before any estimate


@pytest.mark.parametrize(
    "args, message",
    [
        (["--train.micro_batch_size", "-1"], "--train.micro_batch_size must be at least 1, got -1."),
        (["--devices", "0"], "--devices must be 'auto' or a positive number"),
        (["--window", "0"], "--window must be at least 1, got 0."),
        (["--window", "-5"], "--window must be at least 1, got -5."),
        (["--window", "5000"], "longer than Qwen2.5-Math-7B's block size 4096"),
        (["--train.max_seq_length", "4096"], "longer than the student's block size 2048"),
        (["--gpu_memory", "0"], "--gpu_memory must be above 0"),
        (["--model_name", "nope-1b"], "--model_name: 'nope-1b' is not a LitGPT config name."),
        (["--teacher.checkpoint_dir", "checkpoints/Org/nope-7b"], "(no model_config.yaml there yet: its name): 'nope"),
    ],
)
def test_plan_refuses_what_cannot_run(args, message, capsys):
    from litgpt_vocagnolm.planning.plan import plan

    with pytest.raises(InvalidArgument) as error:
        plan(["--config", str(PAPER_RECIPE), *args])
    assert message in str(error.value)
    assert "fits" not in capsys.readouterr().out


# inspect: its output files checked before any work


@pytest.mark.parametrize(
    "option, name, error, message",
    [
        ("html", "a-folder", PathTaken, "--html {path} is a folder: give a file path"),
        ("plot", "fig.txt", InvalidArgument, "--plot {path}: the file must end in .png, .pdf, .svg, not .txt."),
        ("json", "report.yaml", InvalidArgument, "--json {path}: the file must end in .json"),
    ],
)
def test_inspect_refuses_output_files_it_cannot_write(tmp_path, capsys, option, name, error, message):
    from litgpt_vocagnolm.alignment.inspection import inspect

    (tmp_path / "a-folder").mkdir()
    with pytest.raises(error, match=re.escape(message.format(path=tmp_path / name))):
        inspect(student=TINYLLAMA, teacher=MISTRAL, **{option: tmp_path / name})
    assert capsys.readouterr().out == ""  # refused before the report


def test_inspect_refuses_a_negative_row_count(capsys):
    from litgpt_vocagnolm.alignment.inspection import inspect

    with pytest.raises(InvalidArgument, match=re.escape("--rows must be at least 0, got -3.")):
        inspect(student=TINYLLAMA, teacher=MISTRAL, rows=-3)
    assert capsys.readouterr().out == ""  # refused before the report


def test_inspect_writes_into_a_folder_it_creates(tmp_path):
    from litgpt_vocagnolm.alignment.inspection import inspect

    inspect(student=TINYLLAMA, teacher=MISTRAL, json=tmp_path / "new" / "figures.json", rows=0)
    assert json.loads((tmp_path / "new" / "figures.json").read_text())["iou"] > 0


# convert_to_litgpt


def test_convert_on_a_missing_folder_says_so():
    out = typed_here("vocagnolm", "convert_to_litgpt", "nope", cwd=ROOT)
    assert_one_line(out, "vocagnolm convert_to_litgpt", "checkpoint_dir 'nope' is not a folder.")


def test_convert_names_an_unknown_config(tmp_path):
    from litgpt_vocagnolm.models.model_configs import convert_to_litgpt

    (tmp_path / "my-model").mkdir()
    with pytest.raises(
        InvalidArgument,
        match=r"The folder's name .*else pass --model_name NAME\): 'my-model' is not a LitGPT config name",
    ):
        convert_to_litgpt(tmp_path / "my-model")


def test_convert_refuses_a_folder_without_hugging_face_weights(tmp_path):
    from conftest import make_checkpoint, tiny_config

    from litgpt_vocagnolm.models.model_configs import convert_to_litgpt

    (tmp_path / "llemma_7b").mkdir()
    (tmp_path / "llemma_7b" / "config.json").write_text("{}")
    with pytest.raises(
        PathMissing, match=r"holds no Hugging Face weights \(\*.safetensors or \*.bin; it holds \['config"
    ):
        convert_to_litgpt(tmp_path / "llemma_7b")
    litgpt = make_checkpoint(tmp_path / "pythia-14m", tiny_config("pythia-14m", 32000), TINYLLAMA)
    with pytest.raises(InvalidArgument, match="is a LitGPT checkpoint already"):
        convert_to_litgpt(litgpt)


# demo: deletes only what it wrote


@pytest.mark.parametrize(
    "options, flag",
    [
        ({"top_k": 1.5}, "--top_k"),
        ({"top_k": 0.0}, "--top_k"),
        ({"workers": 0}, "worker"),
        ({"noise": -0.1}, "--noise"),
        ({"quick": True, "sizes": DemoSizes(student_vocab_size=500)}, "--quick true sets every size"),
    ],
)
def test_demo_refuses_numbers_out_of_range_before_any_work(tmp_path, options, flag):
    from litgpt_vocagnolm.demo.pipeline import demo

    with pytest.raises(InvalidArgument, match=flag):
        demo(out_dir=tmp_path / "demo", **options)
    assert not (tmp_path / "demo").exists()


@pytest.mark.parametrize(
    "sizes, flag",
    [
        ({"micro_batch_size": 0}, "--sizes.micro_batch_size"),
        ({"student_tokens": -1}, "--sizes.student_tokens"),
        ({"documents": 0}, "--sizes.documents"),
        ({"heldout_share": 0.0}, "--sizes.heldout_share"),
        ({"student_vocab_size": 10}, "--sizes.student_vocab_size must be at least 359"),
        ({"second_teacher_vocab_size": 300}, "--sizes.second_teacher_vocab_size must be at least 359"),
        ({"teacher_vocab_size": 10}, "--sizes.teacher_vocab_size must be at least 257"),
    ],
)
def test_demo_sizes_refuse_numbers_out_of_range(sizes, flag):
    from litgpt_vocagnolm.demo.settings import DemoSizes

    with pytest.raises(InvalidArgument, match=flag):
        DemoSizes(**sizes)


def test_demo_refuses_a_folder_with_anything_else_and_keeps_it(tmp_path):
    from litgpt_vocagnolm.demo.pipeline import demo

    clone = tmp_path / "clone"  # `vocagnolm demo --out_dir .` in a clone of the repository
    (clone / "data").mkdir(parents=True)
    (clone / "data" / "gsm8k.jsonl").write_text("the repository's data\n")
    (clone / "README.md").write_text("# readme\n")
    with pytest.raises(PathTaken, match="holds README.md, data, which `vocagnolm demo` did not write"):
        demo(out_dir=clone, quick=True)
    assert (clone / "data" / "gsm8k.jsonl").read_text() == "the repository's data\n"
    assert sorted(p.name for p in clone.iterdir()) == ["README.md", "data"]


def test_demo_replaces_only_its_own_files(tmp_path):
    from litgpt_vocagnolm.demo.pipeline import RECORD, claim_out_dir, demo_paths

    out_dir = tmp_path / "demo"
    claim_out_dir(out_dir, demo_paths([("ce", 1)]))  # a new folder: the demo records what it will write first
    (out_dir / "runs" / "teacher").mkdir(parents=True)
    (out_dir / "results.md").write_text("an earlier demo's table")
    claim_out_dir(out_dir)  # a rerun: replaces the earlier demo's files
    assert sorted(p.name for p in out_dir.iterdir()) == [RECORD]
    (out_dir / "runs").mkdir()
    (out_dir / "notes.txt").write_text("mine")
    with pytest.raises(PathTaken, match="holds notes.txt, which"):
        claim_out_dir(out_dir)
    assert (out_dir / "notes.txt").read_text() == "mine" and (out_dir / "runs").is_dir()
    (out_dir / "notes.txt").unlink()
    with pytest.raises(PathTaken, match="is a file"):
        claim_out_dir(out_dir / RECORD)


def test_a_demo_run_again_keeps_a_file_put_in_its_folders(tmp_path):
    from litgpt_vocagnolm.demo.pipeline import claim_out_dir, record_finished

    out_dir = tmp_path / "demo"
    claim_out_dir(out_dir)
    (out_dir / "runs" / "ce-seed1").mkdir(parents=True)
    (out_dir / "runs" / "ce-seed1" / "metrics.csv").write_text("the demo's")
    record_finished(out_dir)
    (out_dir / "runs" / "notes.txt").write_text("mine")
    with pytest.raises(PathTaken, match="holds runs/notes.txt, which `vocagnolm demo` did not write"):
        claim_out_dir(out_dir)
    assert (out_dir / "runs" / "notes.txt").read_text() == "mine"
    (out_dir / "runs" / "notes.txt").unlink()
    claim_out_dir(out_dir)  # only its own files: replaced
    assert not (out_dir / "runs").exists()


def test_a_demo_stopped_in_the_middle_and_run_again_keeps_a_file_put_in_its_folders(tmp_path):
    """Stopped before it recorded its files, a demo's record lists the paths it would write: a rerun replaces what
    lies under them (a stage's unfinished files) and refuses to delete anything else (it deleted its folders whole)."""
    from litgpt_vocagnolm.demo.pipeline import claim_out_dir, demo_paths

    out_dir = tmp_path / "demo"
    claim_out_dir(out_dir, demo_paths([("ce", 1)]))
    (out_dir / "runs" / "ce-seed1" / "out").mkdir(parents=True)
    (out_dir / "runs" / "ce-seed1" / "out" / "metrics.csv").write_text("a stage's unfinished file")
    (out_dir / "data").mkdir()
    (out_dir / "data" / "students.log").write_text("prepare's report")
    (out_dir / "runs" / "notes.txt").write_text("mine")
    with pytest.raises(PathTaken, match="holds runs/notes.txt, which `vocagnolm demo` did not write"):
        claim_out_dir(out_dir, demo_paths([("ce", 1)]))
    assert (out_dir / "runs" / "notes.txt").read_text() == "mine"
    (out_dir / "runs" / "notes.txt").unlink()
    claim_out_dir(out_dir, demo_paths([("ce", 1)]))  # only its own files: replaced
    assert not (out_dir / "runs").exists() and not (out_dir / "data").exists()


def test_a_demo_budget_beyond_the_corpus_is_a_user_error():
    from litgpt_vocagnolm.demo.corpus import documents_for

    with pytest.raises(
        InvalidArgument, match="The corpus holds 6 tokens for this budget of 1,000 .plus 5%.: lower the budget"
    ):
        documents_for(["one two three", "four"], TINYLLAMA, 1000)


def test_bits_per_byte_names_a_tokenizer_without_bos_or_eos():
    from types import SimpleNamespace

    from litgpt_vocagnolm.evaluation.evaluate import bits_per_byte_of_documents

    with pytest.raises(InvalidArgument, match="--bpb needs a tokenizer with a BOS or EOS token"):
        bits_per_byte_of_documents(None, SimpleNamespace(bos_id=None, eos_id=None), ["text"], batch_size=1)


# export and evaluate on what they don't take


def test_export_of_a_missing_folder_and_a_damaged_model_config_are_one_line(tmp_path):
    out = typed_here("vocagnolm", "export", "out/step-00000010", str(tmp_path / "exported"), cwd=ROOT)
    assert_one_line(out, "vocagnolm export", "checkpoint_dir 'out/step-00000010' does not exist: pass a step-*")
    assert not (tmp_path / "exported").exists()
    checkpoint = make_checkpoint(tmp_path / "ckpt", tiny_config("t", 32000), TINYLLAMA)
    config = checkpoint / "model_config.yaml"
    config.write_text(config.read_text() + f"extra: !!python/object/apply:os.system ['touch {tmp_path / 'ran'}']\n")
    out = typed_here("vocagnolm", "evaluate", str(checkpoint), "--tasks", "gsm8k", "--limit", "1", cwd=ROOT)
    assert_one_line(out, "vocagnolm evaluate", f"{config} is not a LitGPT model config (ConstructorError: ")
    assert not (tmp_path / "ran").exists() and not (checkpoint / "evaluate").exists()
