"""The plugin mechanism: the console scripts, the .pth hook and `python -m` in real processes, one each where the
process is the point (the dispatch, what a fresh interpreter imports, a child process that Fabric starts); what their
parsers and checks say (--help, --print_config, a refusal in one line, the exit status), in this process through the
functions the console scripts end in (`conftest.typed_here`), which parse and check the same way."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from conftest import BIN, RECIPES, ROOT, typed_here
from test_recipe import metrics, recipe_config

from litgpt_vocagnolm.demo.settings import CORPUS

# The two ways LitGPT's command line starts: its console script, and `python -m litgpt`, which runpy runs as __main__.
LITGPT = {"console script": [str(BIN / "litgpt")], "python -m": [sys.executable, "-m", "litgpt"]}


def run(*args: str, cwd: Path = ROOT, timeout: int = 300, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, timeout=timeout, **kwargs)


def test_recipe_help_shows_teacher_and_guidance_groups():
    """Through LitGPT's console script in a real process: the .pth hook hands `--recipe vocagnolm` to the recipe.
    `python -m litgpt` dispatches too: it runs the recipe in test_python_m_litgpt_runs_the_recipe_in_two_processes
    and refuses a misspelt one in tests/test_newcomer.py."""
    out = run(*LITGPT["console script"], "pretrain", "--recipe", "vocagnolm", "--help")
    assert out.returncode == 0, out.stderr
    for flag in (
        "--teacher.checkpoint_dir",
        "--guidance.method",
        "--guidance.top_k",
        "--fsdp.activation_checkpointing",
        "--train.micro_batch_size",
        "--data",
        "--config",
        "--print_config",
    ):
        assert flag in out.stdout, flag
    assert "usage: litgpt pretrain --recipe vocagnolm" in out.stdout


@pytest.mark.parametrize("litgpt", [["litgpt"], ["python", "-m", "litgpt"]], ids=LITGPT)
def test_upstream_pretrain_is_untouched(litgpt):
    """Without --recipe the wrapped `main` is LitGPT's (in a real process, with the hook loaded, in
    test_a_recipe_given_to_litgpt_pretrain_without_recipe_says_to_add_it)."""
    out = typed_here(*litgpt, "pretrain", "--help")
    assert out.returncode == 0, out.stderr
    assert "--guidance" not in out.stdout and "--teacher" not in out.stdout
    assert "Pretrain a model." in out.stdout and "  model_name  " in out.stdout  # LitGPT's own parser


def test_a_recipe_given_to_litgpt_pretrain_without_recipe_says_to_add_it(tmp_path):
    """Without the hook, LitGPT's parser stops at "does not accept nested key 'teacher.checkpoint_dir'". A real
    process of LitGPT's console script: the .pth line loads the hook for `--config` alone, and LitGPT's own config
    still goes to LitGPT."""
    out = run(*LITGPT["console script"], "pretrain", "--config", "demo-cpu", cwd=tmp_path)  # a packaged recipe by name
    assert (out.returncode, out.stdout) == (2, ""), out.stderr
    assert out.stderr == (
        "litgpt pretrain: error: --config demo-cpu is a vocagnolm recipe, which LitGPT's own pretrain does not"
        " take: add --recipe vocagnolm (litgpt pretrain --recipe vocagnolm --config demo-cpu).\n"
    )
    (tmp_path / "litgpt.yaml").write_text("model_name: pythia-14m\n")
    out = run(*LITGPT["console script"], "pretrain", "--config", "litgpt.yaml", "--print_config", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert yaml.safe_load(out.stdout)["model_name"] == "pythia-14m" and "teacher" not in yaml.safe_load(out.stdout)


def test_a_recipe_by_its_path_without_recipe_is_refused_under_python_m_and_a_litgpt_config_goes_to_litgpt(tmp_path):
    """`python -m litgpt`'s wrapped `main` (here), on a recipe by its path, written `--config=PATH`."""
    config = str(RECIPES / "tinyllama-llemma-7b.yaml")
    litgpt = ["python", "-m", "litgpt"]
    out = typed_here(*litgpt, "pretrain", f"--config={config}", cwd=tmp_path)
    assert (out.returncode, out.stdout) == (2, ""), out.stderr
    assert out.stderr == (
        f"litgpt pretrain: error: --config {config} is a vocagnolm recipe, which LitGPT's own pretrain does not"
        f" take: add --recipe vocagnolm (litgpt pretrain --recipe vocagnolm --config {config}).\n"
    )
    # LitGPT's own config goes to LitGPT.
    (tmp_path / "litgpt.yaml").write_text("model_name: pythia-14m\n")
    out = typed_here(*litgpt, "pretrain", "--config", "litgpt.yaml", "--print_config", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert yaml.safe_load(out.stdout)["model_name"] == "pythia-14m" and "teacher" not in yaml.safe_load(out.stdout)


@pytest.mark.parametrize("args", [["--recipe", "nope"], ["--recipe=nope"]])
def test_unknown_recipe_lists_registered_ones(args):
    """LitGPT's console script in a real process (refused before LitGPT loads); `python -m litgpt`'s wrapped `main`
    here (its real process in tests/test_newcomer.py)."""
    for out in (
        run(*LITGPT["console script"], "pretrain", *args),
        typed_here("python", "-m", "litgpt", "pretrain", *args),
    ):
        assert out.returncode == 2
        assert "unknown recipe 'nope'" in out.stderr and "vocagnolm" in out.stderr


def test_print_config_and_dotted_overrides_round_trip(tmp_path):
    out = typed_here(
        "litgpt",
        "pretrain",
        "--recipe",
        "vocagnolm",
        "--guidance.top_k",
        "0.25",
        "--guidance.aggregation",
        "mean",
        "--print_config",
    )
    assert out.returncode == 0, out.stderr
    config = tmp_path / "config.yaml"
    config.write_text(out.stdout)
    again = typed_here(
        "litgpt",
        "pretrain",
        "--recipe",
        "vocagnolm",
        "--config",
        str(config),
        "--guidance.unmapped",
        "exclude",
        "--print_config",
    )
    assert again.returncode == 0, again.stderr
    assert "top_k: 0.25" in again.stdout and "aggregation: mean" in again.stdout and "unmapped: exclude" in again.stdout


@pytest.mark.slow
def test_python_m_litgpt_runs_the_recipe_in_two_processes(tmp_path, tinyllama_mistral_data):
    """Fabric starts the second process as `python -m litgpt.__main__ <the same arguments>`: it must run the recipe."""
    config = recipe_config(tmp_path, tinyllama_mistral_data, None, guidance={"method": "ce"}, devices=2)
    out = run(
        *LITGPT["python -m"],
        "pretrain",
        "--recipe",
        "vocagnolm",
        "--config",
        str(config),
        "--train.max_tokens",
        str(3 * 4 * 64),
        "--train.save_interval",
        "null",
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    assert "MEMBER: 2/2" in out.stderr  # the child process joined
    assert len(metrics(tmp_path / "out")) == 3
    assert (tmp_path / "out" / "final" / "lit_model.pth").is_file()


def test_hook_free_module_equivalent():
    """`python -m litgpt_vocagnolm` in a real process runs `vocagnolm`'s `main`, whose `pretrain --help` (here) is
    the recipe's."""
    out = run(sys.executable, "-m", "litgpt_vocagnolm", "--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: vocagnolm <command>") and "  pretrain  " in out.stdout
    out = typed_here("vocagnolm", "pretrain", "--help")
    assert out.returncode == 0, out.stderr
    assert "--guidance.method" in out.stdout


def test_vocagnolm_help_lists_commands():
    out = run(str(BIN / "vocagnolm"), "--help")
    assert out.returncode == 0
    assert "pretrain" in out.stdout
    bad = run(str(BIN / "vocagnolm"), "nope")
    assert bad.returncode == 2 and "unknown command 'nope'" in bad.stderr


@pytest.mark.parametrize("argv", [[], ["pretrain", "--recipe", "vocagnolm"], ["pretrain", "--config", "x.yaml"]])
def test_interpreter_start_imports_neither_torch_nor_litgpt(argv):
    # Even with `--recipe` or `--config` on the command line, only the tiny hook module may load until
    # litgpt.__main__ runs.
    code = "import sys; print(sorted(m for m in ('torch', 'litgpt', 'jsonargparse') if m in sys.modules))"
    out = run(sys.executable, "-c", code, *argv)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.install
def test_regular_wheel_install_dispatches(tmp_path, dist, installed, installed_quick_demo):
    """A non-editable install: the .pth file must land at the wheel root and work from a fresh environment.
    `make test` keeps what needs no package index: the wheel's files (test_the_wheel_carries_the_hook_at_its_root_the_
    recipes_and_the_corpus) and the recipes listed, copied and run by name from a folder that holds no clone, here
    (test_packaged_recipes_are_listed_copied_and_run_by_name_where_a_path_wins)."""
    (wheel,) = dist.glob("litgpt_vocagnolm-*.whl")
    assert "litgpt_vocagnolm_recipes.pth" in zipfile.ZipFile(wheel).namelist()
    # `installed`: a fresh environment with the wheel installed for real; the editable install of this checkout is
    # not on its path.
    python, litgpt, vocagnolm = (installed / "bin" / name for name in ("python", "litgpt", "vocagnolm"))
    site = Path(run(str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = run(str(litgpt), "pretrain", "--recipe", "vocagnolm", "--help", cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    assert "--guidance.method" in out.stdout
    where = run(str(python), "-c", "import litgpt_vocagnolm; print(litgpt_vocagnolm.__file__)", cwd=tmp_path, env=env)
    assert str(site) in where.stdout  # the installed copy, not this checkout

    # The recipes (the repository's recipes/) and the demo's corpus (its data/) come with the wheel, inside the package.
    names = {path.name for path in RECIPES.glob("*.yaml")} | {f"slurm/{p.name}" for p in RECIPES.glob("slurm/*")}
    assert len(names) == 8 and {f"litgpt_vocagnolm/recipes/{name}" for name in names} <= set(
        zipfile.ZipFile(wheel).namelist()
    )
    corpus = {f"litgpt_vocagnolm/demo/data/{file}" for file, _ in CORPUS}
    assert corpus <= set(zipfile.ZipFile(wheel).namelist())
    # The demo, as a user types it, in an empty folder (`installed_quick_demo`; test_demo.py checks what this
    # environment's demo writes): the corpus it read is the installed copy.
    assert f"in {site / 'litgpt_vocagnolm' / 'demo' / 'data'} [" in (installed_quick_demo / "printed.txt").read_text()
    assert (installed_quick_demo / "out" / "demo" / "results.csv").is_file()
    # Listed, run by name and copied, in a folder that holds no clone.
    listed = run(str(vocagnolm), "recipes", cwd=tmp_path, env=env)
    assert listed.returncode == 0, listed.stderr
    row = next(line.split() for line in listed.stdout.splitlines() if line.startswith("tinyllama-qwen2.5-math-7b "))
    assert row[1:4] == ["Qwen2.5-Math-7B", "vocagnolm", "15_000_000_000"]
    assert row[4] == str(site / "litgpt_vocagnolm" / "recipes" / "tinyllama-qwen2.5-math-7b.yaml")
    recipe = "tinyllama-qwen2.5-math-7b-instruct"
    out = run(
        str(litgpt), "pretrain", "--recipe", "vocagnolm", "--config", recipe, "--print_config", cwd=tmp_path, env=env
    )
    assert out.returncode == 0, out.stderr
    printed = yaml.safe_load(out.stdout)
    assert printed["teacher"]["checkpoint_dir"] == ["checkpoints/Qwen/Qwen2.5-Math-7B-Instruct"]  # one teacher
    assert printed["optimizer"]["init_args"]["lr"] == 8e-5 and printed["train"]["max_tokens"] == 15_000_000_000
    copied = run(str(vocagnolm), "recipes", "--copy", recipe, "--dest", ".", cwd=tmp_path, env=env)
    assert copied.returncode == 0, copied.stderr
    assert (tmp_path / f"{recipe}.yaml").read_text() == (RECIPES / f"{recipe}.yaml").read_text()
    copied = run(str(vocagnolm), "recipes", "--copy", "slurm", "--dest", ".", cwd=tmp_path, env=env)
    assert copied.returncode == 0, copied.stderr
    assert sorted(p.name for p in (tmp_path / "slurm").iterdir()) == ["score-teacher.sbatch", "vocagnolm.sbatch"]


def test_the_wheel_carries_the_hook_at_its_root_the_recipes_and_the_corpus(dist):
    """What a non-editable install needs from the wheel (installed and run in test_regular_wheel_install_dispatches,
    `make test-install`): the .pth file at its root, the recipes (the repository's recipes/) and the demo's corpus
    (its data/) inside the package."""
    (wheel,) = dist.glob("litgpt_vocagnolm-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "litgpt_vocagnolm_recipes.pth" in names
    recipes = {path.name for path in RECIPES.glob("*.yaml")} | {f"slurm/{p.name}" for p in RECIPES.glob("slurm/*")}
    assert len(recipes) == 8 and {f"litgpt_vocagnolm/recipes/{name}" for name in recipes} <= names
    assert {f"litgpt_vocagnolm/demo/data/{file}" for file, _ in CORPUS} <= names


RECIPE = ["litgpt", "pretrain", "--recipe", "vocagnolm"]  # run here (`typed_here`), as the console script runs it
ONE_LINE = "litgpt pretrain --recipe vocagnolm: error: "


@pytest.mark.parametrize(
    "args, refusal",
    [
        (["--train.max_tokens", "1.5"], "--train.max_tokens: 1.5 is not a whole number"),
        (["--train.max_tokens=1e-3"], "--train.max_tokens: 1e-3 is not a whole number"),
        # jsonargparse <= 4.42 says only "Cannot take a Union of no types." for a value outside a Literal
        (["--guidance.method", "nonsense"], "--guidance.method: nonsense is not one of: vocagnolm, ce, rho1, kld,"),
        (["--train.max_tokenz", "5"], "--train.max_tokenz is not an option: did you mean --train.max_tokens?"),
        (["--guidance.top_k", "abc"], "--guidance.top_k: abc is not valid here (it takes float)."),
    ],
)
def test_a_refused_option_is_one_line_naming_option_value_and_what_it_takes(args, refusal):
    out = typed_here(*RECIPE, *args)
    assert (out.returncode, out.stderr.count("\n")) == (2, 1), out.stderr
    assert out.stderr.startswith(ONE_LINE + refusal) and out.stderr.endswith(" See --help.\n"), out.stderr
    if "whole" in refusal:
        assert "(it takes an integer such as 15e9 or 15_000_000_000)" in out.stderr
    debug = typed_here(*RECIPE, *args, "--debug")  # jsonargparse's usage and whole message
    assert debug.returncode == 2 and debug.stderr.startswith("usage: litgpt pretrain --recipe vocagnolm")


def test_a_refused_value_in_a_config_file_is_one_line(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("guidance:\n  scope: everywhere\n")
    out = typed_here("vocagnolm", "pretrain", "--config", str(config))
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "error: --guidance.scope: everywhere is not one of: batch, sequence, global." in out.stderr
    config.write_text("train:\n  max_tokens: 1.5\n")
    out = typed_here("vocagnolm", "pretrain", "--config", str(config))
    assert out.returncode == 2 and "error: --train.max_tokens: 1.5 is not a whole number" in out.stderr


@pytest.mark.parametrize("written", ["1e9", "1E9", "1_000_000_000", "1000000000", "1.0e9"])
def test_whole_numbers_as_people_write_them(tmp_path, written):
    """As the paper and LitGPT's tutorials write budgets, on the command line and in a YAML file."""
    config = tmp_path / "config.yaml"
    config.write_text(f"train:\n  max_tokens: {written}\n  max_seq_length: 2e3\n")
    for args in (["--train.max_tokens", written], ["--config", str(config)]):
        out = typed_here(*RECIPE, "--config", "demo-cpu", *args, "--print_config")
        assert out.returncode == 0, out.stderr
        printed = yaml.safe_load(out.stdout)["train"]
        assert printed["max_tokens"] == 1_000_000_000 and type(printed["max_tokens"]) is int


def test_packaged_recipes_are_listed_copied_and_run_by_name_where_a_path_wins(tmp_path):
    """In a folder that holds no clone, as after `pip install` (test_regular_wheel_install_dispatches runs the same
    from an installed wheel)."""
    listed = typed_here("vocagnolm", "recipes", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    header, *rows = [line.split() for line in listed.stdout.splitlines()]
    assert header == ["name", "teacher", "method", "budget", "(tokens)", "file"]
    assert {row[0]: row[1:] for row in rows}["demo-cpu"] == ["none", "ce", "40_960", str(RECIPES / "demo-cpu.yaml")]
    assert {row[0]: row[1:] for row in rows}["tinyllama-qwen2.5-math-7b"] == [
        "Qwen2.5-Math-7B",
        "vocagnolm",
        "15_000_000_000",
        str(RECIPES / "tinyllama-qwen2.5-math-7b.yaml"),
    ]
    assert sorted(row[0] for row in rows) == sorted(path.stem for path in RECIPES.glob("*.yaml"))

    def printed(config: str, cwd: Path = tmp_path) -> dict:
        out = typed_here("litgpt", "pretrain", "--recipe", "vocagnolm", "--config", config, "--print_config", cwd=cwd)
        assert out.returncode == 0, out.stderr
        return yaml.safe_load(out.stdout)

    def max_tokens(config: str, cwd: Path = tmp_path) -> int:
        return printed(config, cwd)["train"]["max_tokens"]

    assert max_tokens("demo-cpu") == max_tokens("demo-cpu.yaml") == 40_960  # by name, with or without .yaml
    assert max_tokens("recipes/demo-cpu.yaml", cwd=ROOT) == 40_960  # in a clone, by its path
    instruct = printed("tinyllama-qwen2.5-math-7b-instruct")
    assert instruct["teacher"]["checkpoint_dir"] == ["checkpoints/Qwen/Qwen2.5-Math-7B-Instruct"]  # one teacher
    assert instruct["optimizer"]["init_args"]["lr"] == 8e-5 and instruct["train"]["max_tokens"] == 15_000_000_000
    assert typed_here("vocagnolm", "recipes", "--copy", "demo-cpu", "--dest", ".", cwd=tmp_path).returncode == 0
    copy = tmp_path / "demo-cpu.yaml"
    assert copy.read_text() == (RECIPES / "demo-cpu.yaml").read_text()
    copy.write_text(copy.read_text().replace("max_tokens: 40960", "max_tokens: 8192"))
    assert max_tokens("demo-cpu.yaml") == 8192  # the edited copy here, not the packaged recipe
    again = typed_here("vocagnolm", "recipes", "--copy", "demo-cpu", "--dest", ".", cwd=tmp_path)
    assert again.returncode == 1 and again.stderr.count("\n") == 1, again.stderr
    assert "demo-cpu.yaml exists" in again.stderr and "8192" in copy.read_text()  # never replaced
    copied = typed_here("vocagnolm", "recipes", "--copy", "slurm", "--dest", ".", cwd=tmp_path)
    assert copied.returncode == 0, copied.stderr
    assert sorted(p.name for p in (tmp_path / "slurm").iterdir()) == ["score-teacher.sbatch", "vocagnolm.sbatch"]

    unknown = typed_here("litgpt", "pretrain", "--recipe", "vocagnolm", "--config", "tinyllama-qwen", cwd=tmp_path)
    assert unknown.returncode == 1 and unknown.stderr.count("\n") == 1, unknown.stderr
    assert (
        "--config tinyllama-qwen: no such file" in unknown.stderr
        and "tinyllama-qwen2.5-math-7b-instruct" in unknown.stderr
    )


@pytest.mark.parametrize(
    "args, built",
    [
        (["--config", "demo-cpu", "--optimizer.lr", "1e6"], ("AdamW", 1e6, 0.1)),
        (["--config", "demo-cpu", "--optimizer.init_args.lr", "1e6"], ("AdamW", 1e6, 0.1)),
        (["--config", "demo-cpu", "--optimizer.weight_decay", "0.3"], ("AdamW", 1e-3, 0.3)),
        (["--optimizer.class_path", "SGD", "--optimizer.init_args.lr", "0.5"], ("SGD", 0.5, 0)),
        (["--optimizer", '{"class_path": "torch.optim.SGD", "init_args": {"lr": 0.5}}'], ("SGD", 0.5, 0)),
        ([], ("AdamW", 1e-3, 0.01)),  # the recipe's default: torch's AdamW as it comes
        (["--optimizer", "AdamW", "--optimizer.weight_decay", "0.3"], ("AdamW", 1e-3, 0.3)),
        (["--config", "demo-cpu", "--optimizer", "SGD", "--optimizer.lr", "0.1"], ("SGD", 0.1, 0.1)),  # wd kept
        (["--config", "demo-cpu", "--optimizer", '{"class_path": "SGD", "init_args": {"lr": 0.5}}'], ("SGD", 0.5, 0)),
    ],
)
def test_optimizer_overrides_reach_the_optimizer_the_run_builds(args, built):
    """The recipe's parser, then what `setup` does with --optimizer: `check_optimizer` (whose result the run builds
    and hyperparameters.yaml records), then LitGPT's `instantiate_torch_optimizer`, as `main` calls it."""
    import torch
    from jsonargparse import CLI, capture_parser
    from litgpt.utils import instantiate_torch_optimizer

    from litgpt_vocagnolm.cli import _configure
    from litgpt_vocagnolm.training.checks import check_optimizer
    from litgpt_vocagnolm.training.recipe import setup
    from litgpt_vocagnolm.training.recipes import with_packaged_configs

    parser = capture_parser(lambda: CLI(setup, args=[], parser_class=_configure()))
    optimizer = check_optimizer(parser.parse_args(with_packaged_configs(args)).optimizer)
    built_optimizer = instantiate_torch_optimizer(optimizer, [torch.nn.Parameter(torch.zeros(1))])
    defaults = built_optimizer.defaults
    assert (type(built_optimizer).__name__, defaults["lr"], defaults["weight_decay"]) == built


@pytest.mark.parametrize(
    "args, refusal",
    [
        (
            ["--optimizer.init_args.lrr", "1"],
            "--optimizer.init_args.lrr: torch.optim.AdamW takes no 'lrr'. It takes: amsgrad, betas,",
        ),
        (
            ["--optimizer", '{"class_path": "SGD", "init_args": {"betas": [0.9, 0.95]}}'],
            "--optimizer.init_args.betas: torch.optim.SGD takes no 'betas'. It takes: dampening, differentiable,",
        ),
        (["--optimizer", "Adamw"], "--optimizer: module 'torch.optim' has no attribute 'Adamw'. Name a torch.optim"),
    ],
)
def test_an_optimizer_override_that_cannot_apply_is_refused_in_one_line(args, refusal):
    out = typed_here(*RECIPE, "--config", "demo-cpu", "--data.path", "nowhere", *args)  # before the data is read
    assert (out.returncode, out.stderr.count("\n")) == (1, 1), out.stderr
    assert out.stderr.startswith(ONE_LINE + refusal), out.stderr
