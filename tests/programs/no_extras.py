"""Run a script or a module as if some packages were not installed: the top-level modules named
by `--block` are unimportable (a `sys.meta_path` finder refuses them). The list of what the extras
bring is the test's (`tests/test_optional_extras.py`).

    python no_extras.py --block=restate,fastapi tiny_agent.py <args>   # a script
    python no_extras.py --block=anthropic -m tether run <args>         # a module, as `python -m`
"""

from __future__ import annotations

import importlib.abc
import runpy
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType


class NoExtras(importlib.abc.MetaPathFinder):
    def __init__(self, blocked: frozenset[str]) -> None:
        self.blocked = blocked

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname.partition(".")[0] in self.blocked:
            raise ModuleNotFoundError(f"No module named {fullname!r} (blocked)", name=fullname)
        return None


def main() -> None:
    if not sys.argv[1].startswith("--block="):
        sys.exit("usage: no_extras.py --block=<module>,... (-m module | script) [args...]")
    blocked = frozenset(sys.argv.pop(1).removeprefix("--block=").split(","))
    loaded = sorted(name for name in sys.modules if name.partition(".")[0] in blocked)
    assert not loaded, f"imported before the finder was installed: {loaded}"
    sys.meta_path.insert(0, NoExtras(blocked))
    if sys.argv[1] == "-m":
        sys.argv = sys.argv[2:]
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    else:
        sys.argv = sys.argv[1:]
        runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
