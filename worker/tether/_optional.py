"""Optional dependencies: a part of Tether used without its extra says which one to install.

`pip install tether` is the library with the embedded runtimes (memory, SQLite) and the scripted
model. The rest comes with extras (`pyproject.toml`): `anthropic`, `openai`, `restate`,
`sidecar`, `operator`, `mcp`, `otel`. A part that needs one checks it first thing, for example
`tether.restate`:

    with extra_imports("tether.restate", "restate", "restate"):
        from .runtime import RestateRuntime, restate_runtime
        ...

and without restate-sdk its import raises `MissingExtraError` (a `ModuleNotFoundError`):
"tether.restate requires the restate extra: pip install 'tether[restate]' (restate-sdk is not
installed)".
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from .errors import TetherError

EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "anthropic": ("anthropic",),
    "openai": ("openai",),
    # The worker counts its work in tether.programs.metrics (prometheus_client) and runs under
    # hypercorn.
    "restate": ("restate", "hypercorn", "prometheus_client"),
    "sidecar": (
        "fastapi",
        "starlette",
        "uvicorn",
        "aiohttp",
        "prometheus_client",
        "standardwebhooks",
    ),
    "operator": ("kopf", "aiohttp", "prometheus_client"),
    "mcp": ("mcp",),
    # Traces of agent runs (tether.programs.tracing): the SDK and its OTLP/HTTP exporter.
    "otel": ("opentelemetry",),
}
"""What each extra of `pyproject.toml` makes importable (top-level import names)."""

DISTRIBUTIONS = {
    "restate": "restate-sdk",
    "prometheus_client": "prometheus-client",
    "opentelemetry": "opentelemetry-sdk",
}
"""The distribution of an import name, where the two differ."""


class MissingExtraError(TetherError, ModuleNotFoundError):
    """A part of Tether was used without the extra that installs what it needs."""


def missing_extra(part: str, extra: str, module: str) -> MissingExtraError:
    """The error of `part`, which needs `module` from the extra `extra`."""
    return MissingExtraError(
        f"{part} requires the {extra} extra: pip install 'tether[{extra}]' "
        f"({DISTRIBUTIONS.get(module, module)} is not installed)",
        name=module,
    )


def installed(module: str) -> bool:
    """Whether the top-level module `module` can be imported. It is looked up, not imported: the
    check is cheap, and prometheus_client (to be imported once `PROMETHEUS_MULTIPROC_DIR` is set)
    is not imported early."""
    if module in sys.modules:
        return sys.modules[module] is not None  # None: imports of it are blocked
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a finder that refuses it, or a module without a spec
        return False


def require_extra(part: str, extra: str, *modules: str) -> None:
    """Raise `MissingExtraError` naming `extra` unless each of `modules` (by default, all that
    the extra installs) is installed."""
    for module in modules or EXTRA_MODULES[extra]:
        if not installed(module):
            raise missing_extra(part, extra, module) from None


@contextmanager
def extra_imports(part: str, extra: str, *modules: str) -> Iterator[None]:
    """`require_extra`, then the imports of the block: a `ModuleNotFoundError` of one of
    `modules` that they raise anyway becomes the same sentence."""
    needed = modules or EXTRA_MODULES[extra]
    require_extra(part, extra, *needed)
    try:
        yield
    except MissingExtraError:
        raise
    except ModuleNotFoundError as error:
        module = (error.name or "").partition(".")[0]
        if module not in needed:
            raise
        raise missing_extra(part, extra, module) from None
