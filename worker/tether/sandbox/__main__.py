"""`python -I -m tether.sandbox`: exec the program of the launch in its environment
(`launch.Launch.command`) confined to its policy. Exits 126 when it cannot confine or run the
program, 127 when the program is not there, saying why on stderr; never runs it unconfined."""

from __future__ import annotations

import os
import sys

from .launch import LAUNCH_ENV, Launch


def main() -> int:
    try:
        launch = Launch.taken_from(os.environ)
    except (KeyError, ValueError, TypeError) as error:
        print(f"tether.sandbox: no launch in ${LAUNCH_ENV}: {error!r}", file=sys.stderr)
        return 2
    program = launch.argv[0]
    try:
        launch.policy.confinement().apply()
        os.chdir(launch.cwd)
    except OSError as error:
        print(f"tether.sandbox: cannot confine {program}: {error}", file=sys.stderr)
        return 126
    try:
        os.execve(program, launch.argv, dict(launch.env))
    except OSError as error:
        print(f"tether.sandbox: cannot run {program}: {error}", file=sys.stderr)
        return 127 if isinstance(error, FileNotFoundError) else 126


if __name__ == "__main__":
    sys.exit(main())
