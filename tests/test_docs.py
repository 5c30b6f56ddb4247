"""The docs against the code: a doc that drifts from the code fails here.

- Every command line of a shell block in README.md and docs/ that starts with `vocagnolm` or `litgpt pretrain --recipe
  vocagnolm` is parsed by the parser the command builds, as typed (its shell variables, where the block sets them,
  else a placeholder path); nothing runs past the parse.
- Every backticked dotted name of the package resolves (`test_layout.unresolved`), and every file the docs name exists.
  The signatures they give are the code's; docs/README.md indexes every page.
- The README's recipe table says what each recipe's YAML holds.
- The README stays a guide: under 3,500 words, no paragraph over 10 lines, no sentence over 60 words, `make demo` and
  `make test` its first two commands, the paper's run within its first 150 lines.
- The wheel and the source distribution build, with the README as their long description, the LICENSE file and
  classifiers that exist.
- Every program the README's shell blocks call (the system's aside) is a console script of this environment, and
  starts; `make test-install` checks the same of `pip install` of the wheel into a fresh environment.
"""

import re
import shlex
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser as EmailParser
from pathlib import Path

import pytest
import yaml
from conftest import BIN, ROOT
from test_layout import DOTTED, unresolved

from litgpt_vocagnolm import cli

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHELL = ("bash", "sh", "shell")  # a fenced block in one of these holds commands; in another, only a line after `$ `
PLACEHOLDER = "PLACEHOLDER"  # a shell variable the block does not set: a path the parser does not open
README_LIMITS = {"words": 3500, "paragraph lines": 10, "sentence words": 60, "paper's run by line": 150}


def fenced_blocks(text: str) -> list[tuple[str, int, list[str]]]:
    """Each fenced code block of markdown `text`: its language, the line its first line is on, its lines."""
    blocks, lines, language, start = [], None, "", 0
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            if lines is None:
                lines, language, start = [], line.strip().removeprefix("```").strip(), number + 1
            else:
                blocks.append((language, start, lines))
                lines = None
        elif lines is not None:
            lines.append(line)
    return blocks


def shell_lines(lines: list[str], start: int, shell: bool) -> list[tuple[int, str]]:
    """The block's command lines, each with the line it starts on: continuations joined. In a `shell` block every line
    is one; in another (a transcript) only a line after a prompt, `$ `."""
    found, pending, at = [], "", start
    for number, line in enumerate(lines, start):
        if not pending:
            at = number
            if not shell and not line.startswith("$ "):
                continue
            line = line.removeprefix("$ ")
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        found.append((at, pending + line))
        pending = ""
    return found


def commands(doc: Path) -> list[tuple[str, list[str]]]:
    """The `vocagnolm` and `litgpt pretrain --recipe vocagnolm` command lines of `doc`'s shell blocks, each as
    ("doc:line", its words), with the shell variables the block sets before them substituted."""
    found = []
    for language, start, lines in fenced_blocks(doc.read_text(encoding="utf-8")):
        variables = {}
        for number, line in shell_lines(lines, start, language in SHELL):
            if re.fullmatch(r"([A-Z_]\w*=\S+\s*)+", line.strip()):  # S=... T=...
                variables |= dict(word.split("=", 1) for word in line.split())
            elif line.startswith(("vocagnolm ", "litgpt pretrain --recipe vocagnolm")):
                expanded = re.sub(r"\$\{?([A-Za-z_]\w*)\}?", lambda m: variables.get(m[1], PLACEHOLDER), line)
                found.append((f"{doc.relative_to(ROOT)}:{number}", shlex.split(expanded, comments=True)))
    return found


COMMANDS = [command for doc in DOCS for command in commands(doc)]


class Parsed(Exception):
    """Raised once the command's own parser has parsed its whole command line, before the command runs."""


@pytest.fixture
def parse_only(monkeypatch):
    """jsonargparse's `parse_args` stops the command once the outermost parse succeeds (the command's parser may
    parse inside a parse, as `plan` does to build its parser from the recipe's)."""
    from jsonargparse import ArgumentParser

    parse_args, depth = ArgumentParser.parse_args, [0]

    def parse_then_stop(self, *args, **kwargs):
        depth[0] += 1
        try:
            parse_args(self, *args, **kwargs)
        finally:
            depth[0] -= 1
        if depth[0] == 0:
            raise Parsed

    monkeypatch.setattr(ArgumentParser, "parse_args", parse_then_stop)


@pytest.mark.parametrize("where, words", COMMANDS, ids=[where for where, _ in COMMANDS])
def test_each_command_the_docs_show_is_parsed_by_its_own_parser(
    where, words, parse_only, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)  # where a command that got past its parse would write, and no file of the clone is
    if words[0] == "vocagnolm":
        run = lambda: cli.main(words[1:])  # noqa: E731
    else:  # `litgpt pretrain --recipe vocagnolm ...`, as the .pth hook hands it on
        monkeypatch.setattr(sys, "argv", words)
        run = lambda: cli.litgpt_main(lambda: pytest.fail("LitGPT's own command ran"))  # noqa: E731
    try:
        run()
    except Parsed:
        return
    except SystemExit as stop:  # `--help` exits 0 once printed; a refusal exits otherwise
        assert stop.code in (0, None), f"{where}: {shlex.join(words)}\n{capsys.readouterr().err[-3000:]}"
        return
    pytest.fail(f"{where}: {shlex.join(words)} was never parsed")


# What the README's shell blocks call that the install does not bring: the shell's own, the system's, any Python's pip.
SYSTEM = {"bash", "cd", "make", "pip", "source"}


def programs(doc: Path) -> set[str]:
    """The programs `doc`'s shell blocks call: each command line's first word after its variable assignments."""
    called = set()
    for language, start, lines in fenced_blocks(doc.read_text(encoding="utf-8")):
        for _, line in shell_lines(lines, start, language in SHELL):
            words = [w for w in shlex.split(line, comments=True) if not re.fullmatch(r"[A-Za-z_]\w*=.*", w)]
            called |= set(words[:1])
    return called


def test_each_program_the_readme_calls_is_a_console_script_here_and_starts(tmp_path):
    """This environment's console scripts (the editable install of this checkout): each program the README calls,
    the system's aside, and `--help` runs (`hf` once failed at start: No module named 'click')."""
    called = programs(ROOT / "README.md")
    assert {"hf", "litgpt", "vocagnolm"} <= called - SYSTEM
    for program in sorted(called - SYSTEM):
        out = subprocess.run([BIN / program, "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, f"{program}: {out.stderr[-2000:]}"


@pytest.mark.install
def test_each_program_the_readme_calls_is_installed_and_starts(installed, tmp_path):
    """The README's install (`pip install` of the wheel, beside a torch) brings every program its commands call,
    the system's aside, and each starts: `hf` once failed at start (No module named 'click')."""
    called = programs(ROOT / "README.md")
    assert {"hf", "litgpt", "vocagnolm"} <= called - SYSTEM
    for program in sorted(called - SYSTEM):
        out = subprocess.run([installed / "bin" / program, "--help"], cwd=tmp_path, capture_output=True, text=True)
        assert out.returncode == 0, f"{program}: {out.stderr[-2000:]}"


def test_every_doc_shows_commands_that_are_checked():
    """The collection above finds the commands: the README's paper run among them, with its variables set."""
    readme = {" ".join(words) for where, words in COMMANDS if where.startswith("README.md")}
    assert any(line.startswith("vocagnolm prepare --student checkpoints/TinyLlama/") for line in readme)
    assert any(line.startswith("litgpt pretrain --recipe vocagnolm --config") for line in readme)


def prose(text: str) -> str:
    """Markdown `text` without its fenced and indented code blocks."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    return re.sub(r"^    .*$", "", text, flags=re.MULTILINE)


def test_every_name_of_the_package_the_docs_give_resolves():
    found = [
        f"{doc.relative_to(ROOT)}: `{span}`" for doc in DOCS for span in unresolved(DOTTED.findall(doc.read_text()))
    ]
    assert found == []


def signatures(text: str) -> list[tuple[str, list[str], bool]]:
    """The backticked signatures of package functions in `text`, `litgpt_vocagnolm.x.f(a, b=1, *, c=None) -> T`: each
    function's dotted name, the parameters it names, and whether it is whole (it gives a return type: then it names
    every parameter; a call, `f(a)`, names those without a default at least)."""
    found = []
    for match in re.finditer(r"`(litgpt_vocagnolm(?:\.\w+)+)\(", text):
        depth, end = 1, match.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            end += 1
        inside = re.sub(r"\([^()]*\)", "", text[match.end() : end - 1])  # a default's own call: SelectionArgs()
        names = [part.split("=")[0].strip() for part in inside.split(",")]
        whole = text[end : text.index("`", end)].strip().startswith("->")
        found.append((match[1], [name for name in names if name not in ("*", "/", "")], whole))
    return found


def test_the_signatures_the_docs_give_are_the_codes():
    import importlib
    import inspect

    wrong = []
    for doc in DOCS:
        for path, named, whole in signatures(doc.read_text(encoding="utf-8")):
            module, name = path.rsplit(".", 1)
            parameters = inspect.signature(getattr(importlib.import_module(module), name)).parameters
            required = [p for p, v in parameters.items() if v.default is inspect.Parameter.empty]
            expected = list(parameters) if whole else [p for p in parameters if p in named or p in required]
            wrong += [] if named == expected else [f"{doc.relative_to(ROOT)}: {path}({', '.join(named)})"]
    assert wrong == []


def named_files(doc: Path) -> list[str]:
    """The repository's files `doc` names: relative links, backticked paths under the repository's folders, bare
    `name.py` modules, and the paths a command line of its shell blocks gives under tests/, src/, benchmarks/, docs/
    or a folder shipped in data/."""
    text = doc.read_text(encoding="utf-8")
    links = [
        str((doc.parent / link).resolve().relative_to(ROOT))
        for link in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
        if "://" not in link
    ]
    spans = re.findall(r"`([\w./-]+)`", prose(text))
    words = [word for _, command in commands(doc) for word in command]
    shipped = [p.name for p in (ROOT / "data").iterdir() if p.is_dir()]
    folders = ("tests/", "src/", "benchmarks/", "docs/", *(f"data/{name}" for name in shipped))
    paths = [span.rstrip("/") for span in spans + words if span.startswith(folders)]
    modules = [span for span in spans if re.fullmatch(r"\w+\.py", span)]
    return links + paths + [f"**/{module}" for module in modules]


def test_every_file_the_docs_name_exists():
    missing = []
    for doc in DOCS:
        for name in named_files(doc):
            exists = any(ROOT.glob(name)) if name.startswith("**/") else (ROOT / name).exists()
            missing += [] if exists else [f"{doc.relative_to(ROOT)}: {name}"]
    assert missing == []


def test_the_index_lists_every_page_of_docs():
    index = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    pages = {page.name for page in (ROOT / "docs").glob("*.md")} - {"README.md"}
    assert pages == set(re.findall(r"\]\(([\w-]+\.md)\)", index))


def recipe_yaml(name: str) -> Path:
    """A recipe's YAML by its name: where the package keeps them, or before that, at the repository's top."""
    for folder in (ROOT / "src" / "litgpt_vocagnolm" / "recipes", ROOT / "recipes"):
        if (folder / f"{name}.yaml").is_file():
            return folder / f"{name}.yaml"
    raise AssertionError(f"no recipe named {name}")


def test_the_readme_recipe_table_says_what_each_recipe_holds():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme[readme.index("| recipe (`--config`)") :].split("\n\n")[0].splitlines()[2:]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table]
    assert len(rows) == len(list(recipe_yaml("demo-cpu").parent.glob("*.yaml")))  # every recipe, once
    for name, _, checkpoint, data in rows:
        config = yaml.safe_load(recipe_yaml(name.strip("`")).read_text())
        assert config["data"]["init_args"]["path"] == data.split("`")[1], name
        teacher = config.get("teacher", {}).get("checkpoint_dir")
        if teacher is None:
            assert config["guidance"]["method"] == "ce" and checkpoint.startswith("none"), name
        else:  # `litgpt download ORG/NAME`, or ORG/NAME to convert: checkpoints/ORG/NAME
            repo = re.search(r"([\w.-]+/[\w.-]+)`", checkpoint)[1]
            assert teacher == f"checkpoints/{repo}", name


def test_the_readme_lists_every_guidance_method():
    from litgpt_vocagnolm.loss.methods import METHODS

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Guidance methods and options") :].split("\n## ")[0]
    listed = {name for item in re.findall(r"^- (.+?):", section, re.MULTILINE) for name in re.findall(r"`(\w+)`", item)}
    assert listed == set(METHODS)


def paragraphs(text: str) -> list[list[str]]:
    """The prose paragraphs of markdown `text` (a list item is one), as lines: no code, table or heading."""
    found, current = [], []
    for line in prose(text).splitlines():
        starts_item = re.match(r"(- |\d+\. )", line)
        if not line.strip() or line.startswith(("|", "#", "![")) or starts_item:
            found += [current] if current else []
            current = [line] if starts_item else []
        else:
            current.append(line)
    return found + ([current] if current else [])


def sentences(paragraph: list[str]) -> list[str]:
    """A paragraph's sentences, its links' targets dropped: a full stop, ! or ? and a space end one."""
    text = re.sub(r"\]\([^)]*\)", "]", " ".join(line.strip() for line in paragraph))
    return re.split(r"(?<=[.!?])\s+(?=[A-Z`(\[*\"])", text)


def test_sentences_and_paragraphs_are_measured_as_a_reader_counts_them():
    page = "Intro one. Two words here.\n\n- an item\n  continued.\n\n```bash\nnot prose\n```\n\n| a | table |\n"
    assert [len(p) for p in paragraphs(page)] == [1, 2]
    assert sentences(["See [the docs](docs/x.md). Then `run` it."]) == ["See [the docs].", "Then `run` it."]


def test_the_readme_is_a_guide_within_its_limits():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = readme.splitlines()
    assert len(readme.split()) <= README_LIMITS["words"]
    long = [p[0] for p in paragraphs(readme) if len(p) > README_LIMITS["paragraph lines"]]
    assert long == []
    wordy = [s for p in paragraphs(readme) for s in sentences(p) if len(s.split()) > README_LIMITS["sentence words"]]
    assert wordy == []
    makes = [line.split("#")[0].split() for line in lines if line.startswith("make ")]
    assert makes[:2] == [["make", "demo"], ["make", "test"]]
    start = lines.index("## The paper's run")
    steps = [i for i, line in enumerate(lines) if re.match(r"# \d\) ", line) and i > start]
    assert [lines[i][2] for i in steps] == [str(n) for n in range(1, len(steps) + 1)] and len(steps) >= 5
    last_command = next(i for i in range(steps[-1], len(lines)) if lines[i].startswith("```"))
    assert last_command < README_LIMITS["paper's run by line"]


def test_the_wheel_and_sdist_carry_the_readme_license_and_metadata(dist):
    import trove_classifiers

    (wheel,) = dist.glob("*.whl")
    (sdist,) = dist.glob("*.tar.gz")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    with tarfile.open(sdist) as archive:
        members = {Path(m.name).relative_to(Path(m.name).parts[0]).as_posix() for m in archive.getmembers()}
        pkg_info = archive.extractfile(next(m for m in archive.getmembers() if m.name.endswith("/PKG-INFO"))).read()
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)
    assert {"README.md", "LICENSE", "CITATION.cff", "pyproject.toml"} <= members
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for text in (metadata, pkg_info.decode()):
        message = EmailParser().parsestr(text)
        assert message["Description-Content-Type"] == "text/markdown"
        assert message.get_payload().strip() == readme.strip()  # the long description PyPI renders
        assert message["License"] == "Apache-2.0"
        assert [c for c in message.get_all("Classifier") if c not in trove_classifiers.classifiers] == []
        assert "License :: OSI Approved :: Apache Software License" in message.get_all("Classifier")
        assert any(url.startswith("Paper, https://arxiv.org/abs/2503.19123") for url in message.get_all("Project-URL"))
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text


def test_docs_testing_gives_the_makefiles_budgets_and_make_test_holds_each_feature():
    """docs/testing.md's table of tiers gives each tier the budget the Makefile prints beside its time (`$(TOOK) NAME
    SECONDS`), and each test its feature table names is one `make test` runs (none of the other tiers' markers)."""
    text = (ROOT / "docs" / "testing.md").read_text()
    budgets = re.findall(r"\$\(TOOK\) (\S+) (\d+)", (ROOT / "Makefile").read_text())
    assert {name for name, _ in budgets} >= {"test", "test-long", "test-install", "test-slurm", "test-wheels"}
    for name, seconds in budgets:
        assert re.search(rf"^\| `make {name}` \|.*\| {int(seconds) // 60} min \|", text, re.M), name
    tiers = {"slurm", "gpu", "wheels", "install", "long"}
    features = text[text.index("## What `make test` covers") :].split("\n## ")[0]
    named = re.findall(r"`(test_\w+)\.py::(test_\w+)`", features)
    assert len(named) >= 30
    for module_name, function in named:
        module = __import__(module_name)
        marks = [getattr(module, "pytestmark", []), getattr(getattr(module, function), "pytestmark", [])]
        marks = [mark for held in marks for mark in (held if isinstance(held, list) else [held])]
        assert not {mark.name for mark in marks} & tiers, f"{module_name}::{function} is not in make test"
