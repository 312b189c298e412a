"""One honored llama-server option (its flags, variable, kind and checks) and how the command
reads it from the environment and refuses the values and spellings the reference refuses."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from deployments.cli.refused import Refused


@dataclass(frozen=True)
class Option:
    """One honored llama-server option: its flags, its environment variable, where it lands."""

    flags: tuple[str, ...]
    dest: str
    env: str | None = None
    kind: Callable[[str], Any] | None = str
    help: str = ""
    negative: tuple[str, ...] = ()  # --no-X flags of a boolean option
    # a switch mlxray honors one way only: the value it always has (the other way is refused,
    # naming the spelling given, with this reason)
    only: bool | None = None
    reason: str = ""
    # the reference's refusal of a value it parses (its message), None for a value it takes
    check: Callable[[Any], str | None] | None = None
    repeat: bool = False  # repeatable: each use extends the list ``kind`` makes of its value

    def spellings(self, value: bool) -> tuple[str, ...]:
        return self.flags if value else self.negative


def bool_env(value: str) -> bool:
    """llama-server's reading of a boolean variable."""
    return value.strip().lower() in ("1", "true", "on", "enabled", "yes")


def from_env(opt: Option, environ: dict[str, str]) -> Any:
    raw = environ.get(opt.env) if opt.env else None
    if raw is None:
        return None
    if opt.kind is None:
        return bool_env(raw)
    try:
        return opt.kind(raw)
    except ValueError:
        raise Refused(f"{opt.env}={raw!r} is not a valid {opt.flags[-1]}") from None


def check_value(opt: Option, value: Any, argv: Sequence[str] | None) -> None:
    """A value the reference refuses, with its message, naming the spelling given (``argv``)
    or, when the value came from the environment, the variable."""
    error = opt.check(value) if opt.check and value is not None else None
    if error is None:
        return
    if argv is None:
        raise Refused(f'error while handling environment variable "{opt.env}": {error}')
    name = [a.split("=", 1)[0] for a in argv if a.split("=", 1)[0] in opt.flags][-1]
    raise Refused(f'error while handling argument "{name}": {error}')


def check_only(opt: Option, value: Any, argv: Sequence[str], environ: dict[str, str]) -> None:
    """A one-way switch set the other way is refused, naming the spelling or variable given."""
    if opt.only is None or value is None or value == opt.only:
        return
    given = [a for a in argv if a in opt.spellings(not opt.only)]
    name = given[-1] if given else f"{opt.env}={environ.get(opt.env or '', '')}"
    raise Refused(f"mlxray does not honor {name}: {opt.reason}")
