"""Reading what a caller sent to a handler that Restate's ingress serves. Anything that reaches
the ingress (the agent's own tools among them) may send anything: a handler's exception that is
not terminal has Restate retry its invocation, holding the object's key all the while, so an
input that broke the parsing in an unexpected way (`1e999` where a number goes, a name too long
for the file system) would lock the object for every other caller. Every fault of an input is a
terminal 400 instead."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from restate.exceptions import TerminalError

T = TypeVar("T")


def parsed(what: str, parse: Callable[[], T]) -> T:
    """`parse()`, or a terminal 400 saying that `what` was expected."""
    try:
        return parse()
    except TerminalError:
        raise
    except Exception as error:  # whatever the input made it raise: the caller's fault
        reason = f"{type(error).__name__}: {error}"[:300]
        raise TerminalError(f"expected {what} ({reason})", status_code=400) from None
