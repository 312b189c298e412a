"""What llama.cpp's JSON-schema converter (common/json-schema-to-grammar.cpp, b10587) refuses,
with its texts: a ``$ref`` it cannot resolve, a pattern that is not a valid regex, a schema it
does not recognize. Everything else it takes, leaving out what it cannot enforce (its
warnings are not repeated here: llguidance, engine/grammar_text.py, enforces more than the
reference's converter, and warns about what it leaves out).

The walk follows the reference's ``visit``: the same branch order, so a subschema the
reference never visits (an unreferenced ``$defs`` entry) is not checked either.
"""

from __future__ import annotations

import json
import re
from typing import Any

PRIMITIVES = {"boolean", "number", "integer", "value", "object", "array", "uuid", "char",
              "string", "null"}
_NON_LITERAL = set("|.()[]{}*+?^$")
_MAX_DEPTH = 100
_HEX = {"x": 2, "u": 4, "U": 8}


def dump(value: Any) -> str:
    """nlohmann's ``dump()``: compact, key order kept, non-ASCII as is."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def refusals(schema: Any) -> list[str]:
    """The reference's errors for ``schema``: it answers 400 ``JSON schema conversion
    failed:\\n`` and them, joined by newlines."""
    walk = _Walk(schema)
    walk.resolve(schema)
    walk.visit(schema)
    return walk.errors


class _Walk:
    def __init__(self, root: Any):
        self.root = root
        self.refs: dict[str, Any] = {}
        self.resolving: set[str] = set()
        self.visited: set[str] = set()
        self.errors: list[str] = []

    def resolve(self, node: Any) -> None:
        """``resolve_refs``' ``visit_refs``: a node with ``$ref`` is not descended into."""
        if isinstance(node, list):
            for item in node:
                self.resolve(item)
        elif isinstance(node, dict):
            if "$ref" not in node:
                for value in node.values():
                    self.resolve(value)
                return
            ref = node["$ref"] if isinstance(node["$ref"], str) else dump(node["$ref"])
            if ref not in self.refs:
                self._resolve_one(ref)

    def _resolve_one(self, ref: str) -> None:
        if ref.startswith("https://"):
            # the server's converter fetches nothing: the document is null
            if "#" not in ref or not ref.split("#", 1)[1]:
                return
            target: Any = None
        elif ref.startswith("#/"):
            target = self.root
        else:
            self.errors.append(f"Unsupported ref: {ref}")
            return
        for sel in ref.split("#", 1)[1].split("/")[1:]:
            if isinstance(target, dict) and sel in target:
                target = target[sel]
                continue
            if isinstance(target, list):
                digits = re.match(r"\s*\+?(\d+)", sel)
                index = int(digits.group(1)) if digits else len(target)
                if index < len(target):
                    target = target[index]
                    continue
            self.errors.append(f"Error resolving ref {ref}: {sel} not in {dump(target)}")
            return
        self.refs[ref] = target

    def visit(self, schema: Any) -> None:
        if not isinstance(schema, dict):
            if schema is not None and schema != []:  # nlohmann's empty(): null, [] only
                self.errors.append(f"Unrecognized schema: {dump(schema)}")
            return
        kind = schema.get("type")
        if "$ref" in schema:
            self._visit_ref(schema["$ref"])
        elif "oneOf" in schema or "anyOf" in schema:
            alts = schema["oneOf"] if "oneOf" in schema else schema["anyOf"]
            for alt in alts if isinstance(alts, list) else []:
                self.visit(alt)
        elif isinstance(kind, list):
            for one in kind:
                self.visit({**schema, "type": one})
        elif "const" in schema or "enum" in schema:
            return
        elif kind in (None, "object") and ("properties" in schema or (
                "additionalProperties" in schema and schema["additionalProperties"] is not True)):
            self._visit_object(schema)
        elif kind in (None, "object", "string") and "allOf" in schema:
            self._visit_all_of(schema["allOf"])
        elif kind in (None, "array") and ("items" in schema or "prefixItems" in schema):
            items = schema["items"] if "items" in schema else schema["prefixItems"]
            for item in items if isinstance(items, list) else [items]:
                self.visit(item)
        elif kind in (None, "string") and isinstance(schema.get("pattern"), str):
            self._visit_pattern(schema["pattern"])
        elif not schema or kind == "object" or kind is None:
            return
        elif not isinstance(kind, str) or kind not in PRIMITIVES:
            self.errors.append(f"Unrecognized schema: {dump(schema)}")

    def _visit_ref(self, ref: Any) -> None:
        ref = ref if isinstance(ref, str) else dump(ref)
        if ref in self.resolving or ref in self.visited:
            return
        self.resolving.add(ref)
        self.visit(self.refs.get(ref))
        self.resolving.discard(ref)
        self.visited.add(ref)

    def _visit_object(self, schema: dict) -> None:
        props = schema.get("properties")
        for value in (props.values() if isinstance(props, dict) else []):
            self.visit(value)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            self.visit(extra)

    def _visit_all_of(self, parts: Any) -> None:
        def component(comp: Any) -> None:
            if isinstance(comp, dict) and "$ref" in comp:
                ref = comp["$ref"] if isinstance(comp["$ref"], str) else dump(comp["$ref"])
                if ref not in self.resolving:
                    self.resolving.add(ref)
                    component(self.refs.get(ref))
                    self.resolving.discard(ref)
            elif isinstance(comp, dict) and isinstance(comp.get("properties"), dict):
                for value in comp["properties"].values():
                    self.visit(value)
        for part in parts if isinstance(parts, list) else []:
            if isinstance(part, dict) and isinstance(part.get("anyOf"), list):
                for alt in part["anyOf"]:
                    component(alt)
            else:
                component(part)

    def _visit_pattern(self, pattern: str) -> None:
        problem = pattern_problem(pattern)
        if problem is not None and problem[0]:
            self.errors.append(f"Invalid pattern {pattern}: {problem[1]}")


def _escape_length(text: str, pos: int) -> int:
    """``gbnf_escape_length``: the length of an escape GBNF also knows, else 0."""
    if pos + 1 >= len(text) or text[pos] != "\\":
        return 0
    nxt = text[pos + 1]
    if nxt in 'trn\\"[]':
        return 2
    n_hex = _HEX.get(nxt, 0)
    if not n_hex or pos + 2 + n_hex > len(text):
        return 0
    digits = text[pos + 2:pos + 2 + n_hex]
    return 2 + n_hex if all(c in "0123456789abcdefABCDEF" for c in digits) else 0


class _Pattern(Exception):
    def __init__(self, invalid: bool, why: str):
        super().__init__(why)
        self.invalid, self.why = invalid, why


def pattern_problem(pattern: str) -> tuple[bool, str] | None:
    """``(invalid, why)`` as the reference's pattern scanner throws it, or None: invalid
    patterns are refused, unsupported ones become "any string" with a warning."""
    if len(pattern) < 2 or pattern[0] != "^" or pattern[-1] != "$":
        return False, "not anchored with '^' and '$'"
    scan = _Scanner(pattern[1:-1])
    try:
        scan.sequence()
        if scan.depth:
            raise _Pattern(True, "unbalanced parentheses")
    except _Pattern as exc:
        return exc.invalid, exc.why
    return None


class _Scanner:
    """The reference's ``_pattern_to_rule`` loop, keeping only what decides its throws."""

    def __init__(self, text: str):
        self.text, self.i, self.depth = text, 0, 0

    def sequence(self) -> None:
        text, n = self.text, len(self.text)
        items = 0
        while self.i < n:
            c = text[self.i]
            if c == "(":
                self._group()
                items += 1
            elif c == ")":
                self.i += 1
                if self.depth == 0:
                    raise _Pattern(True, "unbalanced parentheses")
                self.depth -= 1
                return
            elif c in "^$":
                raise _Pattern(False, "anchor inside the pattern")
            elif c == "[":
                self._class()
                items += 1
            elif c in "*+?" or c == "{":
                self._repeat(c, items)
            else:
                if c not in ".|":
                    self._literal(c)
                else:
                    self.i += 1
                items += 1

    def _group(self) -> None:
        text = self.text
        self.i += 1
        if self.i < len(text) and text[self.i] == "?":
            if self.i + 1 < len(text) and text[self.i + 1] == ":":
                self.i += 2
            else:
                raise _Pattern(False, "unsupported group syntax")
        self.depth += 1
        if self.depth > _MAX_DEPTH:
            raise _Pattern(False, "pattern nesting too deep")
        self.sequence()

    def _class(self) -> None:
        text, n = self.text, len(self.text)
        self.i += 1
        while self.i < n and text[self.i] != "]":
            if text[self.i] == "\\":
                length = _escape_length(text, self.i)
                if not length:
                    raise _Pattern(False, "unsupported escape in character class: "
                                   + text[self.i:self.i + 2])
                self.i += length
            else:
                self.i += 1
        if self.i >= n:
            raise _Pattern(True, "unterminated character class")
        self.i += 1

    def _repeat(self, c: str, items: int) -> None:
        text, n = self.text, len(self.text)
        self.i += 1
        if c == "{":
            start = self.i
            while self.i < n and text[self.i] != "}":
                self.i += 1
            if self.i >= n:
                raise _Pattern(False, "unterminated curly brackets")
            nums = text[start:self.i].split(",")
            self.i += 1
            if len(nums) not in (1, 2):
                raise _Pattern(False, "wrong number of values in curly brackets")
            if not all(_stoi(v) for v in (nums if len(nums) == 1 else [v for v in nums if v])):
                raise _Pattern(False, "invalid number in curly brackets")
        if not items:
            raise _Pattern(True, "nothing to repeat")

    def _literal(self, c: str) -> None:
        text, n = self.text, len(self.text)
        consumed = False
        while self.i < n:
            ch = text[self.i]
            if ch == "\\":
                if self.i == n - 1:
                    raise _Pattern(True, "trailing backslash")
                if text[self.i + 1] in _NON_LITERAL:
                    self.i += 2
                else:
                    length = _escape_length(text, self.i)
                    if not length:
                        raise _Pattern(False, "unsupported escape: " + text[self.i:self.i + 2])
                    self.i += length
            elif ch == '"' or (ch not in _NON_LITERAL and (
                    self.i == n - 1 or not consumed or text[self.i + 1] == "."
                    or text[self.i + 1] not in _NON_LITERAL)):
                self.i += 1
            else:
                break
            consumed = True
        if not consumed:
            raise _Pattern(False, f"unsupported character: {c}")


def _stoi(text: str) -> bool:
    """Whether ``std::stoi`` reads a number from ``text`` (leading blanks, a sign, digits)."""
    return re.match(r"\s*[+-]?\d", text) is not None
