"""`litgpt pretrain --recipe NAME ...` without forking LitGPT.

LitGPT 0.5 has no plugin mechanism: its console script runs `litgpt.__main__.main`, a fixed table of subcommands.
`litgpt_vocagnolm_recipes.pth` imports this module at interpreter start, and only when the command line holds
`--recipe`. Here we register an import hook that, once `litgpt.__main__` has executed, wraps its `main` so that
`pretrain --recipe NAME` runs the recipe registered under NAME in the `litgpt.recipes` entry-point group; every
other command goes to LitGPT untouched. Fabric re-launches the same command line in its child processes, so they
pass through here too. Nothing heavy is imported here.
"""

import sys
from importlib.abc import MetaPathFinder
from importlib.machinery import PathFinder


class _WrapLitGPTMain(MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != "litgpt.__main__":
            return None
        spec = PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        exec_module = spec.loader.exec_module

        def exec_and_wrap(module):
            exec_module(module)
            from litgpt_vocagnolm.cli import litgpt_main

            upstream_main = module.main
            module.main = lambda: litgpt_main(upstream_main)

        spec.loader.exec_module = exec_and_wrap
        return spec


if sys.argv[1:2] == ["pretrain"]:  # imported once per process, however often the .pth line runs
    sys.meta_path.insert(0, _WrapLitGPTMain())
