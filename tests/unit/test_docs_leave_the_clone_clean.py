"""The pages a reader follows in the clone leave no untracked file there (issue 42, item 6).

A reader runs the pages' commands from the clone's root (the tutorial starts with ``source .venv/bin/activate``).
Whatever a page has them write there must be git-ignored, so that ``git status`` stays clean: the files a page
gives to save (a code block with ``title="PATH"``), and what its ``console`` commands write (``globald dev``'s
directory, ``mkdir``, ``cp``, redirections, ``$PWD/DIR`` handed to a tool). This test reads the commands the way a
shell would and asks git whether it ignores each path.
"""

from __future__ import annotations

import re
import shlex
import subprocess

import pytest

from tests.harness import REPO

DOCS = REPO / "docs"
# What the pages wrote when this test was written: the extraction below must keep finding them.
KNOWN = {"globald-dev/", "typed-dev/", "reload-dev/", "spark-run/", "produce.py", "customers-avro.toml",
         "connect_join.py"}


def _blocks(text: str) -> list[tuple[str, str | None, str]]:
    """Each fenced block of a page: its language, its title (a file to save) and its body."""
    return [(kind, title or None, body)
            for kind, title, body in re.findall(r'^```(\w+)(?: title="([^"]+)")?\n(.*?)^```$', text,
                                                flags=re.S | re.M)]


def _written_by(command: str) -> list[str]:
    """The relative paths one console command writes, as a shell runs it: a directory ends with '/'."""
    words = shlex.split(command, comments=True)
    out: list[str] = []
    for i, word in enumerate(words):
        after = words[i + 1] if i + 1 < len(words) else ""
        if word in (">", ">>", "2>", "&>"):  # a redirection: its target
            out.append(after)
        elif re.fullmatch(r"(\d|&)?>>?\S+", word):  # written without a space
            out.append(re.sub(r"^(\d|&)?>>?", "", word))
        elif word in ("--dir", "--output", "--out", "-o") and after:
            out.append(after.rstrip("/") + "/" if word == "--dir" else after)
        out += [m.rstrip("/") + "/" for m in re.findall(r"\$PWD/([\w.-]+)", word)]
    if words[:2] == ["globald", "dev"] and "--dir" not in words:
        out.append("globald-dev/")  # its default directory
    if words[:1] == ["mkdir"]:
        out += [w.rstrip("/") + "/" for w in words[1:] if not w.startswith("-")]
    if words[:1] == ["cp"]:
        out.append(words[-1])
    # /dev/null, /tmp...: not the clone; &1: a descriptor, not a file
    return [p for p in out if p and not p.startswith(("/", "$", "~", "&"))]


def written_paths() -> dict[str, set[str]]:
    """Every relative path a page has the reader write, with the pages that do."""
    found: dict[str, set[str]] = {}
    for page in sorted(DOCS.rglob("*.md")):
        for kind, title, body in _blocks(page.read_text()):
            paths = [title] if title else []
            if kind == "console":
                for line in body.splitlines():
                    if line.startswith("$ "):
                        paths += _written_by(line[2:])
            for p in paths:
                found.setdefault(p, set()).add(str(page.relative_to(REPO)))
    return found


def test_the_extraction_finds_what_the_pages_write() -> None:
    found = written_paths()
    # A path under a directory a page also writes is covered by it; the rest are what KNOWN lists.
    tops = {p.split("/", 1)[0] + ("/" if "/" in p else "") for p in found}
    assert not KNOWN - tops, sorted(KNOWN - tops)


def test_every_path_a_page_writes_in_the_clone_is_git_ignored() -> None:
    inside = subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], cwd=REPO, capture_output=True, text=True)
    if inside.returncode != 0 or inside.stdout.strip() != "true":
        pytest.skip("not a git clone (an unpacked sdist): nothing to keep clean")
    found = written_paths()
    # A directory is asked about by a file in it, since git ignores a directory pattern ("spark-run/") for the
    # files under it whether or not the directory exists.
    asked = {(p + "any-file" if p.endswith("/") else p): p for p in found}
    r = subprocess.run(["git", "check-ignore", "--no-index", "--stdin", "-z", "--non-matching", "--verbose"],
                       cwd=REPO, input="\0".join(asked) + "\0", capture_output=True, text=True)
    assert r.returncode in (0, 1), r.stderr
    fields = r.stdout.split("\0")
    # --verbose -z --non-matching: source, line number, pattern, path for each path; empty source when not ignored
    not_ignored = [asked[fields[i + 3]] for i in range(0, len(fields) - 3, 4) if fields[i] == ""]
    assert not not_ignored, {p: sorted(found[p]) for p in not_ignored}
