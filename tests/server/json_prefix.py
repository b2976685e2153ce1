"""Whether a text is JSON, or the beginning of some JSON document (an output cut off by max_tokens)."""

from __future__ import annotations

import re

_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_NUMBER_PREFIX = re.compile(r"-?(?:(?:0|[1-9]\d*)(?:\.\d*)?(?:[eE][+-]?\d*)?)?")
_HEX = set("0123456789abcdefABCDEF")


class _Ended(Exception):
    """The text ended where a document could go on."""


class _Parser:
    def __init__(self, text: str) -> None:
        self.s, self.i = text, 0

    def peek(self) -> str:
        if self.i >= len(self.s):
            raise _Ended
        return self.s[self.i]

    def take(self) -> str:
        c = self.peek()
        self.i += 1
        return c

    def ws(self) -> None:
        while self.i < len(self.s) and self.s[self.i] in " \t\n\r":
            self.i += 1

    def value(self) -> None:
        c = self.peek()
        if c in "{[":
            self.container(c)
        elif c == '"':
            self.string()
        elif c in "-0123456789":
            self.number()
        else:
            for word in ("true", "false", "null"):
                if c == word[0]:
                    for ch in word:
                        if self.take() != ch:
                            raise ValueError(f"bad literal at {self.i}")
                    return
            raise ValueError(f"unexpected {c!r} at {self.i}")

    def container(self, opener: str) -> None:
        closer = "}" if opener == "{" else "]"
        self.take()
        self.ws()
        if self.peek() == closer:
            self.take()
            return
        while True:
            self.ws()
            if opener == "{":
                if self.peek() != '"':
                    raise ValueError(f"expected a key at {self.i}")
                self.string()
                self.ws()
                if self.take() != ":":
                    raise ValueError(f"expected ':' at {self.i}")
                self.ws()
            self.value()
            self.ws()
            c = self.take()
            if c == closer:
                return
            if c != ",":
                raise ValueError(f"expected ',' or {closer!r} at {self.i}")

    def string(self) -> None:
        self.take()
        while True:
            c = self.take()
            if c == '"':
                return
            if ord(c) < 0x20:
                raise ValueError(f"raw control character in a string at {self.i}")
            if c == "\\":
                e = self.take()
                if e == "u":
                    for _ in range(4):
                        if self.take() not in _HEX:
                            raise ValueError(f"bad \\u escape at {self.i}")
                elif e not in '"\\/bfnrt':
                    raise ValueError(f"bad escape at {self.i}")

    def number(self) -> None:
        end = self.i
        while end < len(self.s) and self.s[end] in "+-0123456789.eE":
            end += 1
        run = self.s[self.i:end]
        if end == len(self.s) and _NUMBER_PREFIX.fullmatch(run):
            raise _Ended
        if not _NUMBER.fullmatch(run):
            raise ValueError(f"bad number {run!r}")
        self.i = end


def json_prefix(text: str) -> bool:
    """True when `text` is one JSON document (surrounding whitespace allowed) or a beginning of one."""
    p = _Parser(text)
    try:
        p.ws()
        p.value()
        p.ws()
    except _Ended:
        return True
    except ValueError:
        return False
    return p.i == len(text)
