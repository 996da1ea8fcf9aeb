"""The repository explains itself: nothing points outside it for its design, and every link and path
the documentation gives leads to something that exists (docs/architecture.md, docs/decisions/).

Pure file reads: no database, no processes.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Spelled in two parts so that this file does not mention them itself.
OUTSIDE_POINTERS = ("DESIGN" + ".md", "../" + "shared")
SKIPPED_DIRS = {".git", ".venv", "var", "node_modules", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache"}

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
# A repository path in a code span of the documentation: directories, then a file of a kind the
# repository holds (`workflows/lease.py`, `scripts/run.sh`). `<app>/workflows.py` is a pattern, not a path.
CODE_PATH = re.compile(r"^(?:[\w.-]+/)+[\w.-]+\.(?:py|md|sh|toml|html|txt|cfg|ini)$")
# A pointer to the documentation from anywhere (a comment, a docstring, the README): a file under
# docs/, or docs/ itself, with an optional #section.
DOCS_POINTER = re.compile(r"(?<![\w/.-])(docs/(?:[\w.-]+/)*(?:[\w.-]+\.md)?)(?:#([\w-]+))?")


def repository_files() -> list[Path]:
    """The files git tracks or would track (untracked but not ignored), or every file outside the
    usual generated folders when this is not a git checkout."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout.decode()
        paths = [ROOT / name for name in listed.split("\0") if name]
    except (OSError, subprocess.CalledProcessError):
        paths = [p for p in ROOT.rglob("*") if not SKIPPED_DIRS.intersection(p.relative_to(ROOT).parts)]
    return sorted(p for p in paths if p.is_file())


def text_of(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None  # a binary file


def documentation() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text, not its target
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    found = set()
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if match is None:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def broken(target: Path, anchor: str | None) -> str | None:
    """Why a link to ``target`` (and ``#anchor``) leads nowhere, or None."""
    if not target.exists():
        return f"{target.relative_to(ROOT) if target.is_relative_to(ROOT) else target} does not exist"
    if anchor and target.suffix == ".md" and anchor not in anchors(target):
        return f"{target.relative_to(ROOT)} has no section #{anchor}"
    return None


def test_no_file_points_outside_the_repository_for_its_design() -> None:
    offenders = []
    for path in repository_files():
        text = text_of(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            if any(pointer in line for pointer in OUTSIDE_POINTERS):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == [], "point to docs/ instead:\n" + "\n".join(offenders)


@pytest.mark.parametrize("path", documentation(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_in_the_documentation_leads_somewhere(path: Path) -> None:
    problems = []
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        line = CODE_SPAN.sub("", line)
        targets = [m.group(1) for m in INLINE_LINK.finditer(line)]
        if (reference := REFERENCE_LINK.match(line)) is not None:
            targets.append(reference.group(1))
        for target in targets:
            if SCHEME.match(target):
                continue  # http:, https:, mailto: ...
            file_part, _, anchor = target.partition("#")
            if not file_part:
                resolved = path
            elif file_part.startswith("/"):
                resolved = ROOT / file_part.lstrip("/")
            else:
                resolved = (path.parent / file_part).resolve()
            if (why := broken(resolved, anchor or None)) is not None:
                problems.append(f"{path.relative_to(ROOT)}:{number}: ({target}): {why}")
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize("path", documentation(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_repository_path_the_documentation_names_exists(path: Path) -> None:
    problems = []
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        for match in CODE_SPAN.finditer(line):
            name = match.group(2).strip()
            if CODE_PATH.match(name) and not (ROOT / name).exists():
                problems.append(f"{path.relative_to(ROOT)}:{number}: `{name}` does not exist")
    assert problems == [], "\n".join(problems)


def test_every_pointer_to_the_documentation_leads_somewhere() -> None:
    """Comments, docstrings and pages that send a reader to docs/ (with a section) stay right when the
    documentation moves."""
    problems = []
    for path in repository_files():
        text = text_of(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            for match in DOCS_POINTER.finditer(line):
                if (why := broken(ROOT / match.group(1), match.group(2))) is not None:
                    problems.append(f"{path.relative_to(ROOT)}:{number}: {match.group(0)}: {why}")
    assert problems == [], "\n".join(problems)


def test_the_documentation_is_there() -> None:
    assert (ROOT / "docs" / "architecture.md").is_file()
    records = sorted((ROOT / "docs" / "decisions").glob("[0-9][0-9][0-9][0-9]-*.md"))
    assert records, "no decision records in docs/decisions/"
    numbers = [record.name[:4] for record in records]
    assert len(set(numbers)) == len(numbers), f"two records share a number: {numbers}"
    index = (ROOT / "docs" / "decisions" / "README.md").read_text(encoding="utf-8")
    missing = [record.name for record in records if f"({record.name})" not in index]
    assert missing == [], f"not listed in docs/decisions/README.md: {missing}"
