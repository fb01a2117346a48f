"""The test suite uses `tether.testing` as users do: its fixtures, and the failure record its
fixtures (and `tests/restate/conftest.py`'s) print logs by (`dump_logs_if_failed`)."""

pytest_plugins = ["tether.testing"]
