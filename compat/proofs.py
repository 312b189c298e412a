"""Whether an option's named test passes that option: the test's own text, its decorators and the
module-level data they name (``INVOCATIONS``, ``SERVED_LINE``, ...), read with ast, hold one of the
option's spellings or its variable as a command-line word. A test that never gives the flag
cannot prove what the flag does."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path


@cache
def _module(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(), filename=str(path))
    except (OSError, SyntaxError):
        return None


def _find(tree: ast.Module, name: str) -> ast.AST | None:
    """The test function ``name`` (or ``Class::method``) at the module's top level."""
    cls, _, method = name.rpartition("::")
    body = tree.body
    if cls:
        owner = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == cls), None)
        body = owner.body if owner else []
    return next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and n.name == (method or name)), None)


def _constants(tree: ast.Module) -> dict[str, list[ast.AST]]:
    """Module-level names and the nodes that define them: assignments and helper functions."""
    out: dict[str, list[ast.AST]] = {}
    for node in tree.body:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.setdefault(node.name, []).append(node)
        for target in targets:
            if isinstance(target, ast.Name):
                out.setdefault(target.id, []).append(node)
    return out


def proof_text(path: Path, name: str) -> str:
    """Every string constant in the test and in the module-level definitions it reaches by
    name (transitively), joined by newlines; empty if the test is not there."""
    tree = _module(path)
    found = _find(tree, name) if tree else None
    if found is None:
        return ""
    defined = _constants(tree)
    seen: set[str] = set()
    todo: list[ast.AST] = [found]
    strings: list[str] = []
    while todo:
        node = todo.pop()
        for sub in ast.walk(node):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                strings.append(sub.value)
            elif isinstance(sub, ast.Name) and sub.id in defined and sub.id not in seen:
                seen.add(sub.id)
                todo += defined[sub.id]
    return "\n".join(strings)


def passes(text: str, word: str) -> bool:
    """``word`` appears in ``text`` as a command-line word (``--top-k 1``, ``--top-k=1``, a
    list's ``"--top-k"``), not inside a longer flag."""
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text) is not None


def option_proof_problem(entry: dict, root: Path) -> str | None:
    """Why a supported or aliased option's test does not pass the option, or None."""
    facts, pointer = entry.get("facts", {}), entry.get("test", "")
    file, _, name = pointer.partition("::")
    text = proof_text((root / file).resolve(), name.split("[", 1)[0])
    words = [*facts.get("flags", []), *facts.get("negative", [])]
    words += [facts["env"]] if facts.get("env") else []
    if any(passes(text, w) for w in words):
        return None
    return (f"{pointer} never passes {' / '.join(words)}: a test that does not give the option "
            "proves nothing about it")
