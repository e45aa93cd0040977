"""What every command shares: consoles, tables, and turning shoal's errors into a message and
an exit code (DESIGN §6)."""

from __future__ import annotations

import functools
import importlib.util
import inspect
import json
import math
import os
import typing
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from shoal.errors import SHOWN_CHARS, InfeasibleError, RunFailed, ShoalError, SpecError, shown
from shoal.files import FIGURE_FORMATS, FIGURE_OPTIONS
from shoal.report import tables

EXIT_RUN_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INFEASIBLE = 3


class _FolderPath(type(Path())):  # type: ignore[misc]
    """A path given with a trailing separator (``out/``): a folder, though ``Path`` drops the
    separator (``files.check_output`` refuses it for a file)."""

    given_as_folder = True


def output_path(value: str | Path) -> Path:
    """An output option's path as given: one ending in a separator stays a folder path (a
    default, which typer passes here as it is, is already a path)."""
    if isinstance(value, Path):
        return value
    if value.endswith(("/", os.sep)) and value.rstrip("/" + os.sep):
        return _FolderPath(value)
    return Path(value)


def output_option(*names: str, help: str) -> typing.Any:
    """A typer option naming a file to write (``output_path``); a figure's says its formats."""
    if any(n in FIGURE_OPTIONS for n in names):
        help += " (" + ", ".join(f".{f}" for f in FIGURE_FORMATS) + "; no suffix: PNG)"
    return typer.Option(*names, parser=output_path, metavar="PATH", help=help)


QUIET = {"on": False}  # --quiet of the running command: no tables, no progress


def only_with(needs: str, applies: bool, *given: tuple[str, object]) -> None:
    """Options (name, value; None: not given) that apply only with ``needs`` are refused, not
    ignored, when ``applies`` is false: a SpecError naming the first one given."""
    if applies:
        return
    for name, value in given:
        if value is not None:
            raise SpecError(f"applies only with {needs}", field=name, value=value)


def _out() -> Console:
    # Made per call, so that the console writes to whatever sys.stdout is now (tests swap it).
    # Piped output has no terminal width: give tables room rather than 80 columns.
    con = Console(highlight=False, quiet=QUIET["on"])
    if not con.is_terminal and "COLUMNS" not in os.environ:
        con = Console(highlight=False, width=160, quiet=QUIET["on"])
    return con


def _progress() -> Console:
    """Where progress (spinners, bars, per-step lines) goes: stderr, silent under --quiet."""
    return Console(stderr=True, highlight=False, quiet=QUIET["on"])


def _err() -> Console:
    return Console(stderr=True, highlight=False)


def _fail(exc: Exception | str, code: int, as_json: bool = False) -> typer.Exit:
    """Print the error on stderr and, for a command run with ``--json``, as the one JSON
    object on stdout (``{"error": {"message", "exit_code", ...}}``: a SpecError's file, field,
    value, allowed and suggestion; an InfeasibleError's binding constraint and relaxation)."""
    _err().print(Text("error: ", style="bold red") + Text(str(exc)), soft_wrap=True)
    if as_json:
        doc: dict = {"message": str(exc), "exit_code": code}
        for name in ("file", "field", "value", "allowed", "suggestion", "binding", "relaxation"):
            v = getattr(exc, name, None)
            if v is not None:
                doc[name] = _plain(v) if name == "value" else v
        typer.echo(json.dumps({"error": doc}))
    return typer.Exit(code)


def _plain(v: object) -> object:
    """A bad value as the JSON error's ``value``: a short string, a number or a boolean as it
    is; anything else, an infinity or NaN (JSON has none) or a long string as its capped repr."""
    if isinstance(v, bool) or (isinstance(v, int) and abs(v) < 2**53) or (
            isinstance(v, float) and math.isfinite(v)):
        return v
    if isinstance(v, str) and len(v) <= SHOWN_CHARS:
        return v
    return shown(v)


# Python's recursion limit reached anywhere under a command: some input nested past what a
# reader bounds (files.MAX_DEPTH guards shoal's own readers; this, everything else)
_TOO_DEEP = "the input is nested too deeply to read (Python's recursion limit was reached)"


def _finite_options(fn, kwargs: dict) -> None:
    """A SpecError naming the first option given an infinity or NaN (click reads 'inf' and
    'nan' as floats, and a NaN passes every min= bound)."""
    names = _option_names(fn)
    for key, v in kwargs.items():
        if isinstance(v, float) and not math.isfinite(v):
            raise SpecError("must be a finite number (not infinity or NaN)",
                            field=names.get(key, key), value=v)


@functools.cache
def _option_names(fn) -> dict[str, str]:
    """Parameter name -> how the command line spells it (its first long option)."""
    out = {}
    for name, hint in typing.get_type_hints(fn, include_extras=True).items():
        for meta in getattr(hint, "__metadata__", ()):
            if isinstance(meta, typer.models.OptionInfo):
                # under Annotated, typer takes a first argument like "--json" as a declaration
                decls = [meta.default, *(meta.param_decls or ())]
                longs = [d.split("/")[0] for d in decls
                         if isinstance(d, str) and d.startswith("--")]
                out[name] = longs[0] if longs else "--" + name.replace("_", "-")
            elif isinstance(meta, typer.models.ArgumentInfo):
                out[name] = meta.metavar or name.upper()
    return out


def handles_errors(fn):
    """Turn shoal's errors (and pydantic's, as bad input) into a message and an exit code, and
    give every command the same ``--quiet`` (no tables or progress; errors still print)."""
    sig = inspect.signature(fn)
    own_quiet = "quiet" in sig.parameters

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        QUIET["on"] = bool(kwargs.get("quiet") if own_quiet else kwargs.pop("quiet", False))
        as_json = kwargs.get("as_json") is True
        try:
            _finite_options(fn, kwargs)
            return fn(*args, **kwargs)
        except InfeasibleError as exc:
            raise _fail(exc, EXIT_INFEASIBLE, as_json) from None
        except RunFailed as exc:
            raise _fail(exc, EXIT_RUN_FAILED, as_json) from None
        except ShoalError as exc:  # SpecError and any other bad-input error
            raise _fail(exc, EXIT_BAD_INPUT, as_json) from None
        except ValidationError as exc:
            raise _fail(_spec_error(exc, None), EXIT_BAD_INPUT, as_json) from None
        except RecursionError:
            raise _fail(_TOO_DEEP, EXIT_BAD_INPUT, as_json) from None
        finally:
            QUIET["on"] = False

    if not own_quiet:
        # typer reads __signature__ when a function has one: give it resolved annotations
        hints = typing.get_type_hints(fn, include_extras=True)
        params = [p.replace(annotation=hints.get(p.name, p.annotation))
                  for p in sig.parameters.values()]
        quiet = inspect.Parameter(
            "quiet", inspect.Parameter.KEYWORD_ONLY, default=False,
            annotation=Annotated[bool, typer.Option("--quiet", "-q",
                                                    help="print no tables or progress")])
        wrapper.__signature__ = sig.replace(parameters=[*params, quiet],
                                            return_annotation=hints.get("return", None))
        wrapper.__annotations__ = {**hints, "quiet": quiet.annotation}
    return wrapper


def _spec_error(exc: ValidationError, file: str | None) -> SpecError:
    from shoal.specs.scenario import spec_error_from_validation

    return spec_error_from_validation(exc, file)


def needs_torch(command: str) -> None:
    """A SpecError saying how to install PyTorch when it is not there (``command`` needs it)."""
    if importlib.util.find_spec("torch") is None:
        raise SpecError(f"{command} needs PyTorch, which is not installed",
                        allowed="pip install torch==2.13.0 (or: pip install -e '.[runtime]')")


def _table(title: str, columns: list[str], left: tuple[str, ...] = (),
           whole: tuple[str, ...] = ()) -> Table:
    """Narrow terminals wrap cells (fold) rather than cut them, so no value is shown truncated;
    names in ``whole`` (GPU types, zones) are never split."""
    t = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", title_style="bold",
              pad_edge=False, collapse_padding=True)
    for col in columns:
        t.add_column(col, justify="left" if col in left else "right", overflow="fold",
                     no_wrap=col in whole)
    return t


def render(t: tables.Table) -> Table:
    """One of report's tables drawn for the terminal."""
    if t.listing:
        out = Table(title=t.title, show_header=False, box=box.SIMPLE, title_justify="left",
                    title_style="bold")
        out.add_column(t.columns[0])
        out.add_column(t.columns[1], justify="right")
    else:
        out = _table(t.title, t.columns, t.left, t.whole)
    if t.caption is not None:
        out.caption = t.caption
        out.caption_justify = "left"
    for cells, style in t.rows:
        out.add_row(*(Text(c.text, style=c.style) if isinstance(c, tables.Styled) else c
                      for c in cells), style=style)
    return out


def show(*items: tables.Table | str) -> None:
    """Print report's tables (drawn for the terminal) and lines on stdout."""
    out = _out()
    for x in items:
        out.print(render(x) if isinstance(x, tables.Table) else x)
