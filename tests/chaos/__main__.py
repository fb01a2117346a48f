"""`make chaos`: the chaos scenario on a local stack; exits 1 on any violation.

.venv/bin/python -m tests.chaos --seconds 60 --seed 1 --runs 100
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tests.chaos.local import LocalPlatform
from tests.chaos.scenario import run_scenario


def turns(chaos_seconds: float) -> int:
    """Tool turns per run (of about a second each, more with kills): the runs started in the
    first half of the window go on into its second half."""
    return max(3, round(chaos_seconds / 4))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0, help="the window of kills")
    parser.add_argument("--seed", type=int, default=1, help="seeds the killer")
    parser.add_argument("--runs", type=int, default=100, help="concurrent runs")
    parser.add_argument("--timeout", type=float, default=1200.0, help="for everything")
    parser.add_argument(
        "--kinds", default="worker,restate,sidecar", help="what to kill (comma-separated)"
    )
    parser.add_argument("--keep", type=Path, help="a directory to keep the stack's files in")
    args = parser.parse_args(argv)
    with LocalPlatform(turns(args.seconds), args.keep) as platform:
        platform.kill_kinds = tuple(args.kinds.split(","))
        report = run_scenario(
            platform,
            runs=args.runs,
            chaos_seconds=args.seconds,
            seed=args.seed,
            timeout=args.timeout,
            log=lambda line: print(line, flush=True),
        )
    print(report.summary(), flush=True)
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
