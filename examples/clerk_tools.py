"""The release clerk's own tools (a user module, referenced from the manifest by import path).

They write to `ledger.log` in the working directory, so a demo can prove what ran and how often.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from tether import tool

DEPLOY_SECONDS = 2.0


def ledger(line: str) -> None:
    with Path("ledger.log").open("a") as f:
        f.write(line + "\n")


@tool
async def deploy(version: str) -> str:
    """Deploy a version to production. Slow, and not safe to repeat."""
    ledger(f"deploy {version} started")
    await asyncio.sleep(DEPLOY_SECONDS)
    ledger(f"deploy {version} finished")
    return f"deployed {version}"


@tool(replay="safe")
async def check_health() -> str:
    """Check production health and the deployed version (read-only)."""
    return "healthy; serving version 1.4.0"
