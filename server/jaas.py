"""Kafka's JAAS option strings (``sasl.jaas.config``) parsed as Kafka's JaasConfig parses them (StreamTokenizer rules).

The format is ``<loginModuleClass> <controlFlag> (<optionName>=<optionValue>)*;``: characters 0-32 are whitespace,
``;`` and ``=`` stand alone, ``"`` and ``'`` quote (a quoted string ends at its quote or at the end of the line,
with Java's backslash escapes), ``/`` starts a comment (``//`` and ``/* */`` too, and a lone ``/`` up to the end of
the line), everything else is a word character.  Bounded: the text and the number of options.
"""
from __future__ import annotations

import dataclasses

MAX_JAAS_CHARS = 1 << 20
MAX_OPTIONS = 100_000
CONTROL_FLAGS = ("REQUIRED", "REQUISITE", "SUFFICIENT", "OPTIONAL")
_EOF = object()
_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}


class JaasError(ValueError):
    """A JAAS option string Kafka would refuse; the message is Kafka's."""


@dataclasses.dataclass(frozen=True)
class LoginModule:
    name: str
    control_flag: str
    options: dict[str, str]


def _word_char(c: str) -> bool:
    o = ord(c)
    return 33 <= o <= 128 and c not in ";='\"/" or 160 <= o


def _tokens(text: str):
    """(kind, value) tokens: ("word", text) for words and quoted strings, ("char", c) for ; = and other characters
    that stand alone (Java's ordinary characters)."""
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        o = ord(c)
        if o <= 32:
            i += 1
        elif c == "/":
            if text.startswith("/*", i):
                end = text.find("*/", i + 2)
                i = n if end < 0 else end + 2
            else:                       # "//" or the comment character "/": to the end of the line
                while i < n and text[i] not in "\r\n":
                    i += 1
        elif c in "\"'":
            i += 1
            out = []
            while i < n and text[i] != c and text[i] not in "\r\n":
                ch = text[i]
                if ch == "\\" and i + 1 < n:
                    i += 1
                    ch = text[i]
                    if ch in "01234567":
                        digits = ch
                        limit = 3 if ch <= "3" else 2
                        while len(digits) < limit and i + 1 < n and text[i + 1] in "01234567":
                            i += 1
                            digits += text[i]
                        ch = chr(int(digits, 8))
                    else:
                        ch = _ESCAPES.get(ch, ch)
                out.append(ch)
                i += 1
            if i < n and text[i] == c:
                i += 1
            yield "word", "".join(out)
        elif _word_char(c):
            start = i
            while i < n and _word_char(text[i]):
                i += 1
            yield "word", text[start:i]
        else:
            i += 1
            yield "char", c


def parse(text: str) -> list[LoginModule]:
    """Every login module of a JAAS option string (JaasError with Kafka's message when Kafka refuses it)."""
    if len(text) > MAX_JAAS_CHARS:
        raise JaasError(f"JAAS config longer than {MAX_JAAS_CHARS} characters")
    tokens = _tokens(text)
    modules = []
    for kind, value in tokens:
        name = value if kind == "word" else None
        kind, flag = next(tokens, ("eof", _EOF))
        if kind == "eof":
            raise JaasError("Login module control flag not specified in JAAS config")
        if kind != "word":
            raise JaasError("Login module control flag is not available in the JAAS config")
        if flag.upper() not in CONTROL_FLAGS:
            raise JaasError(f"Invalid login module control flag '{flag}' in JAAS config")
        if name is None:
            raise JaasError("Login module name not specified in JAAS config")
        options: dict[str, str] = {}
        kind, key = next(tokens, ("eof", _EOF))
        while kind != "eof" and not (kind == "char" and key == ";"):
            eq_kind, eq = next(tokens, ("eof", _EOF))
            value_kind, option = next(tokens, ("eof", _EOF)) if (eq_kind, eq) == ("char", "=") else ("eof", _EOF)
            if value_kind != "word":
                raise JaasError(f"Value not specified for key '{key if kind == 'word' else None}' in JAAS config")
            if len(options) >= MAX_OPTIONS:
                raise JaasError(f"more than {MAX_OPTIONS} options in JAAS config")
            options[key if kind == "word" else "null"] = option
            kind, key = next(tokens, ("eof", _EOF))
        if kind == "eof":
            raise JaasError("JAAS config entry not terminated by semi-colon")
        modules.append(LoginModule(name, flag.upper(), options))
    if not modules:
        raise JaasError("Login module not specified in JAAS config")
    return modules


def parse_one(text: str) -> LoginModule:
    """The one login module a broker's ``sasl.jaas.config`` property may hold (Kafka's JaasContext rule)."""
    modules = parse(text)
    if len(modules) != 1:
        raise JaasError(f"JAAS config property contains {len(modules)} login modules, should be 1 module")
    return modules[0]
