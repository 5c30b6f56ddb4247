"""User errors of the recipe (`litgpt pretrain --recipe vocagnolm`) and of `vocagnolm export`: each a `UserError`
(one line and exit status 1 on the command line) raised before any model is built, never a library's traceback."""

import importlib.util
import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from conftest import MISTRAL, QWEN, TINYLLAMA, make_checkpoint, prepare_pair, tiny_config
from litgpt.args import TrainArgs
from test_checkpoints import setup_args

from litgpt_vocagnolm.cli import main
from litgpt_vocagnolm.data.prepared import VocAgnoData
from litgpt_vocagnolm.errors import InvalidArgument, NotFinite, PathTaken, Unguided, UserError
from litgpt_vocagnolm.loss.methods import GuidanceArgs
from litgpt_vocagnolm.training.checks import resume_history
from litgpt_vocagnolm.training.export import export
from litgpt_vocagnolm.training.recipe import setup


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, tinyllama_mistral_data) -> Path:
    """A finished one-step run: its out_dir (final/ and step-00000001/)."""
    tmp_path = tmp_path_factory.mktemp("run")
    train = TrainArgs(
        global_batch_size=2, micro_batch_size=2, max_tokens=2 * 64, max_norm=1.0, max_seq_length=64, save_interval=1
    )
    setup(**setup_args(tmp_path, tinyllama_mistral_data, train=train))
    return tmp_path / "out"


def resume(out_dir: Path, data: Path, **overrides) -> None:
    train = TrainArgs(
        global_batch_size=2, micro_batch_size=2, max_tokens=2 * 2 * 64, max_norm=1.0, max_seq_length=64, save_interval=1
    )
    setup(**setup_args(out_dir.parent, data, train=train, resume="auto") | overrides)


def test_a_fresh_run_into_a_finished_out_dir_is_a_user_error(finished_run, tinyllama_mistral_data):
    with pytest.raises(PathTaken, match="holds a previous run's checkpoints"):
        setup(**setup_args(finished_run.parent, tinyllama_mistral_data))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(precision="bf16-true"), "--precision bf16-true differs from the run's None"),
        (
            dict(guidance=GuidanceArgs(method="vocagnolm"), teacher=None),
            "--guidance.method vocagnolm differs from the run's ce",
        ),
        (
            dict(
                train=TrainArgs(
                    global_batch_size=2, micro_batch_size=2, max_tokens=4 * 64, max_norm=1.0, max_seq_length=32
                )
            ),
            "holds blocks of 64 tokens .*; training asks for 32",  # refused by the data first, before the resume
        ),
    ],
)
def test_a_resume_that_changes_the_run_is_a_user_error(finished_run, tinyllama_mistral_data, overrides, message):
    from litgpt_vocagnolm.training.teacher import TeacherArgs

    if "teacher" in overrides:
        overrides["teacher"] = TeacherArgs(
            checkpoint_dir=make_checkpoint(finished_run.parent / "teacher", tiny_config("t", 32000), MISTRAL)
        )
    with pytest.raises(InvalidArgument, match=message):
        resume(finished_run, tinyllama_mistral_data, **overrides)


def test_a_resume_on_other_data_is_refused_naming_both(finished_run, tinyllama_mistral_data, tmp_path):
    other = shutil.copytree(tinyllama_mistral_data, tmp_path / "other")
    manifest = json.loads((other / "manifest.json").read_text())
    (other / "manifest.json").write_text(json.dumps(manifest | {"token_ratio": manifest["token_ratio"] + 1}))
    with pytest.raises(InvalidArgument, match=f"--data.init_args.path {other} differs from the run's"):
        resume(finished_run, other)


def test_a_resume_on_the_same_data_spelt_otherwise_or_copied_goes_on(finished_run, tinyllama_mistral_data, tmp_path):
    checkpoint = finished_run / "step-00000001"
    hparams = yaml.safe_load((checkpoint / "hyperparameters.yaml").read_text())
    data = Path(hparams["data"]["init_args"]["path"])
    copy = shutil.copytree(tinyllama_mistral_data, tmp_path / "copy")
    for path in (Path(os.path.relpath(data.resolve())), data.parent / "." / data.name, copy):
        hparams["data"]["init_args"]["path"] = str(path)
        assert resume_history(checkpoint, hparams, world_size=1) == []


@pytest.fixture(scope="module")
def guided_run(tmp_path_factory, tinyllama_mistral_data, mistral_teacher) -> Path:
    """A finished one-step VocAgnoLM run, its teacher online at the defaults: its out_dir."""
    from litgpt_vocagnolm.training.teacher import TeacherArgs

    tmp_path = tmp_path_factory.mktemp("guided")
    teacher = TeacherArgs(checkpoint_dir=mistral_teacher)
    setup(**setup_args(tmp_path, tinyllama_mistral_data, guidance=GuidanceArgs(), teacher=teacher))
    return tmp_path / "out"


@pytest.mark.parametrize("change", ["aggregation", "another teacher", "a cache"])
def test_a_resume_that_changes_what_the_run_ranks_by_is_refused(
    tmp_path, guided_run, tinyllama_mistral_data, mistral_teacher, change, request
):
    from litgpt_vocagnolm.training.teacher import TeacherArgs

    teacher, guidance = TeacherArgs(checkpoint_dir=mistral_teacher), GuidanceArgs()
    if change == "aggregation":
        guidance, message = GuidanceArgs(aggregation="mean"), "--guidance.aggregation mean differs from the run's max"
    elif change == "another teacher":  # the same architecture and tokenizer, other weights
        other = make_checkpoint(tmp_path / "other", tiny_config("t", 32000), MISTRAL, seed=2)
        teacher, message = (
            TeacherArgs(checkpoint_dir=other),
            "--teacher.checkpoint_dir .*other.* differs from the run's",
        )
    else:
        cache, _ = request.getfixturevalue("mistral_cache")  # the teacher's cache of this data, scored once
        teacher = TeacherArgs(checkpoint_dir=mistral_teacher, cache=cache)
        message = "--teacher.cache .*cache.* differs from the run's None"
    with pytest.raises(InvalidArgument, match=message + ".* Resume with"):
        resume(guided_run, tinyllama_mistral_data, guidance=guidance, teacher=teacher)


def test_a_resume_with_a_copy_of_the_teacher_goes_on(guided_run, mistral_teacher, tmp_path):
    checkpoint = guided_run / "final"
    hparams = yaml.safe_load((checkpoint / "hyperparameters.yaml").read_text())
    hparams["teacher"]["checkpoint_dir"] = [str(shutil.copytree(mistral_teacher, tmp_path / "copy"))]
    assert resume_history(checkpoint, hparams, world_size=1) == []


def test_a_resume_with_another_top_k_trains_with_it_and_records_it(
    tmp_path, guided_run, tinyllama_mistral_data, mistral_teacher, capsys
):
    from litgpt_vocagnolm.training.teacher import TeacherArgs

    out_dir = shutil.copytree(guided_run, tmp_path / "out")
    capsys.readouterr()
    teacher = TeacherArgs(checkpoint_dir=mistral_teacher)
    resume(out_dir, tinyllama_mistral_data, guidance=GuidanceArgs(top_k=0.2), teacher=teacher)
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if line.startswith("Resumed from step 1 with")]
    assert line == "Resumed from step 1 with train.max_tokens 128 -> 256, guidance.top_k 0.4 -> 0.2."
    hparams = (out_dir / "final" / "hyperparameters.yaml").read_text()
    assert hparams.startswith(f"# {line}\n") and yaml.safe_load(hparams)["guidance"]["top_k"] == 0.2
    (selected,) = re.findall(r"step 2 \| .*selected: ([0-9.]+) of mapped", out)  # ceil(0.2 x mapped) of mapped
    assert 0.2 <= float(selected) < 0.25


def test_negative_loader_workers_are_refused_before_any_model(tmp_path, tinyllama_mistral_data):
    with pytest.raises(InvalidArgument, match="--data.num_workers must be at least 0, got -1"):
        setup(
            **setup_args(tmp_path, tinyllama_mistral_data)
            | {"data": VocAgnoData(tinyllama_mistral_data, num_workers=-1)}
        )
    assert not (tmp_path / "out").exists()


def test_an_initial_checkpoint_of_another_architecture_is_refused_before_any_model(tmp_path, tinyllama_mistral_data):
    other = make_checkpoint(tmp_path / "wider", tiny_config("student", 32000, n_embd=64, block_size=64), TINYLLAMA)
    with pytest.raises(
        InvalidArgument,
        match=r"--initial_checkpoint_dir .*wider' holds another architecture .*"
        r"lm_head.weight: \(32000, 64\) there, \(32000, 32\) in this model",
    ):
        setup(**setup_args(tmp_path, tinyllama_mistral_data, initial_checkpoint_dir=other))
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed here")
def test_a_logger_whose_package_is_missing_is_named(tmp_path, tinyllama_mistral_data):
    with pytest.raises(
        InvalidArgument, match="--logger_name: Requirement 'wandb.*not met.*Install the logger's package"
    ):
        setup(**setup_args(tmp_path, tinyllama_mistral_data, logger_name="wandb"))


# export


def test_export_names_its_own_arguments(tmp_path, finished_run):
    with pytest.raises(UserError, match=r"^checkpoint_dir '.*nothing' does not exist: pass a step-\*") as error:
        export(tmp_path / "nothing", tmp_path / "exported")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=r"^checkpoint_dir '.*empty' is not a sharded checkpoint") as error:
        export(tmp_path / "empty", tmp_path / "exported")
    assert "--resume" not in str(error.value)
    (tmp_path / "a-file").write_text("mine")
    with pytest.raises(PathTaken, match="a-file is a file, not a folder"):
        export(finished_run / "step-00000001", tmp_path / "a-file")
    export(finished_run / "step-00000001", tmp_path / "exported")
    with pytest.raises(
        PathTaken,
        match="exported holds lit_model.pth, model_config.yaml, hyperparameters.yaml,"
        " checksums.json, tokenizer.json, tokenizer_config.json, which the export would replace",
    ):
        export(finished_run / "step-00000001", tmp_path / "exported")
    assert (tmp_path / "a-file").read_text() == "mine"
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "tokenizer.json").write_text("my tokenizer")
    with pytest.raises(PathTaken, match="mine holds tokenizer.json, which the export would replace"):
        export(finished_run / "step-00000001", tmp_path / "mine")
    assert (tmp_path / "mine" / "tokenizer.json").read_text() == "my tokenizer"


def test_export_refuses_an_unwritable_out_dir_before_reading_the_checkpoint(read_only_folder, finished_run):
    with pytest.raises(InvalidArgument, match="is not writable"):
        export(finished_run / "step-00000001", read_only_folder / "exported")


def test_a_damaged_final_checkpoint_is_refused_where_it_is_loaded(tmp_path, finished_run, tinyllama_mistral_data):
    """The final/ of a run records its lit_model.pth in checksums.json: damaged in place, it is refused as an initial
    checkpoint (and by `evaluate`, tests/test_evaluate.py) before any model is built."""
    import shutil

    final = shutil.copytree(finished_run / "final", tmp_path / "final")
    weights = bytearray((final / "lit_model.pth").read_bytes())
    weights[len(weights) // 2 : len(weights) // 2 + 4096] = b"\xff" * 4096
    (final / "lit_model.pth").write_bytes(bytes(weights))
    assert json.loads((final / "checksums.json").read_text())["lit_model.pth"]
    with pytest.raises(InvalidArgument, match="lit_model.pth does not match its checksum"):
        setup(**setup_args(tmp_path, tinyllama_mistral_data, initial_checkpoint_dir=final))
    assert torch.load(final / "lit_model.pth", weights_only=True, mmap=True)  # still readable: only the sum tells


def test_a_teacher_shorter_than_the_windows_is_refused_before_any_model(tmp_path, tinyllama_mistral_data):
    from litgpt_vocagnolm.training.teacher import TeacherArgs

    short = json.loads((tinyllama_mistral_data / "manifest.json").read_text())["teacher_max_length"] - 1
    teacher = make_checkpoint(tmp_path / "short", tiny_config("t", 32000, block_size=short), MISTRAL)
    with pytest.raises(InvalidArgument, match=f"--teacher.checkpoint_dir .* has a block size of {short} tokens"):
        setup(
            **setup_args(
                tmp_path, tinyllama_mistral_data, guidance=GuidanceArgs(), teacher=TeacherArgs(checkpoint_dir=teacher)
            )
        )
    assert not (tmp_path / "out").exists()


def test_models_whose_head_caps_its_logits_and_adds_a_bias_are_no_error(tmp_path, tinyllama_mistral_data):
    """The tiled head computes Gemma-2's final soft cap and Phi-2's head bias: a student and a teacher with both, once
    refused before any model, train a step together (each family's losses against LitGPT's, and its `score-teacher`
    cache: tests/test_model_families.py)."""
    from test_recipe import metrics

    from litgpt_vocagnolm.training.teacher import TeacherArgs

    def capped(name: str, block_size: int):
        config = tiny_config(name, 32000, block_size=block_size)
        config.final_logit_softcapping, config.lm_head_bias = 30.0, True
        return config

    teacher = TeacherArgs(checkpoint_dir=make_checkpoint(tmp_path / "capped", capped("t", 256), MISTRAL))
    setup(
        **setup_args(
            tmp_path, tinyllama_mistral_data, model_config=capped("s", 64), guidance=GuidanceArgs(), teacher=teacher
        )
    )
    assert [row["loss"] > 0 for row in metrics(tmp_path / "out")] == [True]


# what the log says


@pytest.mark.parametrize("change", ["max_tokens", "max_steps"])
def test_a_resume_that_changes_the_runs_length_is_logged_and_recorded(
    tmp_path, finished_run, tinyllama_mistral_data, capsys, change
):
    import shutil

    out_dir = shutil.copytree(finished_run, tmp_path / "out")
    shutil.rmtree(out_dir / "final")
    longer = {"max_tokens": 2 * 2 * 64} if change == "max_tokens" else {"max_tokens": 2 * 64 * 10, "max_steps": 2}
    train = TrainArgs(
        global_batch_size=2, micro_batch_size=2, max_norm=1.0, max_seq_length=64, save_interval=1, **longer
    )
    capsys.readouterr()
    setup(**setup_args(tmp_path, tinyllama_mistral_data, train=train, resume="auto"))
    before = {"max_tokens": 128, "max_steps": None}[change]
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if line.startswith("Resumed from step 1 with")]
    assert f"train.{change} {before} -> {longer[change]}" in line and "; 2 steps." in out  # the new schedule's length
    assert (out_dir / "final" / "hyperparameters.yaml").read_text().startswith(f"# {line}\n")


def test_a_ce_run_logs_no_selection_it_did_not_make(tmp_path, tinyllama_mistral_data, capsys):
    setup(**setup_args(tmp_path, tinyllama_mistral_data))
    out = capsys.readouterr().out
    assert "loss train: " in out and "student CE: " in out
    assert "selected:" not in out and "of mapped" not in out


def test_a_metric_over_no_token_is_nothing_not_zero():
    """A micro-batch with no mapped token computes no selected share: the step's figure is the other micro-batches'
    alone, and a step where none computed it reports no figure (it was 0, pulling the mean down)."""
    import lightning as L

    from litgpt_vocagnolm.loss.methods import GuidedLoss, LossInputs
    from litgpt_vocagnolm.training.distributed import mean_over_ranks
    from litgpt_vocagnolm.training.step import metric_pairs

    torch.manual_seed(0)
    ls, valid = torch.rand(2, 8), torch.ones(2, 8, dtype=torch.bool)
    ranges = torch.stack([torch.arange(8), torch.arange(8) + 1], dim=-1).expand(2, 8, 2)
    mapped = LossInputs(teacher_losses=[torch.rand(2, 8)], ranges=[ranges])
    unmapped = LossInputs(teacher_losses=[torch.rand(2, 8)], ranges=[torch.zeros_like(ranges)])
    guided = GuidedLoss(GuidanceArgs(top_k=0.5))
    _, _, first = guided(ls, valid, unmapped)
    _, _, second = guided(ls, valid, mapped)
    assert first["mapped_fraction"] == 0 and first["selected_fraction"].isnan()
    fabric = L.Fabric(accelerator="cpu", devices=1)
    logged = mean_over_ranks(fabric, dict(zip(first, metric_pairs(first) + metric_pairs(second))))
    assert logged["selected_fraction"] == pytest.approx(0.5)  # the second micro-batch's: 8 of 16 mapped
    assert logged["mapped_fraction"] == pytest.approx(0.5)  # a share of all valid tokens: 0 and 1 averaged
    assert logged["student_loss"] == pytest.approx(ls.mean().item())
    logged = mean_over_ranks(fabric, dict(zip(first, metric_pairs(first))))
    assert "selected_fraction" not in logged and "excess_selected" not in logged and logged["mapped_fraction"] == 0


def test_a_resume_path_beside_an_initial_checkpoint_names_the_way_out(finished_run, tinyllama_mistral_data, tmp_path):
    """A paper recipe names an initial checkpoint: `--resume PATH` on it is refused in one line that says how to
    drop it (`--initial_checkpoint_dir null`), before any model."""
    initial = make_checkpoint(tmp_path / "initial", tiny_config("student", 32000, block_size=64), TINYLLAMA)
    step = finished_run / "step-00000001"
    with pytest.raises(InvalidArgument, match=r"add --initial_checkpoint_dir null\), or --resume auto"):
        resume(finished_run, tinyllama_mistral_data, resume=step, initial_checkpoint_dir=initial)


def short_run(**overrides) -> dict:
    """Four optimizer steps of 2 x 64 tokens, logged and checkpointed every second step."""
    train = TrainArgs(
        global_batch_size=2,
        micro_batch_size=2,
        max_tokens=4 * 2 * 64,
        max_norm=1.0,
        max_seq_length=64,
        save_interval=2,
        log_interval=2,
    )
    return dict(train=train) | overrides


@pytest.mark.parametrize("unmapped", ["include", "exclude"])
def test_an_online_teacher_whose_losses_are_nan_stops_training_in_one_line(
    tmp_path, tinyllama_mistral_data, mistral_teacher, unmapped
):
    """Before: every token counted unmapped, plain cross-entropy trained (or, excluding them, a loss of 0 and nothing
    trained), checkpoints saved, exit 0. Now: stopped at the first check, naming the teacher, nothing saved."""
    from test_user_errors_scoring import nan_teacher

    from litgpt_vocagnolm.training.teacher import TeacherArgs

    teacher = nan_teacher(tmp_path, mistral_teacher)
    guided = dict(teacher=TeacherArgs(checkpoint_dir=teacher), guidance=GuidanceArgs(unmapped=unmapped))
    with pytest.raises(NotFinite) as error:
        setup(**setup_args(tmp_path, tinyllama_mistral_data, **short_run(**guided)))
    assert str(error.value) == (
        f"The teacher {teacher} gave a NaN or infinite loss in steps 1..2: it can't guide (its weights hold NaN, or its"
        f" losses overflow --teacher.precision). Check it (`litgpt generate {teacher}`), or train with"
        " --teacher.precision 32-true."
    )
    assert not [p.name for p in (tmp_path / "out").iterdir() if p.name.startswith(("step-", "final"))]


def test_a_step_mapping_fewer_tokens_than_min_mapped_stops_the_run(tmp_path, tinyllama_mistral_data, mistral_teacher):
    """The pair maps all but a few of its tokens: asking for all of them stops at the first check of a step that
    misses one (which step that is depends on the documents); the default trains on."""
    from litgpt_vocagnolm.training.teacher import TeacherArgs

    teacher = TeacherArgs(checkpoint_dir=mistral_teacher)
    with pytest.raises(Unguided) as error:
        setup(
            **setup_args(
                tmp_path, tinyllama_mistral_data, **short_run(teacher=teacher, guidance=GuidanceArgs(min_mapped=1.0))
            )
        )
    assert re.match(
        r"A step in steps \d+\.\.\d+ mapped fewer than 100% of its tokens to a teacher \(--guidance\.min_mapped\): the"
        r" teacher guides \(almost\) nothing\.",
        str(error.value),
    )
    with pytest.raises(InvalidArgument, match=r"guidance.min_mapped must be a share in \[0, 1\]"):
        GuidanceArgs(min_mapped=1.5)


def test_a_non_finite_gradient_stops_in_one_line_naming_where_to_resume(tmp_path, tinyllama_mistral_data):
    student = make_checkpoint(tmp_path / "nan-student", tiny_config("student", 32000, block_size=64), TINYLLAMA)
    weights = torch.load(student / "lit_model.pth", weights_only=True)
    weights["lm_head.weight"][:] = float("nan")
    torch.save(weights, student / "lit_model.pth")
    with pytest.raises(NotFinite) as error:
        setup(**setup_args(tmp_path, tinyllama_mistral_data, initial_checkpoint_dir=student, **short_run()))
    assert str(error.value) == (
        "A gradient norm was not finite between the last log step and step 2: the weights are no longer finite. Run"
        " again from a fresh start (no checkpoint was saved) with a lower learning rate (the optimizer's lr) or"
        " another --train.max_norm."
    )


# the budget and the optimizer, as typed after a packaged recipe


def typed(args: list[str], capsys) -> tuple[int, str, str]:
    """`vocagnolm ARGS` run here, as the console script runs it, to its exit: its status, stdout and stderr."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(args)
    out, err = capsys.readouterr()
    return exit_.value.code, out, err


@pytest.fixture(scope="module")
def demo_cpu_data(tmp_path_factory, gsm8k_sample) -> Path:
    """Data as demo-cpu.yaml's command prepares it (128 tokens, TinyLlama and Qwen2.5), of the GSM8K sample."""
    return prepare_pair(tmp_path_factory.mktemp("demo-cpu") / "data", gsm8k_sample, TINYLLAMA, QWEN, max_seq_length=128)


@pytest.fixture
def demo_cpu_folder(tmp_path, monkeypatch, demo_cpu_data) -> Path:
    """The working folder of `--config demo-cpu`: its data and tokenizer where the recipe names them."""
    (tmp_path / "out" / "demo-cpu").mkdir(parents=True)
    (tmp_path / "out" / "demo-cpu" / "data").symlink_to(demo_cpu_data)
    (tmp_path / "tests" / "fixtures" / "tokenizers").mkdir(parents=True)
    (tmp_path / "tests" / "fixtures" / "tokenizers" / "tinyllama-1.1b").symlink_to(TINYLLAMA)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("budget, tokens", [("1e3", 1000), ("0x10", 16)])
def test_a_budget_of_no_optimizer_step_is_refused_before_any_model(demo_cpu_folder, capsys, budget, tokens):
    """Before: 0 steps, an untrained final/ saved, exit 0. demo-cpu's step is 16 sequences of 128 tokens."""
    refusal = (
        f"--train.max_tokens {tokens} is less than one optimizer step of --train.global_batch_size x"
        " --train.max_seq_length = 16 x 128 = 2,048 tokens: nothing would train. Give at least 2048 (one step)."
    )
    for command in ("pretrain", "plan"):
        status, _, err = typed([command, "--config", "demo-cpu", "--train.max_tokens", budget], capsys)
        assert (status, err) == (1, f"vocagnolm {command}: error: {refusal}\n")
    assert [path.name for path in (demo_cpu_folder / "out" / "demo-cpu").iterdir()] == ["data"]  # nothing written


def test_a_budget_beyond_64_bits_is_refused_where_it_is_read(tmp_path, monkeypatch, capsys, tinyllama_mistral_data):
    """Before: `1e999` read as a 1,000-digit integer, one step trained, then an OverflowError."""
    monkeypatch.chdir(tmp_path)
    status, _, err = typed(["pretrain", "--config", "demo-cpu", "--train.max_tokens", "1e999"], capsys)
    assert (status, err) == (
        2,
        "vocagnolm pretrain: error: --train.max_tokens: 1e999 is not a whole number below 2**63 (it takes an integer"
        " such as 15e9 or 15_000_000_000). See --help.\n",
    )
    train = TrainArgs(global_batch_size=2, micro_batch_size=2, max_tokens=10**1000, max_norm=1.0, max_seq_length=64)
    with pytest.raises(InvalidArgument, match="^--train.max_tokens, a number of 3322 bits, is beyond 64 bits"):
        setup(**setup_args(tmp_path, tinyllama_mistral_data, train=train))  # from Python, past the parser
    assert not list(tmp_path.iterdir())


def test_another_optimizer_and_its_lr_after_a_recipe_run_as_printed_and_recorded(demo_cpu_folder, monkeypatch, capsys):
    """Before: `--optimizer SGD --optimizer.lr 0.1` after demo-cpu was refused, `--optimizer SGD` alone recorded
    only `SGD`. Now --print_config, the optimizer the run builds and its hyperparameters.yaml say the same: SGD, lr
    0.1, and the recipe's weight decay, which SGD takes (its betas it does not: dropped, said in one line). The steps
    are left out (`fit`): they change only the learning rate, by the schedule."""
    from litgpt.utils import instantiate_torch_optimizer

    import litgpt_vocagnolm.training.recipe as recipe

    built = []

    def build(*args, **kwargs) -> torch.optim.Optimizer:
        built.append(instantiate_torch_optimizer(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(recipe, "instantiate_torch_optimizer", build)
    monkeypatch.setattr(recipe, "fit", lambda *args: None)
    args = ["pretrain", "--config", "demo-cpu", "--optimizer", "SGD", "--optimizer.lr", "0.1"]
    status, out, err = typed([*args, "--print_config"], capsys)
    assert status == 0 and err == (
        "--optimizer SGD: torch.optim.SGD takes no betas, dropped; it keeps lr 0.001, weight_decay 0.1.\n"
    )
    printed = yaml.safe_load(out)["optimizer"]
    main(args)
    final = demo_cpu_folder / "out" / "demo-cpu" / "final"
    recorded = yaml.safe_load((final / "hyperparameters.yaml").read_text())["optimizer"]
    (optimizer,) = built
    assert printed == recorded == {"class_path": "torch.optim.SGD", "init_args": {"lr": 0.1, "weight_decay": 0.1}}
    assert type(optimizer) is torch.optim.SGD
    assert {name: optimizer.param_groups[0][name] for name in recorded["init_args"]} == recorded["init_args"]
    assert optimizer.param_groups[0]["momentum"] == 0  # SGD's own default: nothing else given


def test_print_config_shows_an_optimizer_argument_where_it_runs(tmp_path, monkeypatch, capsys):
    """Before: `init_args.lr: 0.001` still shown, and a stray `lr: 3e-3` beside it, while the run applied 3e-3."""
    monkeypatch.chdir(tmp_path)
    status, out, _ = typed(["pretrain", "--config", "demo-cpu", "--optimizer.lr", "3e-3", "--print_config"], capsys)
    assert status == 0 and yaml.safe_load(out)["optimizer"] == {
        "class_path": "torch.optim.AdamW",
        "init_args": {"lr": 0.003, "weight_decay": 0.1, "betas": [0.9, 0.95]},
    }
