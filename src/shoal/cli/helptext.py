"""How every command's ``--help`` reads: a one-line purpose, the details, the options (an on/off
flag shown bare, an argument by its name), and the examples (DESIGN §6).

A command's help is its docstring: the first paragraph is its purpose, any others the details.
Its examples come from ``@examples(...)`` (a group's: ``epilog=examples_text(...)``) and are
printed after the options. ``finish`` applies this, and the display classes below, to every
command and group of an app once, where the app is put together.
"""

from __future__ import annotations

import inspect
import shlex

import typer
from rich.markup import escape
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

EXAMPLES_HEADING = "Examples:"
EXAMPLE_WIDTH = 78  # an 80-column terminal, less the help's margins


# the value column of an option without a metavar of its own, by its type (typer shows the Python
# type: <int range>, <float>, <str>, <path>)
_METAVARS = {int: "INTEGER", float: "FLOAT", str: "TEXT"}


class _Option(TyperOption):
    """An option as a command line spells it: an on/off flag takes no value, so its value column
    is empty; a value is named by its metavar, else by its kind (``INTEGER``, ``FLOAT``,
    ``TEXT``, ``PATH``).

    typer's rich help fills the value column of every option with ``display_type_rich()``,
    which for a flag is ``<bool>`` (``--help`` included); only its plain help leaves flags out."""

    def display_type_rich(self, ctx) -> str | None:
        if self.is_flag and not self.count:
            return None
        if self.metavar is None and self.nargs == 1 and not self.multiple:
            desc = self.type_descriptor
            if desc.is_path:
                return "PATH"
            if desc.annotation in _METAVARS and not desc.is_choice:
                return _METAVARS[desc.annotation]
        return super().display_type_rich(ctx)


class _Argument(TyperArgument):
    """An argument shown by its name (``SCENARIO``, ``FILE...``) alone: no Python type next to it
    (typer shows ``<path>``, or ``<list[Path]>`` for several)."""

    def display_type_rich(self, ctx) -> str | None:
        if self.metavar is not None:
            return None
        return super().display_type_rich(ctx)

    def _usage_display_name(self) -> str:
        """``FILE...`` once in the usage line, not ``{FILE...}...``."""
        if self.metavar is None or not self.metavar.endswith("..."):
            return super()._usage_display_name()
        return f"{{{self.metavar}}}" if self.required else f"[{self.metavar}]"


def _readable(params: list) -> list:
    """The parameters with shoal's display: typer's own classes swapped for the subclasses above
    (same fields, only the help differs)."""
    for p in params:
        if type(p) is TyperOption:
            p.__class__ = _Option
        elif type(p) is TyperArgument:
            p.__class__ = _Argument
    return params


class Command(TyperCommand):
    """A command whose options and arguments read as above (``--help`` included)."""

    def get_params(self, ctx) -> list:
        return _readable(super().get_params(ctx))


class Group(TyperGroup):
    """A group of commands whose ``--help`` option reads as above."""

    def get_params(self, ctx) -> list:
        return _readable(super().get_params(ctx))


def reflow(text: str) -> str:
    """Help text with each paragraph on one line: rich help keeps the source's line breaks,
    which break lines mid-sentence."""
    return "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(text).split("\n\n"))


def _chunks(command: str) -> list[str]:
    """A command line in the pieces a line may break between: the command and its arguments,
    then each option with its value (quoted values kept whole)."""
    lex = shlex.shlex(command, posix=False)
    lex.whitespace_split = True
    chunks: list[str] = []
    for word in lex:
        if chunks and not word.startswith(("-", ">", "|")):
            chunks[-1] += " " + word
        else:
            chunks.append(word)
    return chunks


def _wrapped(command: str) -> list[str]:
    """A command line as lines of at most EXAMPLE_WIDTH columns, the later ones continuing
    the first (a trailing backslash, as a shell reads it) and indented further."""
    lines = [""]
    for chunk in _chunks(command):
        limit = EXAMPLE_WIDTH - (2 if len(lines) == 1 else 4) - 2  # indent, " \\"
        if lines[-1] and len(lines[-1]) + 1 + len(chunk) > limit:
            lines.append(chunk)
        else:
            lines[-1] = f"{lines[-1]} {chunk}".strip()
    return ["  " + lines[0]] + ["    " + line for line in lines[1:]]


def examples_text(*lines: str) -> str:
    """An examples section as typer prints an epilog: the heading, then each command line
    (wrapped to fit 80 columns) or comment (a line starting with #), indented under it. Markup
    is escaped (a ``[`` is text), and a leading blank line keeps the indentation through the
    dedent typer applies."""
    out = [EXAMPLES_HEADING]
    for line in lines:
        parts = ["  " + line] if line.startswith("#") else _wrapped(line)
        out += [p + " \\" for p in parts[:-1]] + parts[-1:]
    return "\n" + escape("\n".join(out))


def examples(*lines: str):
    """A command's examples (``examples_text``), printed after its options."""

    def mark(fn):
        fn.help_examples = examples_text(*lines)
        return fn
    return mark


def finish(group: typer.Typer) -> None:
    """Every command and group under ``group``: its help reflowed (``reflow``; a command's from
    its docstring), its examples as its epilog, and the display classes above."""
    if isinstance(group.info.help, str):
        group.info.help = reflow(group.info.help)
    group.info.cls = Group
    for info in group.registered_commands:
        if info.help is None and info.callback is not None and info.callback.__doc__:
            info.help = reflow(info.callback.__doc__)
        if info.epilog is None:
            info.epilog = getattr(info.callback, "help_examples", None)
        if info.cls in (None, TyperCommand):  # typer's default: no class of the command's own
            info.cls = Command
    for sub in group.registered_groups:
        if sub.typer_instance is not None:
            finish(sub.typer_instance)
