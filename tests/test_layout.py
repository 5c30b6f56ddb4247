"""The package's modules import one another one way only: no cycle of any length (README, Layout)."""

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "litgpt_vocagnolm"


def imports_of_each_module() -> dict[str, set[str]]:
    modules = {path.stem for path in PACKAGE.glob("*.py")}
    graph = {}
    for path in PACKAGE.glob("*.py"):
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("litgpt_vocagnolm."):
                found.add(node.module.split(".")[1])
            elif isinstance(node, ast.ImportFrom) and node.module == "litgpt_vocagnolm":
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.Import):
                found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("litgpt_vocagnolm.")}
        graph[path.stem] = (found & modules) - {path.stem}
    return graph


def test_no_module_imports_one_that_imports_it_back():
    graph = imports_of_each_module()
    assert graph["cli"] == set()  # command lines import their commands only when one runs (by name)
    try:
        order = list(TopologicalSorter(graph).static_order())
    except CycleError as error:
        raise AssertionError(f"import cycle: {' -> '.join(error.args[1])}") from None
    # The algorithms import no command.
    for algorithm in ("alignment", "loss", "documents", "packing"):
        assert not graph[algorithm] & {"prepare", "recipe", "score_teacher", "evaluate", "demo", "data"}, algorithm
    assert order.index("data") < order.index("prepare") < order.index("demo")
