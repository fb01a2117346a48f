"""One family of errors: everything Tether raises on purpose is a `TetherError`, keeps the
built-in base callers caught before, and the ones users catch come from `tether` itself."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import tether
import tether_operator
from tether.errors import ConfigError, TetherError

PROGRAMS = (
    "tether.programs.worker.asgi",
    "tether.programs.worker.hypercorn_config",
    "tether.programs.worker.deadline",
)
"""Entry points that act when imported (they read the spec, harden the process): no errors."""


def modules() -> list[str]:
    names = []
    for package in (tether, tether_operator):
        root = Path(package.__file__).parent
        for info in pkgutil.walk_packages([str(root)], prefix=f"{package.__name__}."):
            if not info.name.endswith("__main__") and info.name not in PROGRAMS:
                names.append(info.name)
    return names


def test_every_error_tether_defines_is_a_tether_error() -> None:
    strays = []
    for name in modules():
        module = importlib.import_module(name)
        for _, value in inspect.getmembers(module, inspect.isclass):
            if (
                value.__module__ == name
                and issubclass(value, BaseException)
                and not issubclass(value, TetherError)
            ):
                strays.append(f"{name}.{value.__qualname__}")
    assert strays == []


@pytest.mark.parametrize(
    ("error", "builtin"),
    [
        ("tether.spec.SpecError", ValueError),
        ("tether.programs.sidecar.settings.SidecarConfigError", ValueError),
        ("tether.programs.webhooks.SignatureError", ValueError),
        ("tether.agent.agent.AgentBusyError", RuntimeError),
        ("tether._optional.MissingExtraError", ModuleNotFoundError),
        ("tether_operator.settings.SettingsError", ValueError),
    ],
)
def test_each_keeps_the_builtin_base_it_had(error: str, builtin: type) -> None:
    module, _, name = error.rpartition(".")
    assert issubclass(getattr(importlib.import_module(module), name), builtin)


def test_users_catch_them_from_tether() -> None:
    for name in (
        "TetherError",
        "ConfigError",
        "ToolError",
        "ProviderError",
        "JournalMismatchError",
    ):
        assert issubclass(getattr(tether, name), TetherError)
    assert issubclass(tether.spec.SpecError, ConfigError)
