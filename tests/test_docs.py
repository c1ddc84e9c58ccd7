"""The README, docs/ and the handouts stay true (issue 33.9): every `labs ...` command
they show resolves to a command of the CLI with the options and choices they give
(each one's --help is run), the README's opening names every lab, and no handout or
doc cites a Markdown file the repository does not have."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from harness import manifest
from harness.cli import main

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
HANDOUTS = sorted((ROOT / "labs").glob("*/README.md"))


def commands_in(text: str) -> list[str]:
    """Each `labs ...` command line of ``text``: in backticks, or a line of a code block."""
    found = re.findall(r"`(labs [^`]+)`", text)
    for block in re.findall(r"```(?:bash|sh|console)?\n(.*?)```", text, re.S):
        found += [ln.split("#")[0].strip() for ln in block.splitlines() if ln.strip().startswith("labs ")]
    return [c for c in found if c]


def resolve(words: list[str]) -> tuple[click.Command, list[str], list[str]]:
    """The command ``words`` name, the words naming it, and the rest."""
    cmd, path = main, []
    rest = list(words)
    while isinstance(cmd, click.Group) and rest and rest[0] in cmd.commands:
        path.append(rest.pop(0))
        cmd = cmd.commands[path[-1]]
    return cmd, path, rest


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_labs_command_in_the_docs_exists_with_its_options(doc):
    cmds = commands_in(doc.read_text())
    assert cmds or doc.name == "sandbox.md"
    for line in cmds:
        words = shlex.split(line.replace("[", " ").replace("]", " "))[1:]
        cmd, path, rest = resolve(words)
        assert path, f"{doc.name}: `{line}`: no such labs command"
        if isinstance(cmd, click.Group) and not cmd.invoke_without_command:
            pytest.fail(f"{doc.name}: `{line}`: `labs {' '.join(path)}` needs a subcommand")
        r = CliRunner().invoke(main, [*path, "--help"])
        assert r.exit_code == 0, (line, r.output)
        opts = {o: p for p in cmd.params for o in getattr(p, "opts", [])}
        for i, w in enumerate(rest):
            if not w.startswith("--"):
                continue
            name = w.split("=")[0]
            assert name in opts, f"{doc.name}: `{line}`: labs {' '.join(path)} has no option {name}"
            choice = opts[name].type
            if isinstance(choice, click.Choice) and i + 1 < len(rest):
                for value in rest[i + 1].split("|"):
                    assert value in choice.choices, f"{doc.name}: `{line}`: {name} {value} is refused"


def test_the_readme_opening_names_every_lab():
    course = manifest.load(ROOT)
    opening = ROOT.joinpath("README.md").read_text().split("```")[0]
    for number in course.labs:
        assert re.search(rf"\b{number}\b", opening), f"the README's opening does not name lab {number}"


@pytest.mark.parametrize("doc", DOCS + HANDOUTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_doc_cites_a_markdown_file_that_is_not_there(doc):
    for name in re.findall(r"[\w./-]+\.md\b", doc.read_text()):
        if name.startswith(("http", "//")):
            continue
        candidates = [ROOT / name, doc.parent / name, ROOT / "docs" / name]
        assert any(p.exists() for p in candidates) or Path(name).name in {"README.md"}, \
            f"{doc.relative_to(ROOT)} cites {name}, which the repository does not have"
