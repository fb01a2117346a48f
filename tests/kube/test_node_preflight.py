"""The real-node tier says what a machine lacks before it changes anything (`make e2e` fails
with these words on a machine without root or Docker, never passes silently)."""

from __future__ import annotations

import pytest

from . import node
from .host import HostError


def test_without_root_the_node_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node.os, "geteuid", lambda: 1000)
    problems = node.check_host()
    assert any("root" in problem for problem in problems)


def test_missing_packages_without_apt_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(HostError, match=r"missing docker\.io.*no apt-get"):
        node.install_packages({"docker": "docker.io"})


def test_nothing_to_install_when_everything_is_there(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    node.install_packages({"/": "filesystem"})  # present: apt-get is never needed
