"""The package's sub-packages and modules import one another one way only (README, Layout): each package imports
only the packages its row of the layout builds on, and no module imports one that imports it back."""

import ast
import re
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "litgpt_vocagnolm"

# The shared leaves every package may import: user errors, file hashes and writes.
SHARED = {"errors", "files"}
# Each sub-package (a job, a row of the README's layout) and the packages its modules may import besides its own and
# the shared leaves. Read from the bottom up: the algorithms build on nothing, the commands on the rows above them.
PACKAGES = {
    "alignment": set(),
    "loss": set(),
    "models": {"alignment", "loss"},
    "data": {"alignment", "models"},
    "training": {"alignment", "loss", "models", "data"},
    "planning": {"alignment", "loss", "models", "data", "training"},
    "evaluation": {"loss", "models", "data"},
    "demo": {"alignment", "loss", "models", "data", "training"},
}


def module_name(path: Path) -> str:
    """`demo/noise.py` -> "demo.noise", `demo/__init__.py` -> "demo", `errors.py` -> "errors"."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of_each_module() -> dict[str, set[str]]:
    """Each module's imports of the package's modules: `from litgpt_vocagnolm.data import order` imports "data"
    (its `__init__`) and "data.order"."""
    paths = [p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" or p.parent != PACKAGE]
    modules = {module_name(path) for path in paths}
    graph = {}
    for path in paths:
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("litgpt_vocagnolm"):
                parent = node.module.removeprefix("litgpt_vocagnolm").removeprefix(".")
                found |= {parent} | {".".join(filter(None, (parent, alias.name))) for alias in node.names}
            elif isinstance(node, ast.Import):
                found |= {
                    a.name.removeprefix("litgpt_vocagnolm.")
                    for a in node.names
                    if a.name.startswith("litgpt_vocagnolm.")
                }
        graph[module_name(path)] = (found & modules) - {module_name(path)}
    return graph


def package_of(module: str) -> str:
    return module.split(".")[0]


def test_every_module_lives_in_a_package_but_the_shared_leaves_and_the_command_line():
    top = {module_name(p) for p in PACKAGE.glob("*.py")} - {""}
    assert top == SHARED | {"cli", "_hook", "__main__"}
    # and the packaged recipes (YAMLs, sbatch scripts in recipes/slurm/), which hold no code
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(PACKAGES) | {"recipes"}


def test_each_package_imports_only_the_packages_it_builds_on():
    found = []
    for module, imports in imports_of_each_module().items():
        if module in SHARED | {"cli", "_hook", "__main__"}:
            continue
        allowed = PACKAGES[package_of(module)] | {package_of(module)} | SHARED
        found += [f"{module} imports {other}" for other in sorted(imports) if package_of(other) not in allowed]
    assert found == []


def test_no_module_imports_one_that_imports_it_back():
    graph = imports_of_each_module()
    # The shared leaves import nothing of the package; the command line imports its commands only when one runs (by
    # name), and the user errors it catches.
    assert graph["errors"] == set() and graph["files"] == set()
    assert graph["cli"] == {"errors"}
    try:
        list(TopologicalSorter(graph).static_order())
    except CycleError as error:
        raise AssertionError(f"import cycle: {' -> '.join(error.args[1])}") from None
    # `plan --measure` drives the recipe's own loop: the measuring imports the recipe, never the other way round.
    assert {"training.recipe", "training.score_teacher"} <= graph["planning.measure"]
    assert "planning.measure" in graph["planning.plan"]
    # The data order reads blocks through the prepared data and builds on nothing above it.
    assert graph["data.order"] == {"data.prepared", "errors"}
    # The demo's parts never import the demo command that runs them.
    assert not any("demo" in graph[m] for m in graph if m.startswith("demo."))


def test_no_module_is_longer_than_600_lines():
    lengths = {module_name(p): len(p.read_text(encoding="utf-8").splitlines()) for p in PACKAGE.rglob("*.py")}
    assert {name: n for name, n in lengths.items() if n > 600} == {}


def test_only_the_method_table_lists_method_names():
    """A tuple, list or set of method names (a group of methods, such as `method in ("ce", "uld")`) appears in
    `methods` alone: everything else reads the table. (The demo's students are runs, named after their method.)"""
    from litgpt_vocagnolm.loss.methods import METHODS

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
        ("training.recipe", "setup"),
        ("demo", "demo"),
        ("data.prepare", "prepare"),
        ("training.score_teacher", "score_teacher"),
        ("evaluation.evaluate", "evaluate"),
        ("alignment.inspection", "inspect"),
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
    for folder in ("docs/", "tests/", "benchmarks/", "data/"):
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
    defines that name itself: a name that moved leaves no reference to where it was. A module is named by its path in
    the package (`training.recipe.fit`) or by its own name alone (`recipe.fit`); a package by its name, and it defines
    what its `__init__` exports (`data.VocAgnoData`)."""
    trees = {module_name(p): ast.parse(p.read_text(encoding="utf-8")) for p in PACKAGE.rglob("*.py")}
    trees.pop("")
    by_own_name = {name.rsplit(".", 1)[-1]: name for name in trees if "." in name}
    assert len(by_own_name) == len([name for name in trees if "." in name]), "two modules share a name"
    found = []
    for path in PACKAGE.rglob("*.py"):
        for span in re.findall(r"`([A-Za-z_][\w.]*\.[A-Za-z_]\w*)(?:\(\))?`", path.read_text(encoding="utf-8")):
            parts = span.removeprefix("litgpt_vocagnolm.").split(".")
            if parts[0] in by_own_name and parts[0] not in trees:
                parts = by_own_name[parts[0]].split(".") + parts[1:]
            cuts = [cut for cut in range(len(parts) - 1, 0, -1) if ".".join(parts[:cut]) in trees]
            if not cuts or parts[-1] in ("py", "md", "csv", "json", "yaml"):  # not a module of the package, or a file
                continue
            module = ".".join(parts[: cuts[0]])
            names = names_defined(trees[module].body)
            if module in PACKAGES:  # a package's `__init__` defines what it exports
                names |= {
                    a.asname or a.name: None
                    for n in trees[module].body
                    if isinstance(n, ast.ImportFrom)
                    for a in n.names
                }
            rest = parts[cuts[0] :]
            node = names.get(rest[0], "missing") if rest[0] in names else "missing"
            if node == "missing" or (
                isinstance(node, ast.ClassDef) and rest[1:] and rest[1] not in names_defined(node.body)
            ):
                found.append(f"{module_name(path)}: `{span}`")
    assert found == []


def test_the_names_the_contract_and_recipes_give_resolve_through_the_packages():
    """docs/design.md's contract names `litgpt_vocagnolm.alignment.align`,
    `litgpt_vocagnolm.loss.teacher_guided_weights` and `litgpt_vocagnolm.data.iter_blocks`; a recipe's YAML names
    `litgpt_vocagnolm.data.VocAgnoData`: the packages export them from the modules that define them."""
    import importlib

    from litgpt_vocagnolm.alignment.lexical import align
    from litgpt_vocagnolm.data.prepared import VocAgnoData, iter_blocks
    from litgpt_vocagnolm.loss.selection import teacher_guided_weights

    design = (PACKAGE.parents[1] / "docs" / "design.md").read_text(encoding="utf-8")
    recipes = "".join(p.read_text() for p in (PACKAGE / "recipes").glob("*.yaml"))
    for path, defined in {
        "litgpt_vocagnolm.alignment.align": align,
        "litgpt_vocagnolm.loss.teacher_guided_weights": teacher_guided_weights,
        "litgpt_vocagnolm.data.iter_blocks": iter_blocks,
        "litgpt_vocagnolm.data.VocAgnoData": VocAgnoData,
    }.items():
        assert path in design or f"class_path: {path}" in recipes, path
        module, name = path.rsplit(".", 1)
        assert getattr(importlib.import_module(module), name) is defined, path
