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
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from shoal.cli.meta import run_meta
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


def with_meta(doc: dict, problem=None, **known) -> dict:
    """``doc`` with the ``meta`` block (``shoal.cli.meta``: what was run, when, on what) first;
    one it has is kept."""
    return {"meta": doc.get("meta") or run_meta(problem, **known), **doc}


def emit_json(doc: dict, problem=None, **known) -> None:
    """A command's ``--json`` result, the one JSON object on stdout, with its ``meta``."""
    typer.echo(json.dumps(with_meta(doc, problem, **known)))


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


class _Whole:
    """A cell never split across lines: a number with its unit, a GPU type, a zone. Its least
    width is all of it (rich's text measures its longest word)."""

    def __init__(self, text: Text):
        self.text = text

    def __rich_measure__(self, console, options) -> Measurement:
        return Measurement(self.text.cell_len, self.text.cell_len)

    def __rich_console__(self, console, options):
        yield self.text


def _whole(t: tables.Table, col: str) -> bool:
    """Cells of ``col`` are never split: right-aligned (numbers) or named in ``whole``."""
    return col in t.whole or col not in t.left


def _fit(t: tables.Table, width: int) -> list[list[int]]:
    """Which of ``t``'s columns each part shows so that every part fits ``width``: all in one
    when its columns, each as narrow as its longest whole cell or word, fit; else the columns
    after the first (which names the rows) in parts, each with the first column again."""
    widths = _least_widths(t)
    if t.listing or sum(widths) + 2 * len(widths) <= width:
        return [list(range(len(t.columns)))]
    parts: list[list[int]] = [[0]]
    for i in range(1, len(t.columns)):
        keep = [*parts[-1], i]
        if len(parts[-1]) > 1 and sum(widths[k] for k in keep) + 2 * len(keep) > width:
            parts.append([0])
        parts[-1].append(i)
    return parts


def _least_widths(t: tables.Table, natural: bool = False) -> list[int]:
    """Each column's least width (its longest whole cell or word, its header's longest word),
    or with ``natural`` its width on one line."""
    out = []
    for i, col in enumerate(t.columns):
        cells = [c.text if isinstance(c, tables.Styled) else str(c) for c in
                 (row[i] for row, _ in t.rows)]
        if natural:
            out.append(max([len(x) for x in [*cells, *col.splitlines()]] + [1]))
            continue
        pieces = cells if _whole(t, col) else [w for c in cells for w in c.split()]
        out.append(max([len(w) for w in col.split()] + [len(c) for c in pieces] + [1]))
    return out


def _widths(t: tables.Table, keep: list[int], width: int) -> list[int] | None:
    """Widths for the columns ``keep`` in ``width``: None when they fit on one line each;
    else each column's least width and the room left to the columns that need more, in order
    (rich's own narrowing ignores a column's least width)."""
    least, natural = _least_widths(t), _least_widths(t, natural=True)
    if sum(natural[i] for i in keep) + 2 * len(keep) <= width:
        return None
    out = [least[i] for i in keep]
    room = width - sum(out) - 2 * len(keep)
    for k, i in enumerate(keep):
        extra = max(0, min(room, natural[i] - out[k]))
        out[k] += extra
        room -= extra
    return out


def render(t: tables.Table, keep: list[int] | None = None, *, titled: bool = True,
           width: int | None = None) -> Table:
    """One of report's tables drawn for the terminal: only the columns ``keep`` (if given);
    ``titled=False``: without its title and caption (printed as lines around its parts);
    ``width``: the terminal's, the columns then as wide as ``_widths`` says."""
    keep = list(range(len(t.columns))) if keep is None else keep
    widths = None if width is None or t.listing else _widths(t, keep, width)
    if t.listing:
        out = Table(title=t.title, show_header=False, box=box.SIMPLE, title_justify="left",
                    title_style="bold")
        out.add_column(t.columns[0])
        out.add_column(t.columns[1], justify="right")
    else:
        out = Table(title=t.title if titled else None, box=box.SIMPLE_HEAD, title_justify="left",
                    title_style="bold", pad_edge=False, collapse_padding=True)
        for k, i in enumerate(keep):  # a header wraps between its words
            col = t.columns[i]
            out.add_column(col, justify="left" if col in t.left else "right", overflow="fold",
                           width=None if widths is None else widths[k])
    if t.caption is not None and titled:
        out.caption = t.caption
        out.caption_justify = "left"
    for cells, style in t.rows:
        out.add_row(*(_cell(t, i, cells[i]) for i in keep), style=style)
    return out


def _cell(t: tables.Table, i: int, c: tables.Cell):
    text = Text(c.text, style=c.style) if isinstance(c, tables.Styled) else Text(c)
    return _Whole(text) if not t.listing and _whole(t, t.columns[i]) else text


def show(*items: tables.Table | str) -> None:
    """Print report's tables (drawn for the terminal, in parts that fit its width) and lines
    on stdout."""
    out = _out()
    for x in items:
        if not isinstance(x, tables.Table):
            out.print(x)
            continue
        parts = _fit(x, out.width)
        if len(parts) == 1:
            out.print(render(x, width=out.width))
            continue
        out.print(Text(x.title, style="bold"))  # title and caption as lines of full width
        for part in parts:
            out.print(render(x, part, titled=False, width=out.width))
        if x.caption is not None:
            out.print(x.caption)
