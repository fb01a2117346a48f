"""`python -m tether.sandbox POLICY -- PROGRAM [ARG...]`: exec PROGRAM confined to POLICY (the
JSON of a `policy.Policy`), for programs that code other than Tether's starts. Exits 126 when it
cannot confine, 127 when PROGRAM is not found, saying why on stderr."""

from __future__ import annotations

import os
import sys

from .policy import Policy


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: python -m tether.sandbox POLICY -- PROGRAM [ARG...]", file=sys.stderr)
        return 2
    program = argv[3:]
    try:
        confinement = Policy.from_json(argv[1]).confinement()
        confinement.apply()
    except (OSError, ValueError, KeyError, TypeError) as error:
        print(f"tether.sandbox: cannot confine {program[0]}: {error}", file=sys.stderr)
        return 126
    try:
        os.execvp(program[0], program)
    except OSError as error:
        print(f"tether.sandbox: cannot run {program[0]}: {error}", file=sys.stderr)
        return 127 if isinstance(error, FileNotFoundError) else 126


if __name__ == "__main__":
    sys.exit(main(sys.argv))
