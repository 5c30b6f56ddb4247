"""The recipe's input checks: every configuration error visible before a model is built, each with what to change,
and the line that makes a wrong tokenizer pairing visible at the start of a run."""

import contextlib
import importlib
import inspect
import json
import os
import sys
from pathlib import Path
from typing import Any, Literal

import torch
import yaml
from lightning.fabric.utilities.seed import max_seed_value, min_seed_value
from litgpt.args import EvalArgs, TrainArgs
from litgpt.config import Config
from litgpt.data import DataModule
from litgpt.utils import instantiate_torch_optimizer

from litgpt_vocagnolm.alignment.lexical import vocab_overlap
from litgpt_vocagnolm.alignment.tokenizer_files import load_tokenizer
from litgpt_vocagnolm.data.prepared import MANIFEST, VocAgnoData
from litgpt_vocagnolm.data.teacher_cache import check_cache, weights_sha256
from litgpt_vocagnolm.errors import InvalidArgument, PathMissing, at_least, check_devices, given_by
from litgpt_vocagnolm.files import same_folder, shipped
from litgpt_vocagnolm.loss.methods import GuidanceArgs, method_names
from litgpt_vocagnolm.models.weights import check_checkpoint_dir, check_vocab_size
from litgpt_vocagnolm.training.checkpoints import check_resume_path
from litgpt_vocagnolm.training.student import check_weights_fit
from litgpt_vocagnolm.training.teacher import TeacherArgs, teacher_mode
from litgpt_vocagnolm.training.train_state import TRAIN_STATE

CLONE_FIXTURES = Path("tests/fixtures")  # a clone's test files: demo-cpu names a tokenizer there
TINYLLAMA = "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T"  # the paper's student, the README's download
DEMO_CORPUS = shipped("demo/data", "data") / "gsm8k" / "train.jsonl"  # GSM8K text, which the wheel carries


def check_run_args(train: TrainArgs, eval: EvalArgs, devices: int | str, num_nodes: int) -> None:
    """The recipe's numbers in range, before anything is loaded (LitGPT's TrainArgs checks few: a micro-batch of 0
    divides by zero, a negative one reaches LitData)."""
    check_devices(devices)
    at_least("--num_nodes", num_nodes, 1)
    for name in ("global_batch_size", "micro_batch_size", "log_interval"):
        at_least(f"--train.{name}", getattr(train, name), 1)
    for name in ("save_interval", "max_tokens", "max_steps", "max_seq_length"):
        if getattr(train, name) is not None:
            at_least(f"--train.{name}", getattr(train, name), 1)
    if train.lr_warmup_steps is not None:
        at_least("--train.lr_warmup_steps", train.lr_warmup_steps, 0)
    if train.max_norm is not None and not train.max_norm > 0:
        raise InvalidArgument(f"--train.max_norm must be above 0 (the paper's: 1.0), got {train.max_norm}.")
    if train.max_time is not None and not train.max_time > 0:
        raise InvalidArgument(f"--train.max_time must be above 0 seconds, got {train.max_time}.")
    at_least("--train.min_lr", train.min_lr, 0)
    at_least("--eval.interval", eval.interval, 1)
    at_least("--eval.max_iters", eval.max_iters, 0)


def check_seed(seed: int) -> None:
    """Refuses, before anything is built, a --seed that Lightning's `seed_everything` refuses once the models are:
    NumPy's seeds, 0 to 2**32 - 1."""
    if not min_seed_value <= seed <= max_seed_value:
        raise InvalidArgument(
            f"--seed must lie between {min_seed_value} and {max_seed_value} (2**32 - 1: NumPy's seeds, which Lightning"
            f" seeds from), got {seed}."
        )


def check_out_dir_apart(out_dir: Path, data: DataModule | None, teacher: TeacherArgs) -> None:
    """Refuses an --out_dir that is, or lies inside, a folder the run reads whole: a teacher's prepared data or loss
    cache, whose files `vocagnolm prepare` and `score-teacher` hashed. The run's checkpoints, logs and lock would sit
    among its shards. (Data inside the --out_dir, as demo-cpu keeps it, mixes nothing.)"""
    paths = data.paths if isinstance(data, VocAgnoData) else []
    inputs = [("--data.path", path) for path in paths[:1]] + [("--data.other_teachers", path) for path in paths[1:]]
    inputs += [("--teacher.cache", path) for path in teacher.caches]
    where = Path(out_dir).resolve()
    for flag, path in inputs:
        if where.is_relative_to(Path(path).resolve()):
            what = "is" if where == Path(path).resolve() else "lies inside"
            raise InvalidArgument(
                f"--out_dir {out_dir} {what} {flag} {path}: the run's checkpoints, logs and lock would sit among its"
                f" shards. Give an --out_dir outside it, such as {Path(path).with_name(Path(path).name + '-run')}."
            )


def check_seq_len(config: Config, data: DataModule | None, train: TrainArgs, block_size_flag: str | None) -> int:
    """The student tokens per sequence (--train.max_seq_length, else the student's block size), refused before any
    model is built where the model would refuse it once built (LitGPT's "Cannot attend to ...": longer than its block
    size) or the prepared data holds blocks of another length (`check_prepared_length`). `block_size_flag` raises the
    student's block size (--model_config.block_size, for a student given as a config), else None."""
    length, block_size = train.max_seq_length or config.block_size, config.block_size
    if isinstance(data, VocAgnoData):
        check_prepared_length(data, length, block_size, block_size_flag)
    elif length > block_size:
        raise_it = f", or raise the block size: {block_size_flag} {length}" if block_size_flag else ""
        raise InvalidArgument(
            f"--train.max_seq_length {length} is longer than the student's block size {block_size} ({config.name}):"
            f" the model can't attend that far. Give --train.max_seq_length {block_size} or less{raise_it}."
        )
    return length


def check_prepared_length(data: VocAgnoData, length: int, block_size: int, block_size_flag: str | None) -> None:
    """Fails, naming both fixes, unless the data holds blocks of `length` student tokens within the student's
    `block_size`: train at the prepared length (with the block size, where shorter, raised by `block_size_flag`; no
    such fix without it), or prepare the data again at the length training asks for (at most `block_size`)."""
    prepared = data.manifest["max_seq_length"]
    if length == prepared <= block_size:
        return
    fixes = []
    if prepared <= block_size:
        fixes.append(f"train with --train.max_seq_length {prepared}")
    elif block_size_flag:
        fixes.append(f"train with --train.max_seq_length {prepared} {block_size_flag} {prepared}")
    again = min(length, block_size)
    if again != prepared:
        and_train = f" and train with --train.max_seq_length {again}" if again != length else ""
        fixes.append(f"prepare it again with --max_seq_length {again} (into a new --output){and_train}")
    raise InvalidArgument(
        f"{data.path} holds blocks of {prepared} tokens (prepared with --max_seq_length {prepared}); training asks for"
        f" {length} and the student's block size is {block_size}: {', or '.join(fixes)}."
    )


def check_teacher_config(manifest: dict, teacher_dir: Path, flag: str, data: Path) -> None:
    """Fails, before any model is loaded, unless the teacher's block size (its model_config.yaml's) holds the
    prepared data's teacher windows (`teacher_max_length` tokens at most): a longer window would be cut, or refused in
    a loader worker mid-run."""
    block_size = Config.from_file(teacher_dir / "model_config.yaml").block_size
    if manifest["teacher_max_length"] > block_size:
        raise InvalidArgument(
            f"{flag} {str(teacher_dir)!r} has a block size of {block_size} tokens, shorter than the teacher windows of"
            f" up to {manifest['teacher_max_length']} tokens in {data}: prepare the data again with"
            f" --teacher_max_length"
            f" {block_size} (or a smaller --max_seq_length), or use a teacher with a longer context."
        )


OPTIMIZER_FIX = "Name a torch.optim class (e.g. AdamW) or give its class_path and init_args."


def check_optimizer(optimizer: str | dict) -> str | dict:
    """--optimizer as the run builds it (`optimizer_spec`), built once over a stand-in parameter, so that an unknown
    name or a bad argument (a negative learning rate) fails now, naming --optimizer, not in LitGPT's
    `instantiate_torch_optimizer` once the model is built."""
    with given_by("--optimizer", OPTIMIZER_FIX):
        optimizer = optimizer_spec(optimizer)
        instantiate_torch_optimizer(optimizer, [torch.nn.Parameter(torch.zeros(1))])
    return optimizer


def override_optimizer(optimizer: str | dict, key: str, text: str) -> dict:
    """`optimizer` (a class name, or a class_path and init_args) after one command-line option, as a class_path and
    init_args: `--optimizer NAME` (`key` "") or `--optimizer.class_path NAME` another class, keeping the arguments
    given before that it takes (a note names those it drops); `--optimizer.ARG VALUE` or
    `--optimizer.init_args.ARG VALUE` one argument of the class; `--optimizer '{"class_path": ..., "init_args":
    ...}'` a whole optimizer. An argument the class does not take is refused, naming those it takes."""
    value = _value(text)
    with given_by("--optimizer", OPTIMIZER_FIX):
        if key == "" and isinstance(value, dict):
            return optimizer_spec(value)
        before = optimizer_spec(optimizer if isinstance(optimizer, dict) else {"class_path": optimizer})
        if key not in ("", "class_path"):
            init_args = {**before["init_args"], key.removeprefix("init_args."): value}
            return optimizer_spec({"class_path": before["class_path"], "init_args": init_args})
        after = optimizer_spec({"class_path": value})
    takes = _arguments(after["class_path"])
    kept = {name: arg for name, arg in before["init_args"].items() if name in takes}
    dropped = [name for name in before["init_args"] if name not in kept]
    if dropped:
        print(
            f"--optimizer {value}: {after['class_path']} takes no {', '.join(dropped)}, dropped; it keeps"
            f" {', '.join(f'{name} {arg}' for name, arg in kept.items()) or 'none of the arguments given before it'}.",
            file=sys.stderr,
        )
    return {"class_path": after["class_path"], "init_args": kept}


def optimizer_spec(optimizer: str | dict) -> str | dict:
    """--optimizer as LitGPT's `instantiate_torch_optimizer` builds it: a class name as it is, a dict as its class's
    full path (`SGD` as torch.optim.SGD) and its init_args. A dict without a class_path, or with an argument the class
    does not take, is refused, naming what to give."""
    if isinstance(optimizer, str):
        return optimizer
    spec = dict(optimizer)
    class_path, init_args = spec.pop("class_path", None), dict(spec.pop("init_args", None) or {})
    if class_path is None or spec:
        raise InvalidArgument(
            f"--optimizer {optimizer} names no class, or keys beside class_path and init_args: give"
            " {class_path: torch.optim.AdamW, init_args: {lr: 1.0e-04}} (any class and arguments)."
        )
    module, name = class_path.rsplit(".", 1) if "." in class_path else ("torch.optim", class_path)
    class_path = f"{module}.{name}"  # `SGD` as LitGPT takes a class_path: torch.optim.SGD
    takes = _arguments(class_path)
    unknown = [key for key in init_args if key not in takes]
    if unknown:
        raise InvalidArgument(
            f"--optimizer.init_args.{unknown[0]}: {class_path} takes no {unknown[0]!r}. It takes: {', '.join(takes)}."
        )
    return {"class_path": class_path, "init_args": init_args}


def _arguments(class_path: str) -> list[str]:
    """The arguments an optimizer class takes besides its parameters, by name."""
    module, name = class_path.rsplit(".", 1)
    return sorted(set(inspect.signature(getattr(importlib.import_module(module), name)).parameters) - {"params"})


def _value(value: object) -> object:
    """An option's text as its value: `1e6` and `0.1` as numbers, `true` as True, `[0.9, 0.95]` as a list."""
    if isinstance(value, str):
        value = yaml.safe_load(value)
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return float(value)
    return value


def check_start(
    config: Config, source: str, initial_checkpoint_dir: Path | None, resume: bool | Literal["auto"] | Path
) -> None:
    """Where the student starts from: an initial checkpoint of `config`'s architecture (the student `source` gives,
    "--model_name X") or a resumed one, each readable, not both."""
    if initial_checkpoint_dir is not None and resume not in (False, "auto"):
        raise InvalidArgument(
            f"Can't provide both --resume {resume} and --initial_checkpoint_dir {initial_checkpoint_dir}. Choose one"
            " (with a --config that names an initial checkpoint, add --initial_checkpoint_dir null), or --resume"
            " auto: it starts from --initial_checkpoint_dir until out_dir has a checkpoint (what a requeued Slurm job"
            " needs)."
        )
    if initial_checkpoint_dir is not None:
        check_checkpoint_dir(initial_checkpoint_dir, what="--initial_checkpoint_dir")
        check_weights_fit(config, initial_checkpoint_dir, "--initial_checkpoint_dir", source)
    if isinstance(resume, Path):
        check_resume_path(resume)  # refused, unreadable or damaged: fail now, naming the file


def check_setup(
    config: Config,
    data: DataModule | None,
    train: TrainArgs,
    teacher: TeacherArgs,
    guidance: GuidanceArgs,
    *,
    tokenizer_dir: Path | None = None,
    world_size: int = 1,
) -> None:
    """Every configuration error we can see before building a model, each with what to change (where the student
    starts from: `check_start`)."""
    check_tokenizer_dir(tokenizer_dir)
    check_data_and_budget(data, train, world_size)
    if tokenizer_dir is not None:
        check_vocab_size(config, tokenizer_dir, "--tokenizer_dir", fix="train the model this tokenizer belongs to.")
    method = guidance.spec
    if method.needs_prepared_data and not isinstance(data, VocAgnoData):
        raise InvalidArgument(
            f"--guidance.method {guidance.method} needs aligned data: --data VocAgnoData --data.path DIR"
            f" (from `vocagnolm prepare`), not {type(data).__name__}."
            f" Only {method_names(lambda m: not m.needs_prepared_data)} trains on plain LitGPT data."
        )
    if isinstance(data, VocAgnoData) and tokenizer_dir is None:
        raise InvalidArgument("Pass the student's tokenizer: --tokenizer_dir DIR (the one the data was prepared with).")
    paths = data.paths if isinstance(data, VocAgnoData) else [None]  # each teacher's prepared data
    guidance.check_several_teachers(len(paths), fix="Drop --data.other_teachers, or choose one of those methods.")
    if not method.needs_prepared_data:
        if isinstance(data, VocAgnoData):  # the student's tokenizer ships in every checkpoint: it must be the data's
            data.check_tokenizers(tokenizer_dir, None)
        return
    check_teachers(data, teacher, guidance, tokenizer_dir)


def check_tokenizer_dir(tokenizer_dir: Path | None) -> None:
    """Refuses a --tokenizer_dir that does not exist, saying where a relative one is read from; one of a clone's test
    files (`CLONE_FIXTURES`: demo-cpu's, run by name outside a clone) with the commands that run the recipe anywhere."""
    if tokenizer_dir is None or os.path.exists(tokenizer_dir):
        return
    if not Path(tokenizer_dir).is_relative_to(CLONE_FIXTURES):
        where = "" if Path(tokenizer_dir).is_absolute() else f" in the working folder, {Path.cwd()}"
        raise PathMissing(
            f"--tokenizer_dir {tokenizer_dir} does not exist{where}: give the student's tokenizer, the one the data was"
            " prepared with (a LitGPT checkpoint dir, a tokenizer dir or its tokenizer.json)."
        )
    student = Path("checkpoints") / TINYLLAMA
    raise PathMissing(
        f"--tokenizer_dir {tokenizer_dir} is a folder of a clone of litgpt-vocagnolm (demo-cpu names it from the"
        f" clone's root), and the working folder, {Path.cwd()}, is not one. Run it from a clone's root (`make"
        " demo-cpu` there prepares its data, then trains), or anywhere: 1) `litgpt download"
        f" {TINYLLAMA} --tokenizer_only true`; 2) `vocagnolm prepare --student {student} --teacher {student} --input"
        f" {DEMO_CORPUS} --text_key question,answer --output out/demo-cpu/data --max_seq_length 128` (demo-cpu trains"
        f" plain cross-entropy: its data's teacher is not used); 3) this command with --tokenizer_dir {student}."
    )


def check_data_and_budget(data: DataModule | None, train: TrainArgs, world_size: int) -> None:
    """The data given and readable, and the run's budget in tokens, each step's global batch whole micro-batches on
    every rank (at least one step: `check_budget`)."""
    if data is None:
        raise InvalidArgument(
            "Pass the prepared data: --data VocAgnoData --data.path DIR (made by `vocagnolm prepare`)."
        )
    if isinstance(data, VocAgnoData):
        data.check_files()  # a missing or cut chunk: now, not when the loader reaches it (hours in)
    if hasattr(data, "num_workers"):  # torch's DataLoader would refuse a negative count, once the model is built
        at_least("--data.num_workers", data.num_workers, 0)
    if isinstance(data, VocAgnoData):  # its order (`order.GlobalOrder`) would refuse it, once the model is built
        at_least("--data.seed", data.seed, 0)
    if train.max_tokens is None or train.max_norm is None:
        raise InvalidArgument("The recipe needs --train.max_tokens and --train.max_norm.")
    if train.epochs is not None:
        raise InvalidArgument("The recipe counts tokens, not epochs: set --train.max_tokens instead of --train.epochs.")
    per_step = world_size * train.micro_batch_size
    if train.global_batch_size % per_step:  # LitGPT's `gradient_accumulation_iters` would floor it, or assert on 0
        lower = train.global_batch_size // per_step * per_step
        raise InvalidArgument(
            f"--train.global_batch_size {train.global_batch_size} must be a multiple of (--devices x --num_nodes) x"
            f" --train.micro_batch_size = {world_size} x {train.micro_batch_size} = {per_step}, so that every rank"
            f" accumulates whole micro-batches: use {' or '.join(map(str, filter(None, (lower, lower + per_step))))},"
            " or change the micro-batch or the device count."
        )


def check_budget(train: TrainArgs, max_seq_length: int) -> None:
    """Refuses a token budget that trains no optimizer step (the run's steps are whole global batches of
    `max_seq_length` tokens, `step.run_steps`: it would save an untrained model), or one beyond 64 bits. None passes:
    `plan` takes it, and the recipe refuses it (`check_data_and_budget`)."""
    if train.max_tokens is None:
        return
    per_step = train.global_batch_size * max_seq_length
    if train.max_tokens < per_step:
        raise InvalidArgument(
            f"--train.max_tokens {train.max_tokens} is less than one optimizer step of --train.global_batch_size x"
            f" --train.max_seq_length = {train.global_batch_size} x {max_seq_length} = {per_step:,} tokens: nothing"
            f" would train. Give at least {per_step} (one step)."
        )
    if train.max_tokens > 2**63 - 1:
        raise InvalidArgument(
            f"--train.max_tokens, a number of {train.max_tokens.bit_length()} bits, is beyond 64 bits: give the tokens"
            " to train, such as 15e9 (the paper's budget)."
        )


def check_teachers(data: VocAgnoData, teacher: TeacherArgs, guidance: GuidanceArgs, tokenizer_dir: Path) -> None:
    """For a method that needs a teacher: one checkpoint or cache per teacher's prepared data, each readable and
    matching that data, and each tokenizer the one the data was prepared with."""
    paths, method = data.paths, guidance.spec
    caches, checkpoint_dirs = teacher.caches, teacher.checkpoint_dirs
    for option, given in (("--teacher.cache", caches), ("--teacher.checkpoint_dir", checkpoint_dirs)):
        if given and len(given) != len(paths):
            raise InvalidArgument(
                f"{len(given)} {option} for the data of {len(paths)} teachers (--data.path, then"
                f" --data.other_teachers): give one per teacher, in that order."
            )
    if caches:
        if method.teacher_logits:
            raise InvalidArgument(
                f"--guidance.method {guidance.method} distils the teacher's logits; a --teacher.cache holds only its"
                " per-token losses. Drop --teacher.cache and pass --teacher.checkpoint_dir."
            )
        for k, (cache, path) in enumerate(zip(caches, paths)):
            check_cache(cache, path / MANIFEST, checkpoint_dirs[k] if checkpoint_dirs else None, teacher.precision)
    if guidance.compare == "byte" and not checkpoint_dirs:
        raise InvalidArgument(
            "--guidance.compare byte counts the bytes of each teacher token with the teacher's tokenizer: pass"
            " --teacher.checkpoint_dir (one per teacher, beside --teacher.cache: only its tokenizer is read then)."
        )
    if teacher_mode(teacher, method) == "online":
        if not checkpoint_dirs:
            raise InvalidArgument(
                f"--guidance.method {guidance.method} needs a teacher: --teacher.checkpoint_dir DIR (or"
                " --teacher.cache DIR from `vocagnolm score-teacher`)."
            )
        for checkpoint_dir, path, manifest in zip(checkpoint_dirs, paths, data.manifests):
            check_checkpoint_dir(checkpoint_dir, what="--teacher.checkpoint_dir")
            check_teacher_config(manifest, checkpoint_dir, "--teacher.checkpoint_dir", path)
    same_vocabulary = True
    for k in range(len(paths)):
        teacher_dir = checkpoint_dirs[k] if checkpoint_dirs else None
        data.check_tokenizers(tokenizer_dir, teacher_dir, teacher=k)
        same_vocabulary &= data.same_vocabulary(tokenizer_dir, teacher_dir, teacher=k)
    guidance.check_tokenizers(same_vocabulary=same_vocabulary)


# What a resume may not change, and why (`resume_history`). Devices, nodes and the micro-batch may change: checkpoints
# are taken at optimizer steps, and those only change how a step's global batch is split over ranks and micro-batches.
FIXED_ON_RESUME = {
    "train.global_batch_size": "it sets the tokens per optimizer step, so the run's schedule (warm-up, decay, steps)"
    " would no longer be the one it started",
    "train.max_seq_length": "the blocks and the tokens per step are the run's",
    "guidance.method": "a run trains one method; train another in a new --out_dir",
    "precision": "the weights and AdamW state keep the precision the run started with",
    "data.init_args.path": "the saved data position is a position in the run's data",
    # What each student token's reference loss is: which teacher scores it, how the teacher tokens that cover it
    # combine into one loss, and which tokens have one. Changed, the run would rank by another signal than the one
    # its checkpoints were trained on: another run, in a new --out_dir.
    "teacher.checkpoint_dir": "the teacher's losses are what the run ranks by; train with another in a new --out_dir",
    "teacher.cache": "the cache holds the losses of the teacher the run ranks by; train with another in a new"
    " --out_dir",
    "guidance.aggregation": "it makes each student token's teacher loss, what the run ranks by",
    "guidance.combine": "it makes each student token's reference from the teachers' losses, what the run ranks by",
    "guidance.compare": "it sets the scale the teachers' losses are compared on, what the run ranks by",
    "guidance.unmapped": "it decides which tokens the run trains at all",
    "guidance.num_chunks": "it is the chunk alignment of the run's teacher and student tokens",
}
# What a resume may change, carried out and recorded in the checkpoints' history: how a step is split over ranks and
# micro-batches; the run's length (the learning-rate schedule, its steps, warm-up and decay, is recomputed from it);
# and how much of the teacher's signal a step trains on (the share of tokens selected and where they are ranked, the
# weight and temperature of distillation) or in what precision the same teacher runs: settings tuned over a run as
# the learning rate is, continuing the same run.
RECORDED_ON_RESUME = (
    "train.micro_batch_size",
    "devices",
    "num_nodes",
    "train.max_tokens",
    "train.max_steps",
    "guidance.top_k",
    "guidance.scope",
    "guidance.temperature",
    "guidance.distill_weight",
    "teacher.precision",
)


def resume_history(checkpoint_dir: Path, hparams: dict, world_size: int) -> list[str]:
    """The run's history after resuming from `checkpoint_dir` with `hparams` on `world_size` processes: the lines
    the checkpoint's hyperparameters.yaml holds (as comments), and one for this resume if it changes one of
    `RECORDED_ON_RESUME`. Refuses, naming the old and the new value and why, a change that `FIXED_ON_RESUME`
    forbids."""
    saved_file = checkpoint_dir / "hyperparameters.yaml"
    text = saved_file.read_text(encoding="utf-8")
    saved = yaml.safe_load(text)
    history = [line.removeprefix("# ") for line in text.splitlines() if line.startswith("# ")]

    def value(tree: dict, key: str) -> Any:
        for part in key.split("."):
            tree = tree.get(part) if isinstance(tree, dict) else None
        return tree

    for key, reason in FIXED_ON_RESUME.items():
        old, new = value(saved, key), value(hparams, key)
        if not kept_on_resume(key, old, new):
            raise InvalidArgument(
                f"--{key} {new} differs from the run's {old} ({saved_file}): it can't change on resume, as {reason}."
                f" Resume with --{key} {old}."
            )
    saved_world_size = json.loads((checkpoint_dir / TRAIN_STATE).read_text())["world_size"]
    changes = [f"processes {saved_world_size} -> {world_size}"] if saved_world_size != world_size else []
    for key in RECORDED_ON_RESUME:
        if value(saved, key) != value(hparams, key):
            changes.append(f"{key} {value(saved, key)} -> {value(hparams, key)}")
    step = json.loads((checkpoint_dir / TRAIN_STATE).read_text())["step_count"]
    if changes:
        history.append(f"Resumed from step {step} with {', '.join(changes)}.")
    return history


def kept_on_resume(key: str, old: Any, new: Any) -> bool:
    """Whether a resume keeps `key`'s value: the same, or for the data, a cache or a teacher the same folders (each
    spelt otherwise or copied: `files.same_folder`; a teacher's checkpoint with the same weights: `same_teacher`)."""
    if old == new:
        return True
    same = {"data.init_args.path": same_folder, "teacher.cache": same_folder, "teacher.checkpoint_dir": same_teacher}
    if key not in same or None in (old, new):
        return False
    olds, news = ([v] if isinstance(v, str) else v for v in (old, new))  # one path or a list of them
    return len(olds) == len(news) and all(same[key](a, b) for a, b in zip(olds, news))


def same_teacher(a: str | Path, b: str | Path) -> bool:
    """Whether two teacher checkpoint directories hold the same teacher: one folder, or the same config and weights
    (`teacher_cache.weights_sha256`)."""
    if Path(a).resolve() == Path(b).resolve():
        return True
    return all(Path(d, "model_config.yaml").is_file() for d in (a, b)) and weights_sha256(a) == weights_sha256(b)


def tokenizer_pair_summary(data: VocAgnoData, student_dir: Path, teacher_dir: Path | None, index: int = 0) -> str:
    """One line that makes a wrong pairing visible at once (e.g. 6.32% overlap, 99.9% mapped for TinyLlama/Qwen2.5);
    for teacher number `index` of several, that of its prepared data."""
    manifest = data.manifests[index]
    which = f" (teacher {index}, {data.paths[index]})" if len(data.paths) > 1 else ""
    line = (
        f"Tokenizer pair{which}: {manifest['mapped_share']:.2%} of the prepared prediction targets (the BOS is none)"
        " map to teacher tokens"
    )
    if teacher_dir is not None:
        student, teacher = load_tokenizer(student_dir), load_tokenizer(teacher_dir)
        line += (
            f"; vocabulary overlap {vocab_overlap(student, teacher):.2%} of the teacher's"
            f" ({student.get_vocab_size():,} student vs {teacher.get_vocab_size():,} teacher tokens)"
        )
    return line + f"; teacher windows up to {manifest['teacher_max_length']} tokens for {manifest['max_seq_length']}."
