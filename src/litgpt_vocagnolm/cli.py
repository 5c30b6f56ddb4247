"""Command lines: `vocagnolm <command>` and the `litgpt pretrain --recipe NAME` dispatch.

Each command is a typed function; jsonargparse builds its parser (with `--help`, `--config`, `--print_config` and
dotted overrides) only for the command that runs, so `vocagnolm --help` stays fast.
"""

import difflib
import os
import re
import sys
from contextlib import contextmanager, suppress
from decimal import Decimal, InvalidOperation
from functools import cache
from importlib import import_module
from importlib.metadata import entry_points
from pathlib import Path
from types import UnionType
from typing import Any, Callable, Iterator, Literal, NoReturn, Union, get_args, get_origin

RECIPE_GROUP = "litgpt.recipes"
DEBUG_FLAG, DEBUG_ENV = "--debug", "VOCAGNOLM_DEBUG"  # either shows a user error's traceback
UNION_OF_NO_TYPES = "Cannot take a Union of no types."
INT64_MAX = 2**63 - 1  # the largest whole number an option takes
# Commands that run no model: they skip LitGPT's torch setting (`_configure`), so that those whose modules need no
# torch (inspect, prepare, recipes) show --help, parse and refuse without importing it (2 s of CPU, far more on a
# loaded machine).
NO_MODEL = {"inspect", "prepare", "recipes", "export", "convert_to_litgpt"}

# name -> ("module:function", one-line help). `pretrain` is dispatched through the recipe registry instead.
COMMANDS: dict[str, tuple[str | None, str]] = {
    "pretrain": (None, "Run a registered recipe (default: vocagnolm); the same as `litgpt pretrain --recipe NAME`"),
    "inspect": (
        "litgpt_vocagnolm.alignment.inspection:inspect",
        "How two tokenizers cut a text and how Token-level Lexical Alignment maps them",
    ),
    "prepare": (
        "litgpt_vocagnolm.data.prepare:prepare",
        "Tokenize with both tokenizers, align, and write LitData shards",
    ),
    "score-teacher": (
        "litgpt_vocagnolm.training.score_teacher:score_teacher",
        "Score prepared data once with the teacher; train with --teacher.cache instead of a live teacher",
    ),
    "plan": (
        # takes the recipe's command line: it builds its parser from the recipe's
        "litgpt_vocagnolm.planning.plan:plan",
        "Per-GPU memory of a recipe's step and the largest micro-batch that fits, before submitting it",
    ),
    "evaluate": (
        "litgpt_vocagnolm.evaluation.evaluate:evaluate",
        "Accuracy on the paper's 9 math benchmarks (few-shot CoT) and bits per byte",
    ),
    "export": (
        "litgpt_vocagnolm.training.export:export",
        "A sharded training checkpoint (step-*) as one lit_model.pth for litgpt generate / convert_from_litgpt",
    ),
    "demo": (
        "litgpt_vocagnolm.demo.pipeline:demo",
        "The whole method in miniature on a CPU: teacher, students per method, table, plot",
    ),
    "recipes": (
        "litgpt_vocagnolm.training.recipes:recipes",
        "The recipes that come with the package (name, teacher, method, budget); --copy one, or the sbatch scripts",
    ),
    "convert_to_litgpt": (
        "litgpt_vocagnolm.models.model_configs:convert_to_litgpt",
        "litgpt convert_to_litgpt, also for llemma_7b, deepseek-math-7b-* and Mistral-7B-ProXMath",
    ),
}


def registered_recipes() -> dict[str, object]:
    return {ep.name: ep for ep in entry_points(group=RECIPE_GROUP)}


def _split_recipe(args: list[str], command: str) -> tuple[str | None, list[str]]:
    """Takes `--recipe NAME` / `--recipe=NAME` out of `args` (a copy: Fabric's children re-read `sys.argv`); `command`
    is what the user typed before them, for the error line."""
    rest = list(args)
    for i, arg in enumerate(rest):
        if arg == "--recipe":
            if i + 1 >= len(rest):
                _fail(command, "--recipe needs a name", registered_recipes())
            return rest[i + 1], rest[:i] + rest[i + 2 :]
        if arg.startswith("--recipe="):
            return arg.split("=", 1)[1], rest[:i] + rest[i + 1 :]
    return None, rest


def _fail(command: str, message: str, recipes: dict, given: str = "") -> NoReturn:
    """A refused `--recipe` in one line, as a misspelt option is refused: the command, what is wrong, the registered
    recipe closest to the name `given` and every registered one; exit status 2."""
    closest = difflib.get_close_matches(given, recipes, n=1) if given else []
    hint = f": did you mean {closest[0]}?" if closest else "."
    names = ", ".join(sorted(recipes)) or "(none: is litgpt-vocagnolm installed in this environment?)"
    print(
        f"{command}: error: {message}{hint} Registered recipes ({RECIPE_GROUP} entry points): {names}.", file=sys.stderr
    )
    raise SystemExit(2)


def _split_debug(args: list[str]) -> tuple[bool, list[str]]:
    """Takes `--debug` out of `args` (a copy); VOCAGNOLM_DEBUG=1 in the environment does the same."""
    rest = [arg for arg in args if arg != DEBUG_FLAG]
    return len(rest) < len(args) or os.environ.get(DEBUG_ENV, "") not in ("", "0"), rest


@contextmanager
def plain_user_errors(prog: str, debug: bool) -> Iterator[None]:
    """A user error (`errors.UserError`: a bad value, a missing or taken path; or a `PermissionError`, which only a path
    the user gave can raise) as one line and exit status 1, its traceback only with `debug`; Ctrl-C as one line and exit
    status 130. Every other exception is a bug and keeps its traceback."""
    from litgpt_vocagnolm.errors import UserError

    try:
        yield
    except UserError as error:
        if debug:
            raise
        # Raised in a DataLoader worker, it arrives with the worker's traceback in its message (torch's
        # ExceptionWrapper): keep what follows its last line's "InvalidArgument: ".
        message = str(error).rsplit(f"\n{type(error).__name__}: ", 1)[-1]
        print(f"{prog}: error: {message}", file=sys.stderr)
        raise SystemExit(1) from None
    except PermissionError as error:  # the file system refused a path the user gave: theirs to change, not a bug
        if debug:
            raise
        print(f"{prog}: error: {error}. Give a path this user may write to (and read).", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        # 128 + SIGINT, what a shell reports for Ctrl-C: `vocagnolm prepare ... && litgpt pretrain ...` stops here.
        print(f"{prog}: interrupted.", file=sys.stderr)
        raise SystemExit(130) from None


def run_recipe(name: str, args: list[str], command: str = "litgpt pretrain", prog: str | None = None) -> None:
    """Runs the recipe `name` on `args`; its errors name the command as the user typed it, `prog` (by default
    `COMMAND --recipe NAME`), an unknown name the `command` alone."""
    debug, args = _split_debug(args)
    prog = prog or f"{command} --recipe {name}"
    recipe, args = _checked_recipe(name, args, command, prog, debug)
    with plain_user_errors(prog, debug):
        _run(recipe.load(), args, prog=prog, debug=debug)


def _checked_recipe(name: str, args: list[str], command: str, prog: str, debug: bool) -> tuple[Any, list[str]]:
    """The entry point of the recipe `name` and `args` with each packaged recipe's name as its path, after the
    refusals that need neither the recipe nor LitGPT (whose import takes about 2.4 times torch's): an unknown recipe, a
    `--config` that is neither a file nor a packaged recipe."""
    recipes = registered_recipes()
    if name not in recipes:
        _fail(command, f"unknown recipe {name!r}", recipes, given=name)
    with plain_user_errors(prog, debug):
        return recipes[name], _packaged_configs(args)


def check_before_litgpt(argv: list[str]) -> None:
    """`litgpt pretrain --recipe NAME ...` (LitGPT's console script; `argv` its command line) refused as `run_recipe`
    would refuse it, for what needs no LitGPT; _hook.py calls it before `litgpt` is imported."""
    name, rest = _split_recipe(argv[2:], "litgpt pretrain")
    if name is not None:
        debug, rest = _split_debug(rest)
        _checked_recipe(name, rest, "litgpt pretrain", f"litgpt pretrain --recipe {name}", debug)


def _packaged_configs(args: list[str]) -> list[str]:
    """`--config NAME` of a recipe that comes with the package, as its path (`recipes.with_packaged_configs`)."""
    return import_module("litgpt_vocagnolm.training.recipes").with_packaged_configs(args)


def _run(function: Callable, args: list[str], prog: str, debug: bool, model: bool = True) -> None:
    from jsonargparse import CLI

    CLI(function, args=args, prog=prog, parser_class=_configure(debug, model))


@cache
def _optimizer_option() -> type:
    """LitGPT's `optimizer: str | dict` option, on which `--optimizer NAME`, `--optimizer.ARG VALUE` and `--optimizer
    '{...}'` each change the optimizer given before them (`checks.override_optimizer`), so that what --print_config
    shows, what runs and what hyperparameters.yaml records are one class and its arguments. jsonargparse's own replaces
    a class with init_args by a bare name, and a name by a dict of arguments without a class."""

    # The action jsonargparse gives a typed parameter, which it does not export: subclassed so that the option keeps
    # its type's parsing and --help. pyproject.toml holds jsonargparse within LitGPT's range (4.37-4.41).
    from jsonargparse._typehints import ActionTypeHint

    class OptimizerOption(ActionTypeHint):
        def __call__(self, parser, cfg, value: str, option: str) -> None:
            checks = import_module("litgpt_vocagnolm.training.checks")
            key = option.removeprefix(f"--{self.dest}").removeprefix(".")
            cfg[self.dest] = checks.override_optimizer(cfg.get(self.dest), key, value)

    return OptimizerOption


@cache
def _model_config_option() -> type:
    """The recipe's `model_config: Config | None` option, on which `--model_config FILE` reads a YAML or JSON file of
    `litgpt.Config` fields (`student.model_config_text`: such as a checkpoint's model_config.yaml) and, as inline JSON
    does, replaces the config given before it. jsonargparse 4.41 takes no file for an optional dataclass (it adds a
    `__path__` key that the dataclass refuses) and merges a whole config into the one before it, keeping the recipe's
    fields that a file lacks. `--model_config.KEY VALUE` is jsonargparse's."""

    from jsonargparse._typehints import ActionTypeHint  # as in `_optimizer_option`

    class ModelConfigOption(ActionTypeHint):
        def __call__(self, parser, cfg, value: str, option: str) -> None:
            if option == f"--{self.dest}":
                cfg[self.dest] = None
                value = import_module("litgpt_vocagnolm.training.student").model_config_text(value)
            super().__call__(parser, cfg, value, option)

    return ModelConfigOption


def _own_actions(parser) -> None:
    """jsonargparse builds each parameter's action itself: LitGPT's `optimizer: str | dict` and the recipe's
    `model_config` get ours (`_optimizer_option`, `_model_config_option`)."""
    optimizer = _action(parser, "optimizer")
    if optimizer is not None and get_args(getattr(optimizer, "_typehint", None)) == (str, dict):
        optimizer.__class__ = _optimizer_option()
    if _action(parser, "model_config") is not None:
        _action(parser, "model_config").__class__ = _model_config_option()


def _choose_student(parser, cfg) -> None:
    """The student the command line gives (`student.choose_student`: what is typed wins over the recipe), set in `cfg`
    as `model_name` or `model_config`, the other None: what --print_config shows, what runs and what
    hyperparameters.yaml records."""
    from jsonargparse import Namespace

    student = import_module("litgpt_vocagnolm.training.student")
    typed = [arg.split("=", 1)[0] for arg in parser.args if arg.startswith("--")]
    model_config = cfg.model_config.as_dict() if cfg.model_config is not None else None
    recipe = _recipe_options(parser.args, ("model_name", "model_config", "initial_checkpoint_dir"))
    name, config = student.choose_student(cfg.model_name, model_config, cfg.initial_checkpoint_dir, typed, recipe)
    cfg["model_name"] = name
    if config != model_config:  # the fields of a dataclass, as jsonargparse holds them
        cfg["model_config"] = None if config is None else Namespace(**config)


def _recipe_options(args: list[str], keys: tuple[str, ...]) -> dict[str, str]:
    """Which `--config` of `args` gives each of `keys` (its last, as jsonargparse reads them), by name as the user
    names it ("--config demo-cpu"); a key no --config gives (or gives as null) is absent."""
    import yaml

    recipes = import_module("litgpt_vocagnolm.training.recipes")
    names = {str(path): name for name, path in recipes.packaged().items()}
    given = {}
    for _, _, value in recipes.config_values(args):
        path = Path(value).expanduser() if recipes.PATH_LIKE.fullmatch(value) else None
        with suppress(OSError, yaml.YAMLError):  # unreadable: jsonargparse says so
            content = yaml.safe_load(path.read_text(encoding="utf-8") if path else value)
            content = content if isinstance(content, dict) else {}
            given |= {key: f"--config {names.get(value, value)}" for key in keys if content.get(key) is not None}
    return given


def _configure(debug: bool = False, model: bool = True) -> type:
    """What `litgpt.__main__.main` sets up before its CLI call (its torch setting only for a command that runs a
    `model`); returns the parser class to build parsers with, which prints a refused option in one line (jsonargparse's
    usage and full message with `debug`)."""
    from jsonargparse import ArgumentParser

    class Parser(ArgumentParser):
        """Whole numbers as people write them, options only by their whole names, LitGPT's `--optimizer` as one
        class and its arguments, and a refused option as one line.

        jsonargparse 4.41 reads `1e9` as the float 1000000000.0, which an `int` option refuses (LitGPT's
        `TrainArgs.max_tokens`); its `int` is a leaf type, checked before any registered type, so no type can be
        registered for it. Each value for an option that takes only integers is read here as the integer it writes
        (`1e9`, `15e9`, `1_000_000_000`, `15e9` in a YAML file), exactly, before jsonargparse checks it; `1.5`,
        `1e-3` and a number beyond 64 bits (`1e999`) are refused."""

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **{**kwargs, "allow_abbrev": False})  # `--max_seq_len` is no option
            self.given: dict[str, str] = {}  # each option's value as typed (or in a config), for the error line

        def parse_args(self, *args, **kwargs):
            _own_actions(self)
            return super().parse_args(*args, **kwargs)

        def _positional_optionals(self, cfg, unknown):  # jsonargparse: once the command line is read, before
            # --print_config shows it and the checks; the recipe's parser (and `plan`'s) chooses the student there
            cfg, unknown = super()._positional_optionals(cfg, unknown)
            if not unknown and _action(self, "model_config") is not None:
                _choose_student(self, cfg)
            return cfg, unknown

        def _get_values(self, action, arg_strings):  # argparse: the values of an option on the command line
            self.given[action.dest] = " ".join(map(str, arg_strings))
            if _whole_numbers_only(getattr(action, "_typehint", None)):
                try:
                    arg_strings = [_as_whole_number(value) for value in arg_strings]
                except OverflowError as error:
                    self.error(f'Parser key "{action.dest}": {error}')
            return super()._get_values(action, arg_strings)

        def _check_value_key(self, action, value, key, cfg, append=False):  # jsonargparse: every value, configs' too
            self.given[key] = str(value)  # the last value checked is the one refused
            if _whole_numbers_only(getattr(action, "_typehint", None)):
                try:
                    value = _as_whole_number(value)
                except OverflowError as error:
                    raise TypeError(f'Parser key "{key}": {error}') from error
            return super()._check_value_key(action, value, key, cfg, append)

        def error(self, message: str, ex: Exception | None = None) -> NoReturn:
            message = _name_the_choices(self, message)
            if debug or not self.exit_on_error:  # a nested parser's error is caught by the parser that holds it
                super().error(message, ex)
            print(f"{self.prog}: error: {_one_line(self, message)} See --help.", file=sys.stderr)
            self.exit(2)

    _litgpt_settings(model)
    return Parser


def _litgpt_settings(model: bool) -> None:
    """The settings `litgpt.__main__.main` makes before its CLI call; its torch setting only for a command that runs a
    `model`."""
    import warnings

    from jsonargparse import set_config_read_mode, set_docstring_parse_options

    set_docstring_parse_options(attribute_docstrings=True)
    set_config_read_mode(urls_enabled=True)
    warnings.filterwarnings(
        "ignore", message=r"The epoch parameter in `scheduler.step\(\)` was not necessary", category=UserWarning
    )
    if model:
        import torch

        torch.set_float32_matmul_precision("high")


def _whole_numbers_only(typehint: object) -> bool:
    """Whether an option's type takes integers and neither floats nor strings (`int`, `Optional[int]`)."""
    options = get_args(typehint) if get_origin(typehint) in (Union, UnionType) else (typehint,)
    return int in options and not {float, str} & set(options)


def _as_whole_number(value: object) -> object:
    """`value` as the integer it writes when it writes one exactly: the text `1e9`, `15e9` or `1_000_000_000` as
    "1000000000"..., the float 15e9 (from a YAML file) as 15000000000. Anything else unchanged. A whole number beyond
    64 bits (`1e999`) raises OverflowError: no count of a run reaches it, and a tensor could not hold it."""
    number = None
    if isinstance(value, int) and not isinstance(value, bool) or isinstance(value, float) and value.is_integer():
        number = Decimal(value)
    elif isinstance(value, str):
        with suppress(InvalidOperation):
            number = Decimal(value.strip())
    if number is None or not number.is_finite() or number != number.to_integral_value():
        return value
    if number.copy_abs() > INT64_MAX:  # compared as a Decimal: 1e999999999 is never written out as an int
        raise OverflowError("beyond 64 bits")
    return str(int(number)) if isinstance(value, str) else int(number)


def _name_the_choices(parser, message: str) -> str:
    """Names the choices of a Literal of strings that a value is not among: jsonargparse before 4.43 (litgpt pins
    <= 4.41) reports only "Cannot take a Union of no types." there (its pull request #790)."""

    def choices(match: re.Match) -> str:
        typehint = getattr(_action(parser, match[1]), "_typehint", None)
        if get_origin(typehint) is not Literal:
            return match[0]
        key = match[0][: -len(UNION_OF_NO_TYPES)]
        return f"{key}Expected one of: {', '.join(map(str, get_args(typehint)))}"

    return re.sub(r'Parser key "([^"]+)":\s+' + re.escape(UNION_OF_NO_TYPES), choices, message)


def _action(parser, dest: str) -> object | None:
    return next((action for action in parser._actions if action.dest == dest), None)


def _one_line(parser, message: str) -> str:
    """jsonargparse's message for a refused option (a value, a misspelt option) as one line: the option, the value
    and what the option takes."""
    from jsonargparse import ActionConfigFile

    key = re.match(r'Parser key "([^"]+)":', message)
    nested = re.search(r"^\s*Given value: NestedArg\(key='([^']*)', val='?(.*?)'?\)$", message, re.MULTILINE)
    if key and nested:  # `--data.init_args.num_workers 1.5`: an argument of a class, the innermost error says why
        reasons = [line.strip(" -") for line in message.split("Given value type:")[0].splitlines()]
        reason = next(r for r in reversed(reasons) if r and not r.endswith(("<class 'NoneType'>", ":")))
        return f"--{key[1]}.{nested[1]}: {nested[2]} is refused: {_readable(reason)}."
    if key and isinstance(_action(parser, key[1]), ActionConfigFile):  # --config FILE
        value = parser.given.get(key[1], "")
        if os.path.isdir(value):
            return f"--{key[1]} {value} is a directory, not a file: give the path of a YAML file."
        return f"--{key[1]} {value}: {message[key.end() :].strip().rstrip('.')}."
    if key and "litgpt.config.Config" in str(getattr(_action(parser, key[1]), "_typehint", None)):  # --model_config
        errors = message.split("Errors:", 1)[-1].split("Given value type:")[0]
        reasons = [_readable(line.strip(" -")) for line in errors.splitlines() if "NoneType" not in line]
        reason = re.sub(r'Parser key "([^"]+)":', r"\1:", " ".join(filter(None, reasons)))
        return (
            f"--{key[1]}: {parser.given.get(key[1], 'the value')} is not a model config ({reason}): give a YAML or JSON"
            " file of litgpt.Config fields (such as the model_config.yaml beside a checkpoint's lit_model.pth) or"
            " inline JSON, or --model_name NAME."
        )
    if key and _action(parser, key[1]) is not None:
        given = re.search(r"(?:Given|Got) value: (.*)$", message, re.MULTILINE)
        value = parser.given.get(key[1]) or (given[1] if given else "the value")
        return f"--{key[1]}: {value} is not {_what_it_takes(getattr(_action(parser, key[1]), '_typehint', None))}."
    unknown = re.match(r"Unrecognized arguments: (\S+)", message)
    if unknown and unknown[1].startswith("-"):
        option = unknown[1].split("=", 1)[0]
        options = [name for action in parser._actions for name in action.option_strings]
        closest = difflib.get_close_matches(option, options, n=1)
        return f"{option} is not an option" + (f": did you mean {closest[0]}?" if closest else ".")
    return " ".join(message.split()).rstrip(".") + "."


def _readable(text: str) -> str:
    """`<class 'pathlib.Path'>` as `Path`, `typing.Optional` as `Optional`."""
    return re.sub(r"<class '(?:\w+\.)*(\w+)'>", r"\1", text).replace("typing.", "")


def _what_it_takes(typehint: object) -> str:
    if _whole_numbers_only(typehint):
        return "a whole number below 2**63 (it takes an integer such as 15e9 or 15_000_000_000)"
    if get_origin(typehint) is Literal:
        return f"one of: {', '.join(map(str, get_args(typehint)))}"
    return f"valid here (it takes {_readable(str(typehint))})"


def litgpt_main(upstream_main: Callable[[], None]) -> None:
    """Replaces `litgpt.__main__.main` (see _hook.py): `pretrain --recipe NAME` runs the recipe, all else is
    LitGPT's."""
    if sys.argv[1:2] == ["pretrain"]:
        name, rest = _split_recipe(sys.argv[2:], "litgpt pretrain")
        if name is not None:
            return run_recipe(name, rest)
    return upstream_main()


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    return (
        "usage: vocagnolm <command> [--help] [--debug] [options]\n\ncommands:\n"
        + "\n".join(lines)
        + f"\n\nA mistake in the options prints one line; {DEBUG_FLAG} (or {DEBUG_ENV}=1) shows its traceback too."
    )


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        closest = difflib.get_close_matches(command, COMMANDS, n=1)
        hint = f": did you mean {closest[0]}?" if closest else "."
        print(f"vocagnolm: error: unknown command {command!r}{hint} See vocagnolm --help.", file=sys.stderr)
        raise SystemExit(2)
    if command == "pretrain":
        name, rest = _split_recipe(rest, "vocagnolm pretrain")
        prog = None if name else "vocagnolm pretrain"  # the default recipe, as typed
        return run_recipe(name or "vocagnolm", rest, command="vocagnolm pretrain", prog=prog)
    module, function = COMMANDS[command][0].split(":")
    debug, rest = _split_debug(rest)
    prog = f"vocagnolm {command}"
    with plain_user_errors(prog, debug):
        if command == "plan":
            rest = _packaged_configs(rest)  # an unknown --config refused before the plan (and LitGPT) loads
            return getattr(import_module(module), function)(rest, prog=prog, parser_class=_configure(debug))
        _run(getattr(import_module(module), function), rest, prog=prog, debug=debug, model=command not in NO_MODEL)
