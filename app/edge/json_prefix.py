"""Whether text streamed so far can still begin a JSON object: the Anthropic door's tool arguments.

Anthropic's SDK parses a tool call's `input_json_delta` fragments after every one of them with a
partial-JSON parser (jiter's `partial_mode`), and a fragment no JSON document could follow from
(`{'q': 1}`, `{"a": True}`, `{"a": 1,}`, a raw control character in a string) fails the client's
whole stream. Anthropic itself only ever streams valid JSON; an upstream model's arguments are not
always valid. So the door feeds each fragment to a `JSONPrefix` and stops streaming a call at the
first fragment that breaks RFC 8259's grammar: what went out is a prefix the SDK reads (its
`input` is what that prefix holds), while the JSON answer's `input` is `{}` for arguments that do
not parse whole.

A character-level state machine, for fragments of a few characters each (not for the text
deltas): a string's plain run is skipped by one regular-expression match. Leading blanks are held
back (`take` returns "" for them) so that a call whose arguments open with anything but `{`
streams nothing at all.
"""

from __future__ import annotations

import re

_PLAIN = re.compile(r'[^"\\\x00-\x1f]*')  # a run of a string's characters that need no attention
_BLANKS = frozenset(" \t\n\r")
_HEX = frozenset("0123456789abcdefABCDEF")
_ESCAPES = frozenset('"\\/bfnrt')
_LITERALS = {"t": "rue", "f": "alse", "n": "ull"}
_CLASS = {"0": "0", **dict.fromkeys("123456789", "1"), ".": ".", "e": "e", "E": "e", "+": "+", "-": "-"}
_NUMBER = {  # (number state, character class) → number state: RFC 8259's `number`
    ("-", "0"): "zero",
    ("-", "1"): "int",
    ("zero", "."): "dot",
    ("zero", "e"): "e",
    ("int", "0"): "int",
    ("int", "1"): "int",
    ("int", "."): "dot",
    ("int", "e"): "e",
    ("dot", "0"): "frac",
    ("dot", "1"): "frac",
    ("frac", "0"): "frac",
    ("frac", "1"): "frac",
    ("frac", "e"): "e",
    ("e", "+"): "sign",
    ("e", "-"): "sign",
    ("e", "0"): "exp",
    ("e", "1"): "exp",
    ("sign", "0"): "exp",
    ("sign", "1"): "exp",
    ("exp", "0"): "exp",
    ("exp", "1"): "exp",
}
_NUMBER_ENDS = frozenset({"zero", "int", "frac", "exp"})

# what comes next
_START = 0  # blanks, then the `{` that opens the object
_VALUE = 1  # a value (after `:`, or `,` in an array)
_FIRST_KEY = 2  # after `{`: a key or `}`
_KEY = 3  # after `,` in an object
_COLON = 4
_AFTER = 5  # after a value inside a container: `,` or its closing bracket
_FIRST_VALUE = 6  # after `[`: a value or `]`
_STRING = 7
_ESCAPE = 8
_UNICODE = 9
_NUMBER_STATE = 10
_LITERAL = 11
_DONE = 12  # the object closed: blanks only
_BROKEN = 13  # no JSON document begins like this
_LOW_ESCAPE = 14  # after a high surrogate's `\\uD8xx`: the `\\` of its low half
_LOW_U = 15  # and its `u`


class JSONPrefix:
    """Feed a call's argument fragments in order to `take`."""

    __slots__ = ("_held", "_hex", "_high", "_key", "_left", "_number", "_stack", "_state")

    def __init__(self) -> None:
        self._state = _START
        self._stack: list[str] = []  # the open containers' closing brackets
        self._key = False  # the open string is an object's key
        self._left = ""  # a literal's characters still due
        self._hex = ""  # a \\u escape's hex digits so far
        self._high = False  # that escape is a surrogate pair's low half, due after its high one
        self._number = ""
        self._held = ""  # blanks before the object opened

    def take(self, fragment: str) -> str | None:
        """What to stream of `fragment` ("" while only blanks came), or None once the arguments can no
        longer be JSON (this fragment, and every one after it)."""
        if self._state == _BROKEN or not self._feed(fragment):
            self._state = _BROKEN
            return None
        if self._state == _START:
            self._held += fragment
            return ""
        text, self._held = self._held + fragment, ""
        return text

    def _feed(self, text: str) -> bool:
        i, n = 0, len(text)
        while i < n:
            state = self._state
            if state == _STRING:
                i = _PLAIN.match(text, i).end()  # type: ignore[union-attr]  # the pattern matches ""
                if i == n:
                    return True
                char = text[i]
                if char == '"':
                    self._state = _COLON if self._key else self._after_value()
                elif char == "\\":
                    self._state = _ESCAPE
                else:
                    return False  # a raw control character
            elif state == _NUMBER_STATE:
                step = _NUMBER.get((self._number, _CLASS.get(text[i], "")))
                if step is None:
                    if self._number not in _NUMBER_ENDS:
                        return False
                    self._state = self._after_value()
                    continue  # the character after the number, read in its container's state
                self._number = step
            elif not self._step(state, text[i]):
                return False
            i += 1
        return True

    def _step(self, state: int, char: str) -> bool:
        if state == _ESCAPE:
            if char == "u":
                self._state, self._hex = _UNICODE, ""
                return True
            self._state = _STRING
            return char in _ESCAPES
        if state == _UNICODE:
            self._hex += char
            return char in _HEX and (len(self._hex) < 4 or self._escaped())
        if state in (_LOW_ESCAPE, _LOW_U):  # a high surrogate is only ever followed by its low half
            self._state = _LOW_U if state == _LOW_ESCAPE else _UNICODE
            self._hex = ""
            return char == ("\\" if state == _LOW_ESCAPE else "u")
        if state == _LITERAL:
            if char != self._left[0]:
                return False
            self._left = self._left[1:]
            if not self._left:
                self._state = self._after_value()
            return True
        if char in _BLANKS:
            return True
        return self._structural(state, char)

    def _structural(self, state: int, char: str) -> bool:
        """`char`, not blank, where a token begins."""
        if state == _START:
            return self._open(char) if char == "{" else False
        if state in (_FIRST_KEY, _KEY):
            if char == "}" and state == _FIRST_KEY:
                return self._close("}")
            self._state, self._key = _STRING, True
            return char == '"'
        if state == _COLON:
            self._state = _VALUE
            return char == ":"
        if state == _AFTER:
            if char == ",":
                self._state = _KEY if self._stack[-1] == "}" else _VALUE
                return True
            return self._close(char)
        if state == _FIRST_VALUE and char == "]":
            return self._close("]")
        if state in (_VALUE, _FIRST_VALUE):
            return self._value(char)
        return False  # _DONE: the object closed, and something follows it

    def _escaped(self) -> bool:
        """A whole `\\uXXXX`: a surrogate must be half of a pair (high, then low), as jiter wants."""
        code = int(self._hex, 16)
        low = 0xDC00 <= code <= 0xDFFF
        if self._high:
            self._high, self._state = False, _STRING
            return low
        if 0xD800 <= code <= 0xDBFF:
            self._high, self._state = True, _LOW_ESCAPE
            return True
        self._state = _STRING
        return not low

    def _value(self, char: str) -> bool:
        if char in "{[":
            return self._open(char)
        if char == '"':
            self._state, self._key = _STRING, False
            return True
        if char in _LITERALS:
            self._state, self._left = _LITERAL, _LITERALS[char]
            return True
        kind = _CLASS.get(char)
        if kind in ("0", "1", "-"):
            self._state = _NUMBER_STATE
            self._number = {"0": "zero", "1": "int", "-": "-"}[kind]
            return True
        return False

    def _open(self, bracket: str) -> bool:
        self._stack.append("}" if bracket == "{" else "]")
        self._state = _FIRST_KEY if bracket == "{" else _FIRST_VALUE
        return True

    def _close(self, bracket: str) -> bool:
        if not self._stack or self._stack[-1] != bracket:
            return False
        self._stack.pop()
        self._state = self._after_value()
        return True

    def _after_value(self) -> int:
        return _AFTER if self._stack else _DONE
