"""`make demo` runs these two programs; they check their own story and exit non-zero when it
does not hold, so the README's first command stays true."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize(
    ("program", "ok"),
    [
        ("crash_demo.py", "OK: the run survived kill -9; nothing was paid for or run twice"),
        ("restate_demo.py", "OK: parked, survived kill -9, approved by webhook, finished"),
    ],
)
def test_the_demo_tells_a_true_story(program: str, ok: str) -> None:
    # The scripted model, whatever keys the machine has: the demo must not cost money here.
    env = {k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY")}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / program)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert ok in done.stdout
