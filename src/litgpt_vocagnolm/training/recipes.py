"""The recipes that come with the package: `vocagnolm recipes` lists them and copies one (or the sbatch scripts) into a
folder to edit; `--config NAME` runs one by its name.

The repository keeps them in its top-level `recipes/` (the sbatch scripts in `recipes/slurm/`), which a clone's
`--config recipes/X.yaml` reads and an editable install finds by name. A wheel installs the package alone, with no
clone beside it: it carries that folder inside the package (`litgpt_vocagnolm/recipes/`), so that `litgpt pretrain
--recipe vocagnolm --config tinyllama-qwen2.5-math-7b-instruct` works wherever the package is installed. A path that
exists always wins over a name, so an edited copy in the working folder runs as itself.
"""

import difflib
import re
import shutil
from pathlib import Path

import yaml

from litgpt_vocagnolm.errors import PathMissing, PathTaken, check_writable
from litgpt_vocagnolm.files import shipped

FOLDER = shipped("recipes", "recipes")
SLURM = "slurm"  # `--copy slurm`: the sbatch scripts, not a recipe
RECIPE_SECTIONS = {"teacher", "guidance", "fsdp"}  # what a recipe's YAML holds and LitGPT's `pretrain` does not
# A value of --config that reads as a file name or path (not inline YAML or JSON, not a URL).
PATH_LIKE = re.compile(r"[\w./~+-]+")


def packaged() -> dict[str, Path]:
    """Each packaged recipe's name (its file name without `.yaml`) and path, by name."""
    return {path.stem: path for path in sorted(FOLDER.glob("*.yaml"))}


def find(name: str, flag: str, problem: str = "no packaged recipe has that name") -> Path:
    """The packaged recipe called `name` (with or without `.yaml`); an unknown name is refused, with the closest name
    and the list."""
    recipes = packaged()
    path = recipes.get(name.removesuffix(".yaml"))
    if path is None:
        closest = difflib.get_close_matches(name.removesuffix(".yaml"), recipes, n=1)
        hint = f" Did you mean {closest[0]}?" if closest else ""
        raise PathMissing(
            f"{flag} {name}: {problem}.{hint} The packaged recipes (`vocagnolm recipes` lists them):"
            f" {', '.join(recipes)}."
        )
    return path


def config_path(value: str) -> str:
    """A `--config` value as jsonargparse reads it: an existing path as given, a packaged recipe's name as its path.
    Inline YAML or JSON and URLs pass unchanged."""
    if Path(value).expanduser().exists() or not PATH_LIKE.fullmatch(value):
        return value
    return str(
        find(
            value,
            "--config",
            "no such file, and no packaged recipe has that name: give a YAML's path or a recipe's name",
        )
    )


def config_values(args: list[str]) -> list[tuple[int, str, str]]:
    """Each `--config VALUE` / `--config=VALUE` of `args`: (the index of the word holding the value, what precedes the
    value in that word, the value)."""
    found = []
    for i, arg in enumerate(args):
        if arg == "--config" and i + 1 < len(args):
            found.append((i + 1, "", args[i + 1]))
        elif arg.startswith("--config="):
            found.append((i, "--config=", arg.removeprefix("--config=")))
    return found


def with_packaged_configs(args: list[str]) -> list[str]:
    """`args` (a copy) with each `--config NAME` / `--config=NAME` of a packaged recipe replaced by its path."""
    resolved = list(args)
    for i, before, value in config_values(args):
        resolved[i] = before + config_path(value)
    return resolved


def is_recipe(config: str) -> bool:
    """Whether a `--config` value is one of this package's recipes: a packaged recipe's name, or a YAML file with a
    section of the recipe's own (`RECIPE_SECTIONS`), which LitGPT's `pretrain` does not take."""
    path = Path(config).expanduser()
    if not path.is_file():
        return config.removesuffix(".yaml") in packaged()
    try:
        sections = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False  # not a recipe that can be read: LitGPT says what is wrong with it
    return isinstance(sections, dict) and not RECIPE_SECTIONS.isdisjoint(sections)


def summary(path: Path) -> dict[str, str]:
    """What `vocagnolm recipes` prints of one recipe: its name, teacher, method, budget and file."""
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    teachers = (config.get("teacher") or {}).get("checkpoint_dir") or []
    teachers = [teachers] if isinstance(teachers, str) else teachers  # one teacher, or several
    return {
        "name": path.stem,
        "teacher": "+".join(Path(teacher).name for teacher in teachers) or "none",
        "method": (config.get("guidance") or {}).get("method", "vocagnolm"),
        "budget (tokens)": f"{config['train']['max_tokens']:_}",
        "file": str(path),
    }


def print_table(rows: list[dict[str, str]]) -> None:
    widths = {key: max(len(key), *(len(row[key]) for row in rows)) for key in rows[0]}
    for row in [dict(zip(widths, widths)), *rows]:
        print("  ".join(f"{row[key]:<{width}}" for key, width in widths.items()).rstrip())


def copy_into(sources: list[Path], dest: Path) -> None:
    """Copies `sources` into `dest` (made if missing), refusing before any copy to replace a file there."""
    check_writable(dest, "--dest")
    taken = [str(dest / source.name) for source in sources if (dest / source.name).exists()]
    if taken:
        raise PathTaken(f"--dest {dest}: {', '.join(taken)} exists. Move it away, or give another --dest.")
    dest.mkdir(parents=True, exist_ok=True)
    for source in sources:
        shutil.copyfile(source, dest / source.name)
        print(f"Copied {source.name} to {dest / source.name}")


def recipes(copy: str | None = None, dest: Path = Path(".")) -> None:
    """The recipes that come with the package: name, teacher, method, budget and file.

    Run one by its name: `litgpt pretrain --recipe vocagnolm --config NAME`. To edit one, copy it and give the copy's
    path to --config.

    Arguments:
        copy: A recipe's name, to copy its YAML into ``dest``; or ``slurm``, to copy the sbatch scripts into
            ``dest/slurm/`` (then ``bash slurm/vocagnolm.sbatch NAME_OR_PATH``).
        dest: The folder to copy into. A file already there is never replaced.
    """
    if copy is None:
        print_table([summary(path) for path in packaged().values()])
    elif copy == SLURM:
        copy_into(sorted((FOLDER / SLURM).glob("*.sbatch")), Path(dest) / SLURM)
    else:
        copy_into([find(copy, "--copy")], Path(dest))
