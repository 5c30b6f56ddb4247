"""What the program prints and its docstrings say points at what exists: every document (README, docs/*.md) and
section a string of src/ names, and every command it names in backticks (`vocagnolm X`, `litgpt X`, `make X`)."""

import ast
import re
from pathlib import Path

from conftest import ROOT

from litgpt_vocagnolm.cli import COMMANDS

SOURCES = sorted((ROOT / "src").rglob("*.py"))
DOCUMENT = re.compile(r"\b(README(?:\.md)?|docs/[\w-]+\.md)\b")
SECTION = re.compile(r"\b(README(?:\.md)?|docs/[\w-]+\.md),?\s+\"([^\"]+)\"")  # README, "Title" / docs/x.md "Title"
COMMAND = re.compile(r"`(vocagnolm|litgpt|make) ([\w-]+)")


def strings(path: Path) -> list[str]:
    """Each string literal of a module, implicit concatenations joined as Python joins them; an f-string's fields as
    `{}`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.append(node.value)
        elif isinstance(node, ast.JoinedStr):
            found.append("".join(part.value if isinstance(part, ast.Constant) else "{}" for part in node.values))
    return found


def document(name: str) -> Path:
    return ROOT / ("README.md" if name.startswith("README") else name)


def has_section(path: Path, title: str) -> bool:
    """Whether markdown `path` has a heading `title`, or one that begins `title:` (a title and its subtitle)."""
    headings = [line.lstrip("#").strip() for line in path.read_text(encoding="utf-8").splitlines() if line[:1] == "#"]
    return any(heading == title or heading.startswith(f"{title}:") for heading in headings)


def makefile_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(encoding="utf-8"), flags=re.MULTILINE))


def litgpt_commands() -> set[str]:
    from litgpt.__main__ import PARSER_DATA

    return set(PARSER_DATA)


def named(pattern: re.Pattern) -> list[tuple[str, tuple[str, ...]]]:
    """Each match of `pattern` in the strings of src/: (module, the match's groups, whitespace made one space)."""
    return [
        (str(path.relative_to(ROOT)), tuple(" ".join(group.split()) for group in match.groups()))
        for path in SOURCES
        for text in strings(path)
        for match in pattern.finditer(text)
    ]


def test_the_scan_finds_the_references_it_checks():
    """Known ones: the sections of docs/design.md the algorithms cite, the page plan --measure cites; a section the
    README no longer has (plan once cited it) is told apart."""
    assert ("src/litgpt_vocagnolm/loss/selection.py", ("docs/design.md", "Teacher-guided loss")) in named(SECTION)
    assert ("src/litgpt_vocagnolm/planning/measure.py", ("docs/performance.md",)) in named(DOCUMENT)
    assert ("src/litgpt_vocagnolm/cli.py", ("litgpt", "pretrain")) in named(COMMAND)
    assert has_section(ROOT / "docs" / "performance.md", "At the device's pace")
    assert not has_section(ROOT / "README.md", "At the device's pace")


def test_every_document_and_section_named_exists():
    missing = [f"{module}: {name}" for module, (name,) in named(DOCUMENT) if not document(name).is_file()]
    missing += [
        f'{module}: {name}, "{title}"'
        for module, (name, title) in named(SECTION)
        if not (document(name).is_file() and has_section(document(name), title))
    ]
    assert missing == []


def test_every_command_named_exists():
    known = {"vocagnolm": set(COMMANDS), "litgpt": litgpt_commands(), "make": makefile_targets()}
    missing = [
        f"{module}: `{tool} {name}`"
        for module, (tool, name) in named(COMMAND)
        if not name.startswith("-") and name not in known[tool]
    ]
    assert missing == []
