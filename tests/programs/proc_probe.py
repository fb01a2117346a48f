"""What a `shell` tool's command can learn of the processes around it, run as that command.

    python proc_probe.py [STOP_PID]
    python proc_probe.py --pids PID...

It walks up from its own parent (`/proc/<pid>/status` PPid) to PID 1, or to STOP_PID (the test
that started it all, left out), and for each ancestor prints its environment (`environ`) and
any `NAME=value` of a secret found in its memory (`maps` + `mem`), or why it could not read
them. Then it reads `/proc/1/environ` and prints the secrets (`NAME=value`) it finds in the
`environ` of every process. It first prints its own effective capabilities: a process with
CAP_SYS_PTRACE (root's default) reads any process, dumpable or not, and would prove nothing.
With `--pids`, it reads those processes instead of its ancestors, and prints only the secrets
found in their environment (and in their memory, for Python processes).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

NAMES = (b"TETHER_WEBHOOK_SECRET", b"ANTHROPIC_API_KEY", b"OPENAI_API_KEY")
FOUND = re.compile(b"(?:" + b"|".join(NAMES) + rb")=[\x21-\x7e]{1,200}")
LARGEST_REGION = 256 * 1024 * 1024


def parent_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    return 0


def environ(pid: int) -> str:
    try:
        data = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError as error:
        return f"environ: cannot read ({error.strerror})"
    return "environ: " + data.replace(b"\0", b" ").decode(errors="replace")


def memory(pid: int) -> str:
    """`NAME=value` of the secrets found in the process's readable memory."""
    found: set[bytes] = set()
    try:
        maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
        with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
            for line in maps:
                span, perms = line.split()[:2]
                start, end = (int(x, 16) for x in span.split("-"))
                if not perms.startswith("r") or end - start > LARGEST_REGION:
                    continue
                try:
                    mem.seek(start)
                    found.update(FOUND.findall(mem.read(end - start)))
                except OSError:
                    continue  # [vvar] and the like
    except OSError as error:
        return f"memory: cannot read ({error.strerror})"
    return "memory: " + (b" ".join(sorted(found)).decode(errors="replace") or "nothing found")


def command_of(pid: int) -> str:
    return (
        Path(f"/proc/{pid}/cmdline")
        .read_bytes()
        .replace(b"\0", b" ")[:200]
        .decode(errors="replace")
    )


def main() -> None:
    status = Path("/proc/self/status").read_text()
    print("self", re.search(r"CapEff:\s*(\S+)", status).group(0))  # type: ignore[union-attr]
    if sys.argv[1:2] == ["--pids"]:
        for pid in map(int, sys.argv[2:]):
            command, env = command_of(pid), environ(pid)
            if not env.startswith("environ: cannot"):
                found = b" ".join(FOUND.findall(env.encode())).decode()
                env = f"environ: {found or 'no secret'}"
            print(f"pid {pid}: {command}\n  {env}")
            print(f"  {memory(pid) if 'python' in command else 'memory: not scanned'}")
        print(f"self {os.getpid()}: probe done")
        return
    stop = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    pid = parent_of(os.getpid())
    while pid > 1 and pid != stop:
        print(f"ancestor {pid}: {command_of(pid)}")
        print(f"  {environ(pid)}")
        print(f"  {memory(pid)}")
        pid = parent_of(pid)
    print(f"pid 1 {environ(1)}")
    for entry in sorted(Path("/proc").iterdir(), key=lambda p: p.name):
        if entry.name.isdigit():
            found = FOUND.findall(environ(int(entry.name)).encode())
            if found:
                print(f"pid {entry.name} environ holds {b' '.join(found).decode()}")
    print(f"self {os.getpid()}: probe done")


if __name__ == "__main__":
    main()
