"""The test suite uses `tether.testing` as users do: its fixtures, and the failure record its
fixtures (and `tests/restate/conftest.py`'s) print logs by (`dump_logs_if_failed`). The trace
tests share a real OpenTelemetry Collector (`collector`, `tests/otelcol.py`), and the tests of the
real model SDKs a server speaking their wire formats (`model_server`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.model_server import ModelServer
from tests.otelcol import Collector

pytest_plugins = ["tether.testing"]


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[Collector]:
    with Collector(tmp_path.with_name(f"{tmp_path.name}-otelcol")) as running:
        yield running


@pytest.fixture
def model_server() -> Iterator[ModelServer]:
    with ModelServer() as server:
        yield server
