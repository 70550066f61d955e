"""Reading JSON as it is generated: where a value ends (or that it has not ended yet), and the
top-level members of an object, so a tool call's name and the raw text of its arguments can be
streamed before the call is complete. The raw text is what is sent: every prefix streamed is a
prefix of the final arguments string."""

from __future__ import annotations

from dataclasses import dataclass

WHITESPACE = " \t\r\n"


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
    j = i + 1
    while j < len(text):
        if text[j] == "\\":
            j += 2
        elif text[j] == '"':
            return j + 1, True
        else:
            j += 1
    return len(text), False


def _scan_container(text: str, i: int) -> tuple[int, bool]:
    depth, j = 0, i
    while j < len(text):
        char = text[j]
        if char == '"':
            j, closed = _scan_string(text, j)
            if not closed:
                return len(text), False
            continue
        if char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0:
                return j + 1, True
        j += 1
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
