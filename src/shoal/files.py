"""Reading input files: JSON or YAML, with errors that name the file and the line."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from shoal.errors import SpecError


def read_json(path: str | Path, what: str = "file") -> dict:
    """A JSON document, or a SpecError naming the file (and line) when it is missing or broken."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except (FileNotFoundError, IsADirectoryError):
        raise SpecError(f"{what} not found", file=str(p)) from None
    except UnicodeDecodeError:
        raise SpecError("not a text file (expected UTF-8 JSON)", file=str(p)) from None
    except json.JSONDecodeError as exc:
        raise SpecError(f"malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}",
                        file=str(p)) from None
    if not isinstance(data, dict):
        raise SpecError("expected a JSON object at the top level", file=str(p),
                        value=type(data).__name__)
    return data


def read_document(path: str | Path) -> dict:
    """Read a YAML or JSON file into a mapping, or raise SpecError naming the file and line."""
    p = Path(path)
    if not p.is_file():
        raise SpecError("file not found", file=str(p))
    try:
        text = p.read_text()
    except UnicodeDecodeError:
        raise SpecError("not a text file (expected UTF-8 YAML or JSON)", file=str(p)) from None
    try:
        data = json.loads(text) if p.suffix.lower() == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise SpecError(f"malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}",
                        file=str(p)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError(f"malformed YAML{where}: {problem}", file=str(p)) from None
    if not isinstance(data, dict):
        raise SpecError("expected a mapping at the top level", file=str(p), value=type(data).__name__)
    return data


def check_output(path: str | Path, option: str) -> Path:
    """An output path whose folder exists, or a SpecError naming the option."""
    p = Path(path)
    if not p.parent.is_dir():
        raise SpecError("the folder to write into does not exist", field=option,
                        value=str(p), allowed="a path in an existing folder")
    return p


def write_text(path: str | Path, text: str) -> Path:
    """Write a text file through a temporary file (never a half-written result)."""
    out = Path(path)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(out)
    return out


def write_json(path: str | Path, doc) -> Path:
    """Write a JSON document through a temporary file (never a half-written result)."""
    return write_text(path, json.dumps(doc, indent=1))


def save_png(fig, path: str | Path) -> Path:
    """Write a matplotlib figure as PNG through a temporary file (never a half-written image)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    out = Path(path)
    tmp = out.with_name(out.stem + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(out)
    return out
