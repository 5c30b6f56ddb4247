"""The package's modules import one another one way only: no cycle of any length (README, Layout)."""

import ast
import re
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "litgpt_vocagnolm"


def module_name(path: Path) -> str:
    """`demo/noise.py` -> "demo.noise", `demo/__init__.py` -> "demo", `loss.py` -> "loss"."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of_each_module() -> dict[str, set[str]]:
    """Each module's imports of the package's modules (a package's own `__init__` when its module is named)."""
    paths = [p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" or p.parent != PACKAGE]
    modules = {module_name(path) for path in paths}
    graph = {}
    for path in paths:
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("litgpt_vocagnolm."):
                found.add(node.module.removeprefix("litgpt_vocagnolm."))
            elif isinstance(node, ast.ImportFrom) and node.module == "litgpt_vocagnolm":
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.Import):
                found |= {
                    a.name.removeprefix("litgpt_vocagnolm.")
                    for a in node.names
                    if a.name.startswith("litgpt_vocagnolm.")
                }
        graph[module_name(path)] = (found & modules) - {module_name(path)}
    return graph


def test_no_module_imports_one_that_imports_it_back():
    graph = imports_of_each_module()
    # Command lines import their commands only when one runs (by name), and the user errors they catch: a leaf.
    assert graph["cli"] == {"errors"} and graph["errors"] == set()
    try:
        order = list(TopologicalSorter(graph).static_order())
    except CycleError as error:
        raise AssertionError(f"import cycle: {' -> '.join(error.args[1])}") from None
    # The algorithms import no command.
    commands = {"prepare", "recipe", "score_teacher", "evaluate", "demo", "data", "plan", "measure"}
    for algorithm in ("alignment", "loss", "cross_entropy", "distillation", "methods", "documents", "packing"):
        assert not graph[algorithm] & commands, algorithm
    assert order.index("data") < order.index("prepare") < order.index("demo")
    # `plan --measure` drives the recipe's own loop: the measuring imports the recipe, never the other way round.
    assert {"recipe", "score_teacher"} <= graph["measure"] and "measure" in graph["plan"]
    assert not any({"plan", "measure"} & graph[m] for m in graph if m not in ("plan", "measure"))
    # The data order reads blocks through `data` and builds on nothing above it (the recipe and checkpoints use it).
    assert graph["order"] == {"data", "errors"}
    # The demo's parts never import the demo command that runs them.
    assert not any("demo" in graph[m] for m in graph if m.startswith("demo."))


def test_no_module_is_longer_than_600_lines():
    lengths = {module_name(p): len(p.read_text(encoding="utf-8").splitlines()) for p in PACKAGE.rglob("*.py")}
    assert {name: n for name, n in lengths.items() if n > 600} == {}


def test_only_the_method_table_lists_method_names():
    """A tuple, list or set of method names (a group of methods, such as `method in ("ce", "uld")`) appears in
    `methods` alone: everything else reads the table. (The demo's students are runs, named after their method.)"""
    from litgpt_vocagnolm.methods import METHODS

    found = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "methods.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(node.elts) >= 2:
                if all(isinstance(e, ast.Constant) and e.value in METHODS for e in node.elts):
                    found.append(f"{module_name(path)}:{node.lineno} {ast.unparse(node)}")
    assert found == []


def test_no_function_takes_more_than_eight_parameters():
    """Outside the console entry points (their signature is the command line), parameters are grouped, as LitGPT
    groups TrainArgs and EvalArgs; keyword-only options count as any other parameter."""
    entry_points = {
        ("recipe", "setup"),
        ("demo", "demo"),
        ("prepare", "prepare"),
        ("score_teacher", "score_teacher"),
        ("evaluate", "evaluate"),
        ("inspection", "inspect"),
    }
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if (module_name(path), node.name) in entry_points:
                continue
            arguments = node.args
            count = len(arguments.posonlyargs) + len(arguments.args) + len(arguments.kwonlyargs)
            count -= bool(arguments.args) and arguments.args[0].arg in ("self", "cls", "ctx")
            if count > 8:
                found.append(f"{module_name(path)}.{node.name}: {count}")
    assert found == []


def test_nothing_cites_a_file_outside_the_repository():
    """Design notes the code relies on are in docs/design.md; the code cites that, nothing outside the repository."""
    found = [module_name(p) for p in PACKAGE.rglob("*.py") if "DESIGN.md" in p.read_text(encoding="utf-8")]
    assert found == []
    design = (PACKAGE.parents[1] / "docs" / "design.md").read_text(encoding="utf-8")
    for section in ("Alignment", "Teacher-guided loss", "Prepared data"):  # the sections docstrings cite by name
        assert f"## {section}\n" in design


def test_the_readme_layout_lists_every_module_and_data_folder():
    readme = (PACKAGE.parents[1] / "README.md").read_text(encoding="utf-8")
    layout = readme[readme.index("## Layout") :]
    listed = {line.split()[0] for line in layout.splitlines() if line.startswith("  ") and line.split()}
    modules = {p.name for p in PACKAGE.rglob("*.py")} | {f"{p.name}/" for p in PACKAGE.iterdir() if p.is_dir()}
    modules -= {"__pycache__/"}
    assert modules - listed == set()
    for folder in ("recipes/", "docs/", "tests/", "benchmarks/", "data/"):
        assert f"\n{folder}" in layout, folder


def names_defined(body: list[ast.stmt]) -> dict[str, ast.AST | None]:
    """The names a module or class body defines itself (functions, classes, assignments), not the ones it imports."""
    names: dict[str, ast.AST | None] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id: None for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names


def test_every_dotted_reference_in_the_package_points_where_the_name_lives():
    """A backticked `module.name` (or `module.Class.attribute`) in a docstring or comment names a package module that
    defines that name itself: a name that moved leaves no reference to where it was."""
    trees = {module_name(p): ast.parse(p.read_text(encoding="utf-8")) for p in PACKAGE.rglob("*.py")}
    found = []
    for path in PACKAGE.rglob("*.py"):
        for span in re.findall(r"`([A-Za-z_][\w.]*\.[A-Za-z_]\w*)(?:\(\))?`", path.read_text(encoding="utf-8")):
            parts = span.split(".")
            cuts = [cut for cut in range(len(parts) - 1, 0, -1) if ".".join(parts[:cut]) in trees]
            if not cuts or parts[-1] == "py":  # not a module of the package, or a file's name
                continue
            names = names_defined(trees[".".join(parts[: cuts[0]])].body)
            rest = parts[cuts[0] :]
            node = names.get(rest[0], "missing") if rest[0] in names else "missing"
            if node == "missing" or (
                isinstance(node, ast.ClassDef) and rest[1:] and rest[1] not in names_defined(node.body)
            ):
                found.append(f"{module_name(path)}: `{span}`")
    assert found == []
