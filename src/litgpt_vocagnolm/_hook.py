"""`litgpt pretrain --recipe NAME ...` (and `python -m litgpt pretrain --recipe NAME ...`) without forking LitGPT.

LitGPT 0.5 has no plugin mechanism: its console script and `python -m litgpt` run litgpt/__main__.py, a fixed table of
subcommands. `litgpt_vocagnolm_recipes.pth` imports this module at interpreter start, and only when the command line
holds `--recipe` or `--config`. Here we register an import hook that supplies the code of `litgpt.__main__`: LitGPT's
own, then its `main` wrapped so that `pretrain --recipe NAME` runs the recipe registered under NAME in the
`litgpt.recipes` entry-point group, and `pretrain --config` with one of this package's recipes but no `--recipe` is
refused in one line that says to add it; every other command goes to LitGPT untouched. Through LitGPT's console script
an unknown recipe or `--config` is refused before LitGPT loads. Fabric re-launches the same command line in its child
processes (`python -m litgpt.__main__ ...` under `-m`), so they pass through here too. Nothing heavy is imported here.
"""

import os
import sys
from collections.abc import Callable
from importlib.abc import Loader, MetaPathFinder
from importlib.machinery import PathFinder

# What runs as litgpt/__main__.py. Under `python -m`, runpy executes a loader's `get_code` in a fresh `__main__`
# namespace and never calls `exec_module`, so the wrapping must be in the code itself.
_WRAPPED_MAIN = compile(
    "import litgpt_vocagnolm._hook; litgpt_vocagnolm._hook.exec_litgpt_main(globals())",
    "<litgpt_vocagnolm._hook>",
    "exec",
)


class _WrapLitGPTMain(MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname == "litgpt" and os.path.basename(sys.argv[0]).removesuffix(".exe") == "litgpt":
            # LitGPT's console script, about to load LitGPT (2.4 times torch's import): an unknown recipe or --config
            # is refused now, in the line it would get after loading.
            from litgpt_vocagnolm.cli import check_before_litgpt

            check_before_litgpt(sys.argv)
        if fullname != "litgpt.__main__":
            return None
        spec = PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _WrappedMainLoader(spec.loader)
        return spec


class _WrappedMainLoader(Loader):
    def __init__(self, upstream: Loader) -> None:
        self.upstream = upstream

    def get_code(self, fullname):  # runpy: `python -m litgpt`
        return _WRAPPED_MAIN

    def exec_module(self, module) -> None:  # import: the `litgpt` console script
        exec_litgpt_main(module.__dict__)


def exec_litgpt_main(namespace: dict) -> None:
    """Runs litgpt/__main__.py's code in `namespace` and wraps its `main`; run as `__main__`, calls it as the file
    itself would."""
    as_main = namespace["__name__"] == "__main__"
    namespace["__name__"] = "litgpt.__main__"  # so that the file's closing `if __name__ == "__main__": main()` waits
    exec(namespace["__spec__"].loader.upstream.get_code("litgpt.__main__"), namespace)
    from litgpt_vocagnolm.cli import litgpt_main

    upstream_main = namespace["main"]
    namespace["main"] = lambda: litgpt_main(lambda: without_recipe(upstream_main))
    if as_main:
        namespace["__name__"] = "__main__"
        namespace["main"]()


def without_recipe(upstream_main: Callable[[], None]) -> None:
    """LitGPT's own command (no `--recipe`). Given one of this package's recipes, `litgpt pretrain --config` would
    stop in LitGPT's parser ("does not accept nested key 'teacher.checkpoint_dir'"): one line says to add `--recipe
    vocagnolm` instead, and the command exits 2, as for a parser's refusal."""
    if sys.argv[1:2] == ["pretrain"]:
        from litgpt_vocagnolm.training.recipes import config_values, is_recipe

        recipes = [value for _, _, value in config_values(sys.argv[2:]) if is_recipe(value)]
        if recipes:
            print(
                f"litgpt pretrain: error: --config {recipes[0]} is a vocagnolm recipe, which LitGPT's own pretrain"
                f" does not take: add --recipe vocagnolm (litgpt pretrain --recipe vocagnolm --config {recipes[0]}).",
                file=sys.stderr,
            )
            raise SystemExit(2)
    upstream_main()


if sys.argv[1:2] == ["pretrain"]:  # imported once per process, however often the .pth line runs
    # At this point `python -m litgpt pretrain ...` has sys.argv == ["-m", "pretrain", ...]: the module name is not
    # known yet, which is why the hook is keyed on `litgpt.__main__` being loaded rather than on sys.argv[0].
    sys.meta_path.insert(0, _WrapLitGPTMain())
