"""One hierarchy of errors a person can act on (DESIGN §4)."""

from __future__ import annotations

import difflib
import reprlib
from collections.abc import Iterable

SHOWN_CHARS = 200  # the most of a bad value a message repeats: input may be any size


class ShoalError(Exception):
    """Base of every error shoal raises on purpose."""


class SpecError(ShoalError):
    """Bad input: names the file, the field path, the bad value and what is allowed."""

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        field: str | None = None,
        value: object = None,
        allowed: str | None = None,
        suggestion: str | None = None,
    ) -> None:
        self.file = file
        self.field = field
        self.value = value
        self.allowed = allowed
        self.suggestion = suggestion
        self.reason = message
        super().__init__(self._render())

    def _render(self) -> str:
        where = []
        if self.file:
            where.append(str(self.file))
        if self.field:
            where.append(self.field)
        head = ": ".join(where)
        text = f"{head}: {self.reason}" if head else self.reason
        if self.value is not None:
            text += f" (got {spelt(self.value) if isinstance(self.value, bool) else shown(self.value)})"
        if self.allowed:
            text += f"; allowed: {self.allowed}"
        if self.suggestion:
            text += f"; did you mean {self.suggestion!r}?"
        return text

    def located(self, file: str | None = None, prefix: str | None = None) -> SpecError:
        """Return a copy that also names the file and a field-path prefix."""
        field = self.field
        if prefix:
            field = f"{prefix}.{field}" if field else prefix
        return SpecError(
            self.reason,
            file=file or self.file,
            field=field,
            value=self.value,
            allowed=self.allowed,
            suggestion=self.suggestion,
        )


class InfeasibleError(ShoalError):
    """Nothing fits: says the binding constraint and the nearest relaxation that would work."""

    def __init__(self, message: str, *, binding: str | None = None, relaxation: str | None = None):
        self.reason = message  # without the binding constraint and relaxation
        self.binding = binding
        self.relaxation = relaxation
        text = message
        if binding:
            text += f"; binding constraint: {binding}"
        if relaxation:
            text += f"; would work with: {relaxation}"
        super().__init__(text)


class RunFailed(ShoalError, RuntimeError):
    """A run (``shoal train``) failed while it ran: the message says which worker and why."""


def close_match(name: str, choices: Iterable[str], *, cutoff: float = 0.5) -> str | None:
    """The closest known name to a misspelt one, compared case-insensitively; None when nothing
    reaches ``cutoff`` (difflib's similarity ratio, 0..1)."""
    choices = list(choices)
    lowered = {c.lower(): c for c in choices}
    hits = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=cutoff)
    return lowered[hits[0]] if hits else None


def spelt(value: object) -> str:
    """A setting as YAML and JSON files spell it: true/false, not Python's True/False."""
    return str(value).lower() if isinstance(value, bool) else str(value)


class _Repr(reprlib.Repr):
    def repr_str(self, x: str, level: int) -> str:
        # the start of a long string, cut with an ellipsis (reprlib elides its middle)
        return shorten(repr(x[:SHOWN_CHARS + 1]))


_REPR = _Repr()
_REPR.maxlevel = 3
_REPR.maxdict = _REPR.maxlist = _REPR.maxtuple = _REPR.maxset = 8
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = SHOWN_CHARS


def shorten(text: str, limit: int = SHOWN_CHARS) -> str:
    """``text``, cut to ``limit`` characters with an ellipsis when longer."""
    return text if len(text) <= limit else text[:limit - 1] + "\u2026"


def shown(value: object) -> str:
    """A bad value as a message repeats it: its repr, at most ``SHOWN_CHARS`` characters
    (built in bounded time even for a huge or deeply nested value)."""
    try:
        return shorten(_REPR.repr(value))
    except ValueError:  # an integer past Python's digit limit for str()
        return f"<an integer of about {int(value.bit_length() * 0.30103)} digits>" \
            if isinstance(value, int) else f"<a {type(value).__name__}>"
