"""Every command's ``--help``, at 80 columns: a purpose and examples, flags without a value type,
no Python types, nothing wider than the terminal, no name of a choice list split across lines,
no word cut short; and every example line is one the command line takes, with the bundled
files it names."""

from __future__ import annotations

import functools
import re
import shlex
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from shoal.cli import app

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 80
runner = CliRunner()


def _walk(cmd, path: tuple[str, ...] = ()):
    """(path, click command) of ``cmd`` and every command and group under it."""
    yield path, cmd
    for name, sub in (getattr(cmd, "commands", None) or {}).items():
        yield from _walk(sub, (*path, name))


COMMANDS = dict(_walk(typer.main.get_command(app)))
IDS = [" ".join(("shoal", *p)) for p in COMMANDS]


@functools.cache
def _help(path: tuple[str, ...]) -> str:
    res = runner.invoke(app, [*path, "--help"], env={"COLUMNS": str(WIDTH)})
    assert res.exit_code == 0, res.output
    return res.output


def _examples(path: tuple[str, ...]) -> list[str]:
    """The command lines of the examples section (a line ending in a backslash continued on the
    next; comments and the heading left out)."""
    out = _help(path)
    section = "\n".join(line.strip() for line in out[out.index("Examples:"):].splitlines()[1:])
    return [line for line in section.replace("\\\n", " ").splitlines()
            if line.startswith("shoal ")]


def _choices(cmd) -> dict[str, list[str]]:
    """Option or argument name -> the names it takes, for every choice parameter."""
    out = {}
    for p in cmd.params:
        desc = getattr(p, "type_descriptor", None)
        if desc is not None and desc.is_choice:
            out[p.name] = [getattr(c, "value", c) for c in desc.choices]
    return out


@pytest.mark.parametrize("path", list(COMMANDS), ids=IDS)
def test_help_has_a_purpose_and_examples(path):
    out = _help(path)
    assert "Usage:" in out
    purpose = out.split("Usage:", 1)[1].splitlines()[2].strip()
    assert purpose, f"no purpose line:\n{out}"
    assert "Example" in out
    assert _examples(path), f"no example command line:\n{out}"
    section = out[out.index("Examples:"):].splitlines()[1:]
    wrapped = [line for line in section if line.strip() and not line.startswith("   ")]
    assert not wrapped, f"example lines wrapped by the terminal: {wrapped}"


@pytest.mark.parametrize("path", list(COMMANDS), ids=IDS)
def test_help_shows_no_python_types_and_fits_80_columns(path):
    out = _help(path)
    assert "<bool>" not in out
    assert "list[" not in out
    assert "…" not in out  # a word cut short by a column too narrow for it
    wide = [line for line in out.splitlines() if len(line) > WIDTH]
    assert not wide, "\n".join(wide)


@pytest.mark.parametrize("path", [p for p, c in COMMANDS.items() if _choices(c)],
                         ids=lambda p: " ".join(("shoal", *p)))
def test_choice_names_are_never_split_across_lines(path):
    """Each name an option takes is whole on a line of the help, and never in two pieces on
    consecutive lines (a narrow terminal folds between names, not inside one: no "exh
    austive")."""
    lines = _help(path).splitlines()
    tokens = [set(re.split(r"[\s│|<>,:;()\[\]]+", line)) for line in lines]
    for param, names in _choices(COMMANDS[path]).items():
        for name in names:
            assert any(name in t for t in tokens), (param, name, _help(path))
            split = [(name[:k], name[k:]) for k in range(1, len(name)) for a, b in
                     zip(tokens, tokens[1:]) if name[:k] in a and name[k:] in b]
            assert not split, (param, name, split, _help(path))


def _parse(args: list[str]) -> None:
    """Parse ``args`` (after ``shoal``) as the command line would, without running anything."""
    cmd = COMMANDS[()]
    while getattr(cmd, "commands", None) and args and args[0] in cmd.commands:
        cmd, args = cmd.commands[args[0]], args[1:]
    assert not getattr(cmd, "commands", None), f"a group, not a command: {args}"
    cmd.make_context(cmd.name, list(args))


@pytest.mark.parametrize("path", list(COMMANDS), ids=IDS)
def test_examples_are_command_lines_shoal_takes(path):
    """Every example parses (its options exist, its values are of the right kind), and the
    files of examples/ it names are there."""
    lines = _examples(path)
    assert any(shlex.split(line)[1:len(path) + 1] == list(path) for line in lines), lines
    for line in lines:
        words = shlex.split(line)
        for stop in (">", "|", "&&", ";", "&"):
            if stop in words:
                words = words[:words.index(stop)]
        _parse(words[1:])
        for w in words:
            if w.startswith("examples/"):
                assert (ROOT / w).is_file(), (line, w)
