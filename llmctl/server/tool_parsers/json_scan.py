"""Reading JSON as it is generated: where a value ends (or that it has not ended yet), and the
top-level members of an object, so a tool call's name and the raw text of its arguments can be
streamed before the call is complete. The raw text is what is sent: every prefix streamed is a
prefix of the final arguments string.

While a stream runs, the text only grows, so the strings and containers scanned at one delta are
remembered (`incremental`, a ScanMemo per streamed message): the next delta resumes where the scan
stopped instead of re-reading a long argument from its start in Python. A remembered scan is used only
where the text still holds exactly what was scanned (a C-speed comparison), so a parser that scans
slices or unrelated texts gets the same answers, only slower."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

WHITESPACE = " \t\r\n"


@dataclass(frozen=True)
class _Scanned:
    seen: str  # the text from the scan's start to where it stopped
    depth: int  # a container's open brackets there (0 for a string)
    closed: bool  # the value ended there


@dataclass
class ScanMemo:
    """Scans of one growing text, by (kind, start)."""

    scans: dict[tuple[str, int], _Scanned] = field(default_factory=dict)

    def resume(self, kind: str, text: str, start: int) -> _Scanned | None:
        scanned = self.scans.get((kind, start))
        return scanned if scanned is not None and text.startswith(scanned.seen, start) else None

    def remember(self, kind: str, text: str, start: int, end: int, depth: int, closed: bool) -> None:
        self.scans[(kind, start)] = _Scanned(text[start:end], depth, closed)


_MEMO: ContextVar[ScanMemo | None] = ContextVar("json_scan_memo", default=None)


@contextmanager
def incremental(memo: ScanMemo) -> Iterator[None]:
    """Scans inside the block use and extend memo (the text they read must be the one memo saw, grown)."""
    token = _MEMO.set(memo)
    try:
        yield
    finally:
        _MEMO.reset(token)


@dataclass(frozen=True)
class Member:
    key: str
    value_start: int  # index of the value's first character in the scanned text
    value_end: int  # one past its last character seen so far
    complete: bool  # the value is whole (a later character closed it)


@dataclass(frozen=True)
class ScannedObject:
    members: list[Member]
    end: int | None  # one past the closing brace; None while the object is open


def skip_whitespace(text: str, i: int) -> int:
    while i < len(text) and text[i] in WHITESPACE:
        i += 1
    return i


def scan_value(text: str, i: int) -> tuple[int, bool]:
    """From the value's first character: (one past its end or len(text), whether it ended)."""
    if i >= len(text):
        return i, False
    if text[i] == '"':
        return _scan_string(text, i)
    if text[i] in "{[":
        return _scan_container(text, i)
    j = i
    while j < len(text) and text[j] not in ",}]" + WHITESPACE:
        j += 1
    return j, j < len(text)  # a number or literal ends at the next delimiter


def _scan_string(text: str, i: int) -> tuple[int, bool]:
    memo = _MEMO.get()
    scanned = memo.resume("string", text, i) if memo is not None else None
    if scanned is not None and scanned.closed:
        return i + len(scanned.seen), True
    j = i + len(scanned.seen) if scanned is not None else i + 1
    while j < len(text):
        if text[j] == "\\":
            if j + 1 == len(text):
                break  # the escaped character has not come yet: resume at the backslash
            j += 2
        elif text[j] == '"':
            j += 1
            if memo is not None:
                memo.remember("string", text, i, j, 0, True)
            return j, True
        else:
            j += 1
    if memo is not None:
        memo.remember("string", text, i, min(j, len(text)), 0, False)
    return len(text), False


def _scan_container(text: str, i: int) -> tuple[int, bool]:
    memo = _MEMO.get()
    scanned = memo.resume("container", text, i) if memo is not None else None
    if scanned is not None and scanned.closed:
        return i + len(scanned.seen), True
    depth, j = (scanned.depth, i + len(scanned.seen)) if scanned is not None else (0, i)
    while j < len(text):
        char = text[j]
        if char == '"':
            end, closed = _scan_string(text, j)
            if not closed:
                break  # resume at the open string, which remembers its own progress
            j = end
            continue
        if char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0:
                if memo is not None:
                    memo.remember("container", text, i, j + 1, 0, True)
                return j + 1, True
        j += 1
    if memo is not None:
        memo.remember("container", text, i, j, depth, False)
    return len(text), False


def scan_object(text: str, i: int) -> ScannedObject:
    """The members of the object whose "{" is at i, as far as the text goes."""
    members: list[Member] = []
    j = skip_whitespace(text, i + 1)
    while j < len(text):
        if text[j] == "}":
            return ScannedObject(members, j + 1)
        if text[j] != '"':
            break
        key_end, closed = _scan_string(text, j)
        colon = skip_whitespace(text, key_end)
        if not closed or colon >= len(text) or text[colon] != ":":
            break
        start = skip_whitespace(text, colon + 1)
        end, complete = scan_value(text, start)
        members.append(Member(_decode_key(text[j:key_end]), start, end, complete))
        if not complete:
            break
        j = skip_whitespace(text, end)
        if j < len(text) and text[j] == ",":
            j = skip_whitespace(text, j + 1)
    return ScannedObject(members, None)


def _decode_key(quoted: str) -> str:
    import json

    try:
        return str(json.loads(quoted))
    except ValueError:
        return quoted[1:-1]
