"""The package's sub-packages and modules import one another one way only (docs/layout.md): each package imports
only the packages its row of the layout builds on, and no module imports one that imports it back."""

import ast
import re
from functools import cache
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "litgpt_vocagnolm"

# The shared leaves every package may import: user errors, file hashes, writes and the folder lock.
SHARED = {"errors", "files"}
# Each sub-package (a job, a row of docs/layout.md) and the packages its modules may import besides its own and
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
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(PACKAGES)


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
    # The shared leaves import nothing of the package but the user errors (files: its lock's refusal); the command line
    # imports its commands only when one runs (by name), and the user errors it catches.
    assert graph["errors"] == set() and graph["files"] <= {"errors"}
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
    # The demo's parts never import the demo command that runs them; its package names them and imports none.
    assert not any("demo.pipeline" in graph[m] for m in graph if m.startswith("demo.") and m != "demo.pipeline")
    assert graph["demo"] == set()


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
        ("demo.pipeline", "demo"),
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


def body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """A function's body in lines, its docstring aside: from its first statement to the end of its last (comments
    and blank lines between them count; nested functions count in the function that holds them, and on their own)."""
    body = node.body[1:] if ast.get_docstring(node) is not None else node.body
    return body[-1].end_lineno - body[0].lineno + 1 if body else 0


def test_no_function_body_is_longer_than_60_lines():
    """A function, its docstring aside, fits a screen (nanoGPT's longest is 55 lines): a command reads as its stages,
    each a function named for what it does, as LitGPT's pretrain reads as setup -> main -> fit -> validate."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and body_lines(node) > 60:
                found.append(f"{module_name(path)}.{node.name}: {body_lines(node)} lines")
    assert found == []


def shown_signatures(text: str) -> list[tuple[str, str]]:
    """Each `name(parameters)` a Markdown text shows in a code span (or a line of a fenced block), its return
    (` -> ...`) aside: (name, parameters), the name as written (`litgpt_vocagnolm.loss.teacher_guided_weights`,
    `vocab_overlap`)."""
    fenced = re.findall(r"```[^\n]*\n(.*?)```", text, flags=re.DOTALL)
    spans = re.findall(r"`([^`]+)`", re.sub(r"```.*?```", "", text, flags=re.DOTALL))
    spans += [line for block in fenced for line in block.splitlines()]
    found = []
    for span in spans:
        signature = " ".join(span.split()).split(" -> ")[0]
        match = re.fullmatch(r"([A-Za-z_][\w.]*)\((.*)\)", signature)
        if match:
            found.append((match.group(1), match.group(2)))
    return found


def test_the_signatures_docs_design_shows_are_the_functions_own():
    """docs/design.md's signatures are the code's: every `name(parameters)` it shows that names a function or class
    of the package lists that function's parameters, in order, positional and keyword-only as the function takes
    them, with the same defaults (annotations and the return are the code's to give). A name is the package's when
    it is a dotted path into it, or the name of one function or class defined at the top of one of its modules."""
    import importlib
    import inspect

    design = (PACKAGE.parents[1] / "docs" / "design.md").read_text(encoding="utf-8")
    defined: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defined.setdefault(node.name, []).append(module_name(path))
    checked, found = set(), []
    for name, parameters in shown_signatures(design):
        if name.startswith("litgpt_vocagnolm."):
            module, _, attribute = name.rpartition(".")
        elif name in defined:
            assert len(defined[name]) == 1, f"docs/design.md: {name} is defined in {defined[name]}: give its path"
            module, attribute = f"litgpt_vocagnolm.{defined[name][0]}", name
        else:  # not the package's (`max(...)`, `ceil(...)`)
            continue
        function = getattr(importlib.import_module(module), attribute)
        namespace = vars(importlib.import_module(function.__module__))  # where its defaults' names resolve
        shown = ast.parse(f"def shown({parameters}): pass").body[0].args
        defaults = [None] * (len(shown.posonlyargs) + len(shown.args) - len(shown.defaults)) + shown.defaults
        doc = [
            (a.arg, kind, default if default is None else eval(ast.unparse(default), namespace))
            for kind, args, kind_defaults in (
                ("POSITIONAL_ONLY", shown.posonlyargs, defaults[: len(shown.posonlyargs)]),
                ("POSITIONAL_OR_KEYWORD", shown.args, defaults[len(shown.posonlyargs) :]),
                ("KEYWORD_ONLY", shown.kwonlyargs, shown.kw_defaults),
            )
            for a, default in zip(args, kind_defaults)
        ]
        code = [
            (p.name, p.kind.name, None if p.default is inspect.Parameter.empty else p.default)
            for p in inspect.signature(function).parameters.values()
        ]
        if doc != code:
            found.append(f"{name}({parameters}) is {attribute}{inspect.signature(function)}")
        checked.add(attribute)
    assert found == []
    assert {"align", "teacher_guided_weights", "iter_blocks", "SelectionArgs"} <= checked  # the contract's


def test_nothing_cites_a_file_outside_the_repository():
    """Design notes the code relies on are in docs/design.md; the code cites that, nothing outside the repository."""
    found = [module_name(p) for p in PACKAGE.rglob("*.py") if "DESIGN.md" in p.read_text(encoding="utf-8")]
    assert found == []
    design = (PACKAGE.parents[1] / "docs" / "design.md").read_text(encoding="utf-8")
    for section in ("Alignment", "Teacher-guided loss", "Prepared data"):  # the sections docstrings cite by name
        assert f"## {section}\n" in design


def test_the_layout_page_lists_every_module_and_data_folder():
    layout = (PACKAGE.parents[1] / "docs" / "layout.md").read_text(encoding="utf-8")
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


def listed_in_all(tree: ast.Module) -> list[str]:
    """The names a module's `__all__` lists: those a package hands on when first asked for (`data`)."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(target, "id", "") == "__all__" for target in node.targets):
            return list(ast.literal_eval(node.value))
    return []


# A backticked dotted name, as code and docs write one: `module.name`, `module.Class.attribute`, `function()`.
DOTTED = re.compile(r"`([A-Za-z_][\w.]*\.[A-Za-z_]\w*)(?:\(\))?`")


@cache
def package_trees() -> tuple[dict[str, ast.Module], dict[str, str]]:
    """Each module's syntax tree by its name in the package, and each module's full name by its own name alone."""
    trees = {module_name(p): ast.parse(p.read_text(encoding="utf-8")) for p in PACKAGE.rglob("*.py")}
    trees.pop("")
    by_own_name = {name.rsplit(".", 1)[-1]: name for name in trees if "." in name}
    assert len(by_own_name) == len([name for name in trees if "." in name]), "two modules share a name"
    return trees, by_own_name


def unresolved(spans: list[str]) -> list[str]:
    """The dotted names among `spans` that name a package module which does not define that name itself. A module is
    named by its path in the package (`training.recipe.fit`) or by its own name alone (`recipe.fit`); a package by its
    name, and it defines what its `__init__` exports (`data.VocAgnoData`). A name that starts `litgpt_vocagnolm.` must
    resolve; any other that names no module of the package is not the package's, and is left alone."""
    trees, by_own_name = package_trees()
    found = []
    for span in spans:
        parts = span.removeprefix("litgpt_vocagnolm.").split(".")
        if parts[0] in by_own_name and parts[0] not in trees:
            parts = by_own_name[parts[0]].split(".") + parts[1:]
        cuts = [cut for cut in range(len(parts) - 1, 0, -1) if ".".join(parts[:cut]) in trees]
        if parts[-1] in ("py", "md", "csv", "json", "yaml"):  # a file
            continue
        if not cuts:  # not a module of the package, unless it says so
            if span.startswith("litgpt_vocagnolm.") and ".".join(parts) not in trees:
                found.append(span)
            continue
        module = ".".join(parts[: cuts[0]])
        names = names_defined(trees[module].body)
        if module in PACKAGES:  # a package's `__init__` defines what it exports: what it imports or lists in __all__
            names |= {
                a.asname or a.name: None for n in trees[module].body if isinstance(n, ast.ImportFrom) for a in n.names
            }
            names |= {name: None for name in listed_in_all(trees[module])}
        rest = parts[cuts[0] :]
        node = names.get(rest[0], "missing") if rest[0] in names else "missing"
        if node == "missing" or (
            isinstance(node, ast.ClassDef) and rest[1:] and rest[1] not in names_defined(node.body)
        ):
            found.append(span)
    return found


def test_every_dotted_reference_in_the_package_points_where_the_name_lives():
    """A backticked `module.name` in a docstring or comment names a package module that defines that name itself
    (`unresolved`): a name that moved leaves no reference to where it was."""
    found = [
        f"{module_name(path)}: `{span}`"
        for path in PACKAGE.rglob("*.py")
        for span in unresolved(DOTTED.findall(path.read_text(encoding="utf-8")))
    ]
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
    recipes = "".join(p.read_text() for p in (PACKAGE.parents[1] / "recipes").glob("*.yaml"))
    for path, defined in {
        "litgpt_vocagnolm.alignment.align": align,
        "litgpt_vocagnolm.loss.teacher_guided_weights": teacher_guided_weights,
        "litgpt_vocagnolm.data.iter_blocks": iter_blocks,
        "litgpt_vocagnolm.data.VocAgnoData": VocAgnoData,
    }.items():
        assert path in design or f"class_path: {path}" in recipes, path
        module, name = path.rsplit(".", 1)
        assert getattr(importlib.import_module(module), name) is defined, path
