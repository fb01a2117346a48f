"""`Lifecycle`: `with` for what starts and closes (a server, a local stack, a test harness)."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class Lifecycle:
    """`with x:` starts `x` and closes it afterwards, and closes it as well when starting fails
    halfway, so what did start is stopped. Subclasses define `start` and `close`."""

    def start(self) -> object:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
