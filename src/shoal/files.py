"""Reading input files: JSON or YAML, with errors that name the file and the line."""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

import yaml

from shoal.errors import SpecError, shorten, shown

# Bounds on what a document may make the reader do, whoever wrote it: its size, how deep its
# lists and mappings nest (a parser recurses once per level), and how many nodes YAML aliases
# may add (each alias repeats its anchor's whole subtree: nine aliases of nine aliases of ...
# are billions of values from a few hundred bytes). Shoal's own documents nest under ten
# levels and the largest reference file is a quarter of a megabyte.
MAX_DOCUMENT_BYTES = 64 * 2**20
MAX_DEPTH = 64
MAX_ALIAS_NODES = 100_000


def read_text(path: str | Path, what: str = "file", expected: str = "UTF-8 text",
              limit_bytes: int | None = None) -> str:
    """A text file's contents (a leading byte-order mark dropped), or a SpecError naming the file:
    a folder, missing, larger than ``limit_bytes``, or not UTF-8 (``expected`` says what it
    should be)."""
    p = Path(path)
    if p.is_dir():
        raise SpecError(f"a folder, not a {what}", file=str(p))
    try:
        if limit_bytes is not None and p.is_file() and p.stat().st_size > limit_bytes:
            raise SpecError(f"{what} too large ({p.stat().st_size:,} bytes)", file=str(p),
                            allowed=f"at most {limit_bytes:,} bytes")
        return p.read_text(encoding="utf-8-sig")
    except (FileNotFoundError, NotADirectoryError):  # the second: a file on the way to it
        raise SpecError(f"{what} not found", file=str(p)) from None
    except PermissionError:
        raise SpecError(f"{what} cannot be read: permission denied", file=str(p)) from None
    except UnicodeDecodeError:
        raise SpecError(f"not a text file (expected {expected})", file=str(p)) from None


def read_json(path: str | Path, what: str = "file") -> dict:
    """A JSON document, or a SpecError naming the file (and line) when it is missing or broken."""
    p = Path(path)
    text = read_text(p, what, "UTF-8 JSON", MAX_DOCUMENT_BYTES)
    try:
        data = _loads_json(text, p)
    except json.JSONDecodeError as exc:
        raise SpecError(f"malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}",
                        file=str(p)) from None
    if not isinstance(data, dict):
        raise SpecError("expected a JSON object at the top level", file=str(p), value=_kind(data))
    return data


class _KeyTwice(ValueError):
    pass


def _unique_keys(pairs: list[tuple]) -> dict:
    """A JSON object's pairs as a dict; a key given twice is an error (``json`` would keep
    the last silently)."""
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise _KeyTwice(k)
        out[k] = v
    return out


def _loads_json(text: str, p: Path):
    depth = json_depth(text, MAX_DEPTH)
    if depth > MAX_DEPTH:
        raise SpecError(f"lists and objects nested more than {MAX_DEPTH} levels deep",
                        file=str(p), allowed=f"at most {MAX_DEPTH} levels")
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant,
                          parse_float=finite_float)
    except _KeyTwice as exc:
        raise SpecError(f"key {shown(exc.args[0])} given twice in one object",
                        file=str(p)) from None
    except _NotJson as exc:
        raise SpecError(f"{shorten(exc.args[0])} is not a JSON number (JSON has no NaN or "
                        "infinity; a float holds up to about 1.8e308)", file=str(p)) from None


class _NotJson(ValueError):
    pass


def _no_constant(name: str):
    raise _NotJson(name)


def finite_float(text: str) -> float:
    """A JSON number as a float; one past the largest float (1e400) is refused rather than read
    as infinity (``json.loads``' ``parse_float``)."""
    x = float(text)
    if x in (float("inf"), float("-inf")):
        raise _NotJson(text)
    return x


_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def json_depth(text: str | bytes, limit: int) -> int:
    """How deep the lists and objects of a JSON text nest, counted up to ``limit + 1`` (a
    deeper text: more than ``limit``, however deep): checked before ``json.loads``, which
    recurses once per level. Brackets inside strings do not count; a malformed text gives
    some depth and fails in the parser."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    depth = top = 0
    for c in _NOT_BRACKET.sub("", _JSON_STRING.sub("", text)):
        depth += 1 if c in "[{" else -1
        if depth > top:
            top = depth
            if top > limit:
                break
    return top


class _OverLimit(yaml.composer.ComposerError):
    """A well-formed YAML document past what the reader takes (``MAX_DEPTH``,
    ``MAX_ALIAS_NODES``)."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, but a key given twice in one mapping is an error (the plain loader
    keeps the last silently: a zone listed twice would lose the GPUs of the first); nesting
    deeper than ``MAX_DEPTH`` and aliases that add more than ``MAX_ALIAS_NODES`` nodes are
    errors too."""

    def compose_node(self, parent, index):
        # the composer recurses once per level: stop it at the limit, not at Python's
        self._depth = getattr(self, "_depth", 0) + 1
        try:
            if self._depth > MAX_DEPTH:
                raise _OverLimit(None, None, f"lists and mappings nested more than {MAX_DEPTH} "
                                 "levels deep", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self):
        node = super().compose_document()
        unique: dict[int, int | None] = {}
        added = _expanded(node, unique) - len(unique)
        if added > MAX_ALIAS_NODES:
            raise _OverLimit(None, None, f"aliases expand to {added:,} more values (at most "
                             f"{MAX_ALIAS_NODES:,})")
        return node

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: the base class reports it
                continue
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} given twice (first at line {first})",
                    key_node.start_mark)
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def _expanded(node, sizes: dict[int, int | None]) -> int:
    """Nodes in ``node``'s tree with every alias expanded, each distinct node counted once in
    ``sizes`` (an alias is the anchored node itself in the composed tree). An alias inside its
    own anchor is an error: it would expand forever."""
    key = id(node)
    if key in sizes:
        if sizes[key] is None:
            raise _OverLimit(None, None, "an alias inside its own anchor", node.start_mark)
        return sizes[key]
    sizes[key] = None
    if isinstance(node, yaml.SequenceNode):
        n = 1 + sum(_expanded(x, sizes) for x in node.value)
    elif isinstance(node, yaml.MappingNode):
        n = 1 + sum(_expanded(k, sizes) + _expanded(v, sizes) for k, v in node.value)
    else:
        n = 1
    sizes[key] = n
    return n


def read_document(path: str | Path) -> dict:
    """Read a YAML or JSON file into a mapping, or raise SpecError naming the file and line."""
    p = Path(path)
    text = read_text(p, "file", "UTF-8 YAML or JSON", MAX_DOCUMENT_BYTES)
    if not text.strip():
        raise SpecError("empty file: no YAML or JSON document", file=str(p))
    try:
        data = (_loads_json(text, p) if p.suffix.lower() == ".json"
                else yaml.load(text, Loader=_UniqueKeyLoader))
    except json.JSONDecodeError as exc:
        raise SpecError(f"malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}",
                        file=str(p)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        what = "YAML" if isinstance(exc, _OverLimit) else "malformed YAML"
        raise SpecError(f"{what}{where}: {problem}", file=str(p)) from None
    if data is None and not any(ln.strip() and not ln.strip().startswith("#")
                                for ln in text.splitlines()):  # blank, or comments only
        raise SpecError("empty file: no YAML or JSON document", file=str(p))
    if not isinstance(data, dict):
        raise SpecError("expected a mapping at the top level", file=str(p), value=_kind(data))
    return data


def _kind(x: object) -> str:
    """What a document's top level is, in a user's words."""
    return {list: "a list", str: "a string", int: "a number", float: "a number",
            bool: "true or false", type(None): "null"}.get(type(x), type(x).__name__)


def _existing_part(p: Path) -> Path:
    """The nearest folder (or file) on the way to ``p`` that exists: where its missing
    folders would be made."""
    up = p
    while not up.exists() and up != up.parent:
        up = up.parent
    return up


def check_output(path: str | Path, option: str) -> Path:
    """An output file path that is not a folder and can be written, its missing folders made
    (by ``make_folder``, when it is written), or a SpecError naming the option."""
    p = Path(path)
    if p.is_dir() or getattr(path, "given_as_folder", False):
        raise SpecError("a folder, not a file", field=option,
                        value=str(p) + ("" if p.is_dir() else os.sep),
                        allowed="a file path (a new file, or one to replace)")
    up = _existing_part(p.parent)
    if not up.is_dir():
        raise SpecError(f"{up} is a file: no folder can be made under it", field=option,
                        value=str(p), allowed="a path whose existing part is a folder")
    if not p.exists() or p.is_file():  # written through a temporary file beside it
        try:
            with tempfile.NamedTemporaryFile(dir=up, prefix=".shoal-check-"):
                pass
        except OSError as exc:
            raise SpecError(f"cannot write there: {exc.strerror or exc}", field=option,
                            value=str(p), allowed="a path in a folder you can write to") from None
    return p


def make_folder(path: str | Path) -> Path:
    """A folder and the folders on the way to it, made where missing (every command's
    outputs go through here); a SpecError naming it when one cannot be made."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecError(f"cannot make the folder: {exc.strerror or exc}", file=str(p)) from None
    return p


def check_outputs(outputs, inputs=()) -> None:
    """``check_output`` for each (path, option) of ``outputs`` whose path is given; and a
    SpecError when one is the same file as an input of the command (``inputs``, paths or
    None) or as another output (nothing a command reads is replaced by what it writes), or
    when a figure's path (``FIGURE_OPTIONS``) names no format shoal writes."""
    ins = [Path(q) for q in inputs if q is not None]
    seen: list[tuple[Path, str]] = []
    for path, option in outputs:
        if path is None:
            continue
        p = check_output(path, option)
        for q in ins:
            if _same_file(p, q):
                raise SpecError("this is an input of the command: writing it would replace it",
                                field=option, value=str(p),
                                allowed="a path that is not one of the command's inputs")
        for q, other in seen:
            if _same_file(p, q):
                raise SpecError(f"the same file as {other}", field=option, value=str(p),
                                allowed="a different path for each output")
        if option in FIGURE_OPTIONS and figure_format(p) is None:
            raise SpecError("not a figure format shoal writes", field=option, value=str(p),
                            allowed="a path ending in " + ", ".join(f".{f}" for f in FIGURE_FORMATS))
        seen.append((p, option))


def _same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file (through links, or as the same new path)."""
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    except OSError:
        pass
    return os.path.realpath(a) == os.path.realpath(b)


def check_folder(path: str | Path, option: str) -> Path:
    """An output folder: one that exists, or a new path (the writer makes it and the folders
    on the way, ``make_folder``); a SpecError naming the option when it is a file or a file
    is on the way to it."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise SpecError("a file, not a folder", field=option, value=str(p),
                        allowed="a folder (an existing one, or a new path)")
    up = _existing_part(p)
    if not up.is_dir():
        raise SpecError(f"{up} is a file: no folder can be made under it", field=option,
                        value=str(p), allowed="a path whose existing part is a folder")
    return p


def _swap_in(tmp: Path, out: Path, write) -> Path:
    """``write(tmp)``, then ``tmp`` renamed to ``out`` (its missing folders made first): the
    result appears whole or not at all, and a failure leaves no temporary file behind. A
    symbolic link is written through (its target replaced); a FIFO or a device is written
    directly (nothing can be swapped in there). A path that cannot be written is a SpecError
    naming it."""
    if out.is_symlink():
        out = Path(os.path.realpath(out))
        tmp = out.with_name(tmp.name)
    if out.is_dir():
        raise SpecError("cannot write: the path is a folder", file=str(out))
    make_folder(out.parent)
    try:
        if out.exists() and not out.is_file():
            write(out)
            return out
        try:
            write(tmp)
            tmp.replace(out)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise SpecError(f"cannot write: {exc.strerror or exc}", file=str(out)) from None
    return out


def write_text(path: str | Path, text: str) -> Path:
    """Write a text file through a temporary file (never a half-written result)."""
    out = Path(path)
    return _swap_in(out.with_name(out.name + ".tmp"), out, lambda t: t.write_text(text))


def write_json(path: str | Path, doc) -> Path:
    """Write a JSON document through a temporary file (never a half-written result)."""
    return write_text(path, json.dumps(doc, indent=1))


FIGURE_FORMATS = ("png", "svg", "pdf")  # by the file's suffix; a path without one: PNG
FIGURE_OPTIONS = ("--figure", "--timeline")  # the options that write a figure


def figure_format(path: str | Path) -> str | None:
    """The format a figure path names (``FIGURE_FORMATS``; no suffix: png), or None."""
    suffix = Path(path).suffix.lower().lstrip(".")
    return "png" if not suffix else suffix if suffix in FIGURE_FORMATS else None


def save_figure(fig, path: str | Path) -> Path:
    """Write a matplotlib figure in the format its suffix names (PNG, SVG or PDF) through a
    temporary file (never a half-written image)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    out = Path(path)
    fmt = figure_format(out) or "png"
    try:
        return _swap_in(out.with_name(out.stem + f".tmp.{fmt}"), out,
                        lambda t: fig.savefig(t, dpi=110, format=fmt, bbox_inches="tight"))
    finally:
        plt.close(fig)
