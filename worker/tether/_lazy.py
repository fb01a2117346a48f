"""Lazy package exports: a package names what it offers without importing it first.

`import tether.spec` (the operator) or `import tether.durable.ids` must not load the agent loop or
the SQLite backend just because the package above them re-exports them. A package lists its
exports, module by module, and `lazy_exports` gives it the module-level `__getattr__` and
`__dir__` (PEP 562) that import each on first use.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, tuple[str, ...]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`, whose `exports` maps a submodule (relative,
    `.agent`) to the names it provides."""
    where = {name: module for module, names in exports.items() for name in names}
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value  # the next lookup is a plain attribute
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *where})

    return __getattr__, __dir__
