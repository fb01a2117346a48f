"""Every change a real node makes to this host, written down before it is made, and undone.

A kubelet, kube-proxy, containerd and the CNI plugins change the host far beyond their own
files: sysctls, iptables chains, a bridge, network namespaces, mounts, cgroups, processes that
outlive their parent. :class:`HostLedger` records each change in a JSON file on ``/run`` before
it happens. ``undo()`` reverses them; a test run that was killed leaves the file behind, and the
next run undoes it first, so one crash never breaks the next run.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The ledger of the node that runs (or ran and was killed); one node per host at a time.
LEDGER = Path("/run/tether-kube-node.json")
LOCK = Path("/run/tether-kube-node.lock")
CGROUP_FS = Path("/sys/fs/cgroup")
#: Chain and set prefixes of kube-proxy, kubelet, the CNI plugins and the node's own rules.
OWNED_CHAIN_PREFIXES = ("KUBE-", "CNI-", "TETHER-")


class HostError(RuntimeError):
    """The host lacks something the node needs, or another node holds it."""


def run(*argv: str, check: bool = True, input: str | None = None) -> str:
    """Run a host tool; its stdout. A failure names the command and its stderr."""
    result = subprocess.run(argv, capture_output=True, text=True, input=input, check=False)
    if check and result.returncode != 0:
        raise HostError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


def _start_time(pid: int) -> int | None:
    """The kernel's start time of a process (to tell it from a later one with the same pid)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie (a killed child its parent has not reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _kill_until_gone(pids: Sequence[int], deadline: float) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.05)


@dataclass
class HostLedger:
    """The changes, in the order they were made; ``undo`` walks them backwards."""

    path: Path = LEDGER
    entries: list[dict[str, Any]] = field(default_factory=list)
    _lock_fd: int | None = None

    # -- ownership -------------------------------------------------------------------------

    @contextlib.contextmanager
    def held(self) -> Iterator[HostLedger]:
        """Own the host's node slot: undo a killed run's leftovers, then record this run's."""
        fd = os.open(LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise HostError(
                f"another real-node cluster runs on this host (it holds {LOCK}); stop it first"
            ) from None
        self._lock_fd = fd
        try:
            if self.path.exists():
                stale = HostLedger(self.path, json.loads(self.path.read_text() or "[]"))
                stale.undo()
            self.entries = []
            self._save()
            yield self
        finally:
            try:
                self.undo()
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
                self._lock_fd = None

    def _save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.entries, indent=1))
        tmp.replace(self.path)

    def record(self, kind: str, **details: Any) -> None:
        self.entries.append({"kind": kind, **details})
        self._save()

    # -- changes -----------------------------------------------------------------------------

    def set_sysctl(self, key: str, value: str) -> None:
        path = Path("/proc/sys") / key.replace(".", "/")
        self.keep_sysctls([key])
        path.write_text(value)

    def keep_sysctls(self, keys: Sequence[str]) -> None:
        """Remember sysctls that a component will change (kubelet, kube-proxy) to restore them."""
        saved = {}
        for key in keys:
            path = Path("/proc/sys") / key.replace(".", "/")
            if path.exists():
                saved[key] = path.read_text().strip()
        self.record("sysctls", values=saved)

    def track_process(self, pid: int) -> None:
        """A process (and its group) to kill if the run dies before stopping it."""
        self.record("process", pid=pid, start=_start_time(pid))

    def track_new_entries(self, directory: str) -> None:
        """Entries that appear in ``directory`` from now on are this node's (netns, logs, ...)."""
        path = Path(directory)
        before = sorted(p.name for p in path.iterdir()) if path.is_dir() else []
        self.record("new_entries", directory=directory, before=before)

    # -- undo ----------------------------------------------------------------------------------

    def undo(self) -> None:
        """Reverse every recorded change, newest first; keeps going past individual failures."""
        errors: list[str] = []
        remaining, failed = list(self.entries), []
        while remaining:
            entry = remaining.pop()
            try:
                _UNDO[entry["kind"]](entry)
            except Exception as error:  # one failure must not strand the rest
                errors.append(f"{entry['kind']}: {error}")
                failed.insert(0, entry)
            # What could not be undone stays in the ledger: the next run tries again.
            self.entries = [*remaining, *failed]
            self._save()
        if errors:
            raise HostError("undoing the node's host changes failed:\n" + "\n".join(errors))
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def _undo_sysctls(entry: dict[str, Any]) -> None:
    for key, value in entry["values"].items():
        path = Path("/proc/sys") / key.replace(".", "/")
        if path.read_text().strip() != value:
            path.write_text(value)


def _undo_process(entry: dict[str, Any]) -> None:
    pid = entry["pid"]
    if _start_time(pid) != entry["start"]:
        return  # gone, or the pid now names another process
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    _kill_until_gone([pid], time.monotonic() + 10)


def _undo_processes_matching(entry: dict[str, Any]) -> None:
    """Processes that left their parent's group (containerd's shims) found by command line."""
    needle = entry["needle"].encode()
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if needle in (proc / "cmdline").read_bytes():
                    pids.append(int(proc.name))
            except OSError:
                continue
    _kill_until_gone([p for p in pids if p != os.getpid()], time.monotonic() + 10)


def _undo_cgroup(entry: dict[str, Any]) -> None:
    """Kill everything in the node's cgroup subtree, then remove it in every hierarchy."""
    name = entry["name"].strip("/")
    roots = [h / name for h in CGROUP_FS.iterdir() if (h / name).is_dir()]
    deadline = time.monotonic() + 20
    while True:
        pids = {
            int(line)
            for root in roots
            for procs in root.rglob("cgroup.procs")
            for line in procs.read_text().split()
        }
        if not pids or time.monotonic() > deadline:
            break
        _kill_until_gone(sorted(pids), deadline)
    for root in roots:
        for directory in sorted(root.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            if directory.is_dir():
                with contextlib.suppress(OSError):
                    directory.rmdir()
        with contextlib.suppress(OSError):
            root.rmdir()


def _mount_points() -> list[str]:
    return [
        line.split()[1].encode().decode("unicode_escape")
        for line in Path("/proc/self/mounts").read_text().splitlines()
    ]


def _undo_mounts(entry: dict[str, Any]) -> None:
    """Unmount whatever is mounted at or below ``under``, deepest first."""
    under = entry["under"].rstrip("/")
    for _ in range(5):
        ours = [p for p in _mount_points() if p == under or p.startswith(under + "/")]
        if not ours:
            return
        for point in sorted(ours, key=len, reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def _undo_new_entries(entry: dict[str, Any]) -> None:
    directory = Path(entry["directory"])
    if not directory.is_dir():
        return
    before = set(entry["before"])
    mounted = set(_mount_points())
    for path in directory.iterdir():
        if path.name in before:
            continue
        if str(path) in mounted:  # a network namespace's nsfs bind mount
            subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)
        if path.is_dir() and not path.is_symlink():
            subprocess.run(["rm", "-rf", str(path)], check=False)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def _undo_link(entry: dict[str, Any]) -> None:
    if Path(f"/sys/class/net/{entry['name']}").exists():
        run("ip", "link", "delete", entry["name"])


IPTABLES_FAMILIES = {"iptables": "ip", "ip6tables": "ip6"}


def iptables_tables() -> dict[str, dict[str, list[str]]]:
    """The chains of each table iptables and ip6tables use, as nftables has them
    (`{"filter": ["FORWARD", ...]}`; none where iptables is legacy), for the ledger."""
    return {tool: _nft_chains(family) for tool, family in IPTABLES_FAMILIES.items()}


def _nft_chains(family: str) -> dict[str, list[str]]:
    """Table -> its chains, of one nftables family. (`iptables-save` is no help: it shows the
    base chains of a table whether they exist or not.)"""
    if not shutil.which("nft"):
        return {}
    listed = json.loads(run("nft", "-j", "list", "chains", family, check=False) or "{}")
    tables: dict[str, list[str]] = {}
    for item in listed.get("nftables", []):
        if "chain" in item:
            tables.setdefault(item["chain"]["table"], []).append(item["chain"]["name"])
    return tables


def _undo_iptables(entry: dict[str, Any]) -> None:
    """Drop the chains (and the rules jumping to them) of kube-proxy, kubelet, CNI and ours,
    table by table, leaving every other rule (Docker's) as it is; then, where iptables is
    nftables underneath (a legacy chain or table cannot be removed), the chains and the tables
    that were not there before (`tables`), once empty: a base chain such as `filter INPUT` stays
    after its last rule is gone."""
    for tool, family in IPTABLES_FAMILIES.items():
        saved = run(f"{tool}-save", check=False)
        kept: list[str] = []
        touched = False
        for line in saved.splitlines():
            if any(prefix in line for prefix in OWNED_CHAIN_PREFIXES):
                touched = True
                continue
            kept.append(line)
        if touched:
            run(f"{tool}-restore", input="\n".join(kept) + "\n")
        before = entry.get("tables", {}).get(tool)
        if before is None or "nf_tables" not in run(tool, "--version", check=False):
            continue
        now = run(f"{tool}-save", check=False) if touched else saved
        if isinstance(before, dict):  # a ledger of an older run has the tables only
            new_chains = _new_empty_chains(now, _nft_chains(family), before)
            for table, chain in new_chains:
                run("nft", "delete", "chain", family, table, chain, check=False)
            now = run(f"{tool}-save", check=False) if new_chains else now
        for table in _empty_tables(now) - set(before):
            run("nft", "delete", "table", family, table, check=False)


def _new_empty_chains(
    saved: str, chains: dict[str, list[str]], before: dict[str, list[str]]
) -> list[tuple[str, str]]:
    """(table, chain) of each of `chains` that is not in `before`, and has no rule and no rule
    jumps to in `saved` (an `iptables-save` output)."""
    rules: dict[str, list[list[str]]] = {}
    table = ""
    for line in saved.splitlines():
        if line.startswith("*"):
            table = line[1:]
        elif line.startswith("-A"):
            rules.setdefault(table, []).append(line.split())
    return [
        (table, chain)
        for table, names in chains.items()
        for chain in names
        if chain not in before.get(table, [])
        and not any(chain in rule[1:] for rule in rules.get(table, []))
    ]


def _empty_tables(saved: str) -> set[str]:
    """The tables of an `iptables-save` output with no rule and no chain of their own."""
    tables: dict[str, bool] = {}
    table = ""
    for line in saved.splitlines():
        if line.startswith("*"):
            table = line[1:]
            tables[table] = True
        elif line.startswith("-A") or (line.startswith(":") and " - [" in line):
            tables[table] = False  # a rule, or a user chain (a base chain has a policy)
    return {name for name, empty in tables.items() if empty}


def _undo_ipsets(entry: dict[str, Any]) -> None:
    if run("sh", "-c", "command -v ipset || true").strip():
        for name in run("ipset", "list", "-n", check=False).split():
            if name.startswith(tuple(entry["prefixes"])):
                run("ipset", "destroy", name, check=False)


def _undo_nft_table(entry: dict[str, Any]) -> None:
    run("nft", "delete", "table", entry["family"], entry["name"], check=False)


def _undo_conntrack(entry: dict[str, Any]) -> None:
    for cidr in entry["cidrs"]:
        for flag in ("-s", "-d"):
            run("conntrack", "-D", flag, cidr, check=False)


def _undo_path(entry: dict[str, Any]) -> None:
    subprocess.run(["rm", "-rf", entry["path"]], check=False)


_UNDO = {
    "sysctls": _undo_sysctls,
    "process": _undo_process,
    "processes_matching": _undo_processes_matching,
    "cgroup": _undo_cgroup,
    "mounts": _undo_mounts,
    "new_entries": _undo_new_entries,
    "link": _undo_link,
    "iptables": _undo_iptables,
    "ipsets": _undo_ipsets,
    "nft_table": _undo_nft_table,
    "conntrack": _undo_conntrack,
    "path": _undo_path,
}


# -- what a test compares ------------------------------------------------------------------------

_COUNTERS = re.compile(r"\[\d+:\d+\]|counter packets \d+ bytes \d+")
_SYSCTL_DIRS = ("net/bridge", "net/ipv4/conf/all", "net/ipv4/conf/default", "net/netfilter")
_VOLATILE_SYSCTLS = ("nf_conntrack_count", "nf_conntrack_buckets")
#: Directories where a node leaves entries (network namespaces, log links, CNI state, shims).
ENTRY_DIRS = ("/run/netns", "/var/log/containers", "/var/lib/cni", "/run/containerd/s")


def _listing(directory: str) -> list[str]:
    path = Path(directory)
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.is_dir() else []


def snapshot(extra_sysctls: Sequence[str] = ()) -> dict[str, Any]:
    """Everything a node may change on this host, read so that two readings of an idle host
    are equal (packet counters dropped)."""
    sysctls = {}
    keys = [*extra_sysctls]
    for directory in _SYSCTL_DIRS:
        base = Path("/proc/sys") / directory
        if base.is_dir():
            keys += [str(p.relative_to("/proc/sys")).replace("/", ".") for p in base.iterdir()]
    for key in keys:
        if key.rsplit(".", 1)[-1] in _VOLATILE_SYSCTLS:
            continue
        with contextlib.suppress(OSError):
            sysctls[key] = (Path("/proc/sys") / key.replace(".", "/")).read_text().strip()
    tools = {
        "iptables": ["iptables-save"],
        "ip6tables": ["ip6tables-save"],
        "nftables": ["nft", "list", "ruleset"],
        "links": ["ip", "-o", "link", "show"],
        "addresses": ["ip", "-o", "addr", "show"],
        "routes": ["ip", "route", "show", "table", "all"],
        "ipsets": ["ipset", "list", "-n"],
    }
    readings: dict[str, Any] = {}
    for name, argv in tools.items():
        text = run(*argv, check=False) if shutil.which(argv[0]) else ""
        lines = [_COUNTERS.sub("", line).rstrip() for line in text.splitlines()]
        readings[name] = sorted(line for line in lines if line and not line.startswith("#"))
    readings["mounts"] = sorted(
        line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
    )
    readings["sysctls"] = sysctls
    readings["cgroups"] = sorted(str(h) for h in CGROUP_FS.glob("*/tether-node") if h.is_dir())
    readings["entries"] = {directory: _listing(directory) for directory in ENTRY_DIRS}
    readings["processes"] = sorted(
        cmdline
        for proc in Path("/proc").iterdir()
        if proc.name.isdigit()
        and (cmdline := _cmdline(proc))
        and ("tether-kube-node-" in cmdline or "tether-node" in cmdline)
    )
    return readings


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def differences(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """What changed between two snapshots, one line per difference."""
    lines = []
    for key in before.keys() | after.keys():
        old, new = before.get(key), after.get(key)
        if old == new:
            continue
        if isinstance(old, list) and isinstance(new, list):
            lines += [f"{key}: + {x}" for x in sorted(set(new) - set(old))]
            lines += [f"{key}: - {x}" for x in sorted(set(old) - set(new))]
        elif isinstance(old, dict) and isinstance(new, dict):
            for sub in old.keys() | new.keys():
                if old.get(sub) != new.get(sub):
                    lines.append(f"{key}: {sub}: {old.get(sub)!r} -> {new.get(sub)!r}")
        else:
            lines.append(f"{key}: {old!r} -> {new!r}")
    return lines
