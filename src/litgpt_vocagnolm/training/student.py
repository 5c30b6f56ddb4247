"""The student a command line asks for: a LitGPT config name, a config file, or a checkpoint folder's model, the one
typed winning over a recipe's (`choose_student`), and the checks that a checkpoint holds that model's weights
(`check_weights_fit`, `check_resumed_model`), each before any model is built."""

import sys
from dataclasses import asdict
from pathlib import Path
from typing import Collection, NamedTuple

import torch
from litgpt.config import Config, name_to_config

from litgpt_vocagnolm.errors import InvalidArgument, PathMissing
from litgpt_vocagnolm.models.gpt import GPT
from litgpt_vocagnolm.models.model_configs import config_named, register
from litgpt_vocagnolm.models.weights import read_config, read_weights
from litgpt_vocagnolm.training.recipes import PATH_LIKE


def resolve_model_config(model_name: str | None, model_config: Config | None) -> Config:
    """The student's config: `model_config`, else LitGPT's config named `model_name` (`choose_student` has made the
    command line give one of them)."""
    if model_config is not None:
        return model_config
    if model_name is None:
        raise InvalidArgument(
            "Name the student: --model_name (e.g. tiny-llama-1.1b), --model_config FILE (such as a checkpoint's"
            " model_config.yaml), or --initial_checkpoint_dir DIR alone (its model_config.yaml)."
        )
    return config_named(model_name, "--model_name")


def model_config_text(value: str) -> str:
    """A `--model_config` value as jsonargparse reads it: the text of the YAML or JSON file it names (`litgpt.Config`
    fields, such as the model_config.yaml beside a checkpoint's lit_model.pth), else the value itself (inline JSON or
    YAML, `null`). A folder, or a .yaml/.yml/.json file that is not there, is refused in one line."""
    path = Path(value).expanduser() if PATH_LIKE.fullmatch(value) else None  # a long inline JSON is no file name
    if path is not None and path.is_dir():
        raise InvalidArgument(
            f"--model_config {value} is a folder: give its model_config.yaml, --model_config"
            f" {path / 'model_config.yaml'} (or, to start from its weights too, --initial_checkpoint_dir {value}"
            " alone)."
        )
    if path is not None and path.suffix in (".yaml", ".yml", ".json") and not path.is_file():
        raise PathMissing(
            f"--model_config {value}: no such file. Give a YAML or JSON file of litgpt.Config fields (such as the"
            " model_config.yaml beside a checkpoint's lit_model.pth), or --model_name NAME."
        )
    return path.read_text(encoding="utf-8") if path is not None and path.is_file() else value


class Student(NamedTuple):
    """A model a command line gives, and where it came from."""

    source: str
    """Where it came from, for the lines that name it: "--model_name pythia-14m", "the model_config of --config X"."""
    fields: dict
    """Its `litgpt.Config` fields."""
    named: bool = False
    """Whether it is LitGPT's config of a name as it is (no field changed)."""


def named_fields(model_name: str) -> dict:
    """The fields of LitGPT's config named `model_name`."""
    register()  # the paper's teachers that LitGPT lacks
    return asdict(config_named(model_name, "--model_name"))


def checkpoint_model(checkpoint_dir: Path) -> Student | None:
    """A checkpoint folder's model as LitGPT's `Config.from_checkpoint` finds it: its model_config.yaml, else (before
    downloading) LitGPT's config of the folder's name, as `litgpt download` names folders; None without either."""
    if (checkpoint_dir / "model_config.yaml").is_file():
        config = read_config(checkpoint_dir, "--initial_checkpoint_dir")
        return Student(str(checkpoint_dir / "model_config.yaml"), asdict(config))
    register()
    if checkpoint_dir.name in name_to_config:
        by_name = f"{checkpoint_dir} (no model_config.yaml there yet: its name)"
        return Student(by_name, named_fields(checkpoint_dir.name), named=True)
    return None


def choose_student(
    model_name: str | None,
    model_config: dict | None,
    initial_checkpoint_dir: Path | None,
    typed: Collection[str],
    recipe: dict[str, str],
) -> tuple[str | None, dict | None]:
    """The student a command line gives, as `model_name` or as `model_config` (the other None), from the values
    jsonargparse read: an option typed on the command line wins over the recipe's, whatever their order. `typed` holds
    the options typed (`--model_config.block_size` for one field), `recipe` the `--config` that gives each of
    model_name and model_config ("--config demo-cpu"). The student is:

    - `--model_name NAME` typed: LitGPT's config of that name (typed with `--model_config FILE` too: refused);
    - `--model_config FILE` typed: that config;
    - neither, `--initial_checkpoint_dir DIR` typed: DIR's model (`checkpoint_model`) where it differs from the
      recipe's, as `litgpt generate` and `litgpt finetune` build a checkpoint's model;
    - else the recipe's model_config, then its model_name.

    Each `--model_config.KEY VALUE` typed changes that field of the student. A model of the recipe that the student
    sets aside is said in one line on stderr. Then, before any model is built, the initial checkpoint's weights must fit
    the student (`check_weights_fit`), or the refusal names where each came from."""
    if model_name == "list":  # `setup` lists the names
        return model_name, None
    # typed as null, an option only clears the recipe's
    name_typed = "--model_name" in typed and model_name is not None
    config_typed = "--model_config" in typed and model_config is not None
    if name_typed and config_typed:
        raise InvalidArgument(
            f"--model_name {model_name} and --model_config both give the student: give one, a LitGPT config name or a"
            " config file (--model_config.KEY VALUE changes one field of either)."
        )
    fields = sorted({option.split(".")[1] for option in typed if option.startswith("--model_config.")})
    changed = {key: model_config[key] for key in fields} if model_config else {}  # jsonargparse put them there
    typed_fields = ", ".join(f"--model_config.{key}" for key in fields)
    recipes = []  # the recipe's models: its model_config, then its model_name (those not typed over)
    if "model_config" in recipe and model_config is not None and not config_typed:
        recipes.append(Student(f"the model_config of {recipe['model_config']}", model_config))
    if "model_name" in recipe and model_name is not None and not name_typed:
        named = named_fields(model_name)
        recipes.append(Student(f"the model_name of {recipe['model_name']}", named | changed, not fields))
    student = recipes[0] if recipes else None
    if name_typed:
        student = Student(f"--model_name {model_name}", named_fields(model_name) | changed, not fields)
    elif config_typed or student is None and model_config is not None:  # a file, or fields typed alone
        student = Student("--model_config" if config_typed else typed_fields, model_config)
    elif "--initial_checkpoint_dir" in typed and (checkpoint := checkpoint_model(initial_checkpoint_dir)):
        checkpoint = checkpoint._replace(fields=checkpoint.fields | changed, named=checkpoint.named and not fields)
        if student is None or architecture(checkpoint.fields) != architecture(student.fields):
            student = checkpoint
    if student is None:
        return model_name, model_config  # no student: `resolve_model_config` asks for one
    source = f"{student.source} with {typed_fields}" if fields and student.source != typed_fields else student.source
    for other in recipes:
        if architecture(other.fields) != architecture(student.fields):
            name, aside = student.fields["name"], other.fields["name"]
            print(f"{source}: the student is {name!r}; {other.source} ({aside!r}) is not used.", file=sys.stderr)
    if initial_checkpoint_dir is not None and (initial_checkpoint_dir / "lit_model.pth").is_file():
        given = "--initial_checkpoint_dir"
        if given not in typed:
            given = f"the initial_checkpoint_dir of {recipe.get('initial_checkpoint_dir', 'the recipe')}"
        check_weights_fit(Config(**student.fields), initial_checkpoint_dir, given, source)
    return (student.fields["name"], None) if student.named else (None, student.fields)


def architecture(fields: dict) -> dict:
    """A config's fields but `hf_config`, which says where weights were downloaded from, not what they compute."""
    return {key: value for key, value in fields.items() if key != "hf_config"}


def first_three(differences: list[str]) -> str:
    """The first three `differences`, and how many more."""
    return "; ".join(differences[:3]) + (f"; {len(differences) - 3} more" if len(differences) > 3 else "")


def check_weights_fit(config: Config, checkpoint_dir: Path, given: str, source: str) -> None:
    """Fails unless the checkpoint's weights have the tensors, by name and shape, of the model `config` builds (built
    on the meta device: no memory), naming the first that differ; else `load_state_dict` refuses them after the model
    is built. The refusal names where each came from: `given` the checkpoint ("--initial_checkpoint_dir"), `source`
    the student ("--model_name tiny-llama-1.1b"), and how to pair them either way."""
    with torch.device("meta"):
        wanted = {name: tuple(t.shape) for name, t in GPT(config).state_dict().items()}
    weights = read_weights(checkpoint_dir / "lit_model.pth")
    found = {name: tuple(t.shape) for name, t in weights.get("model", weights).items()}
    differ = [
        f"{name}: {found.get(name, 'absent')} there, {wanted.get(name, 'absent')} in this model"
        for name in sorted(wanted.keys() | found.keys())
        if found.get(name) != wanted.get(name)
    ]
    if differ:
        saved = checkpoint_dir / "model_config.yaml"
        its_model = f"--model_config {saved}" if saved.is_file() else "the --model_name or --model_config it was"
        raise InvalidArgument(
            f"{given} {str(checkpoint_dir)!r} holds another architecture than the student {config.name!r} ({source};"
            f" {first_three(differ)}). To continue that"
            f" checkpoint, give its model instead, {its_model}; to train {config.name!r}, give --initial_checkpoint_dir"
            " a checkpoint of it, or null to start from random weights."
        )


def check_resumed_model(config: Config, checkpoint_dir: Path) -> None:
    """Refuses to resume `checkpoint_dir` as another model than it was trained as (its model_config.yaml, the model
    `litgpt generate` builds from it), naming the fields that differ, before any model is built."""
    saved, here = architecture(asdict(read_config(checkpoint_dir, "--resume"))), architecture(asdict(config))
    differ = [f"{key} {saved[key]} there, {here.get(key)} here" for key in saved if saved[key] != here.get(key)]
    if differ:
        raise InvalidArgument(
            f"--resume: {checkpoint_dir} was trained as {saved['name']!r}, this run's student is {config.name!r}"
            f" ({first_three(differ)}). Resume it as the"
            f" model it is: --model_config {checkpoint_dir / 'model_config.yaml'}."
        )
