"""Overhead of a tool call through an MCP server over the same work as a direct HTTP call, as
ratios against that floor measured in the same run.

    python bench/mcp_calls.py [--calls 300] [--turns 100] [--repeat 3] [--no-stdio] [--json]

Every server is this script in a process of its own (`--serve <kind>`, in a session of its own,
stopped with its group, its port checked free after) on a free loopback port, polled on
`GET /health` until it answers; both HTTP servers run on uvicorn with the same settings (uvloop,
httptools, no access log):

- the floor: a starlette app whose `POST /add` answers `{"sum": a + b}`, called by a Tether tool
  (`add`, replay="safe") whose body POSTs `{a, b}` with one keep-alive `httpx2.AsyncClient`;
- MCP over streamable HTTP: an `mcp.server.mcpserver.MCPServer` with one tool,
  `async add(a, b) -> int` (readOnlyHint), served by the SDK's `streamable_http_app()` with its
  defaults, called with `MCPToolset.call("add", ...)`. With the SDK 2.3 on both ends the
  protocol negotiated is 2026-07-28: `server/discover` instead of the initialize handshake, no
  session id, one POST per call answered with plain JSON (not SSE, `json_response` or not);
- MCP over stdio (unless `--no-stdio`): the same server, launched by `MCPServer(command=...)`,
  and again confined as a spec's stdio servers are by default (`sandbox=SandboxConfig()`: the
  launcher `python -m tether.sandbox`, a fresh home per connection).

Two levels, each variant warmed up first:

(a) calls: `--calls` calls one after the other per variant, on one open connection (an
    `MCPToolset` connects once and keeps it, as a run does), in rounds of 50 calls that take
    turns (A B C, C B A, ...) so drift hits every variant alike;
(b) agent runs: a scripted agent on the in-memory runtime, `--turns` tool turns (one `add` call
    each) and a final answer, with the HTTP tool or the MCP toolset (which the run lists once at
    its start, on a connection it opens then and closes at the end), the order of the runs
    reversed every repetition. A turn is the time between two model calls (the tool call and
    what the loop does around it); set-up is the run's start to the first model call (the
    listing; for MCP connecting, for stdio launching the server).

Prints calls (turns) per second, the median and p99 latency, the CPU per call (turn) of this
process (the client, and the agent loop) and of the server process, and the ratios MCP / direct
HTTP of the time per call (turn) and of the median latency; medians of `--repeat` repetitions,
with each repetition's ratio. `--json` prints one JSON line instead.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOOPBACK = "127.0.0.1"
SERVER_KINDS = ("http", "mcp-http", "mcp-stdio")
"""What `--serve` starts; the confined stdio variant launches the same stdio server."""
WARMUP_CALLS = 50
WARMUP_TURNS = 20
ROUND = 50
"""Calls in a row of one variant before the next takes its turn."""
LABELS = {
    "http": "direct HTTP (floor)",
    "mcp-http": "MCP streamable HTTP",
    "mcp-stdio": "MCP stdio",
    "mcp-stdio-confined": "MCP stdio, sandboxed",
}
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


# The servers (run in child processes: `--serve <kind>`) ---------------------------------------
# Imports are local so that a server process loads only what it serves.


def floor_app() -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse, Response
    from starlette.routing import Route

    async def add(request: Request) -> Response:
        body = await request.json()
        return JSONResponse({"sum": body["a"] + body["b"]})

    async def health(_: Request) -> Response:
        return PlainTextResponse("ok")

    return Starlette(routes=[Route("/add", add, methods=["POST"]), Route("/health", health)])


def mcp_server() -> Any:
    from mcp.server.mcpserver import MCPServer
    from mcp.types import ToolAnnotations
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse, Response

    # WARNING, not the SDK's INFO: quiet, like the floor.
    server = MCPServer("tether-bench", version="1", log_level="WARNING")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.custom_route("/health", methods=["GET"])  # type: ignore[untyped-decorator]
    async def health(_: Request) -> Response:
        return PlainTextResponse("ok")

    return server


def serve(kind: str, port: int) -> None:
    if kind == "mcp-stdio":
        mcp_server().run("stdio")
        return
    import uvicorn

    # The MCP app with the SDK's defaults (as `MCPServer.run("streamable-http")` builds it).
    app = floor_app() if kind == "http" else mcp_server().streamable_http_app(host=LOOPBACK)
    uvicorn.run(
        app,
        host=LOOPBACK,
        port=port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
    )


class ServerProcess:
    """`python bench/mcp_calls.py --serve <kind>` on a free loopback port, for the `with` block:
    in a session of its own, ready once `GET /health` answers 200 (polled), stopped with its
    whole group, its port checked free after."""

    def __init__(self, kind: str, log_dir: Path) -> None:
        self.kind = kind
        self.log = log_dir / f"{kind}.log"
        self.port = 0
        self.popen: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def __enter__(self) -> ServerProcess:
        for _attempt in range(3):  # a port picked free may be taken before the server binds it
            if self._start():
                return self
        raise RuntimeError(f"the {self.kind} server did not start; log:\n{self._log_tail()}")

    def __exit__(self, *exc: object) -> None:
        self._stop()

    def _start(self) -> bool:
        from tether.programs.restate_server import free_port

        self.port = free_port()
        command = [sys.executable, __file__, "--serve", self.kind, "--port", str(self.port)]
        with open(self.log, "ab") as out:
            self.popen = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while self.popen.poll() is None:
            with (
                contextlib.suppress(OSError, urllib.error.URLError),
                _NO_PROXY.open(f"{self.url}/health", timeout=2) as response,
            ):
                if response.status == 200:
                    return True
            if time.monotonic() > deadline:
                self._stop()
                raise RuntimeError(f"the {self.kind} server did not answer /health in 60 s")
            time.sleep(0.02)  # between two probes
        self._stop()
        if "address already in use" in self._log_tail().lower():
            return False
        raise RuntimeError(f"the {self.kind} server exited; log:\n{self._log_tail()}")

    def _stop(self) -> None:
        from tether.programs.process_group import stop_group

        if self.popen is None:
            return
        stop_group(self.popen, grace=5)
        self.popen = None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection((LOOPBACK, self.port), timeout=1).close()
            except OSError:
                return  # nothing listens on the port any more
            time.sleep(0.02)
        raise RuntimeError(f"port {self.port} of the {self.kind} server is still taken")

    def _log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-4000:]
        except OSError:
            return ""


# Measuring -------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process so far (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98]


@dataclass
class Sample:
    """One measurement of one variant: per-item latencies, the seconds the items took and the
    CPU seconds spent meanwhile; for an agent run also the whole run and its set-up."""

    latencies: list[float]
    seconds: float
    client_cpu: float
    server_cpu: float
    run_seconds: float = 0.0
    setup: float = 0.0

    @property
    def per_item(self) -> float:
        return self.seconds / len(self.latencies)

    @staticmethod
    def merge(parts: list[Sample]) -> Sample:
        """The rounds of one repetition as one sample."""
        return Sample(
            latencies=[t for part in parts for t in part.latencies],
            seconds=sum(part.seconds for part in parts),
            client_cpu=sum(part.client_cpu for part in parts),
            server_cpu=sum(part.server_cpu for part in parts),
        )


@dataclass
class Variant:
    """One way to make the call (or run the agent): `measure(n)` times n calls (a run of n
    tool turns)."""

    name: str
    label: str
    measure: Callable[[int], Awaitable[Sample]]
    samples: list[Sample] = field(default_factory=list)

    def summary(self, floor: Variant | None) -> dict[str, Any]:
        s = self.samples

        def median(value: Callable[[Sample], float]) -> float:
            return statistics.median(value(x) for x in s)

        out: dict[str, Any] = {
            "per_s": median(lambda x: 1 / x.per_item),
            "median_ms": 1000 * median(lambda x: statistics.median(x.latencies)),
            "p99_ms": 1000 * median(lambda x: p99(x.latencies)),
            "client_cpu_ms": 1000 * median(lambda x: x.client_cpu / len(x.latencies)),
            "server_cpu_ms": 1000 * median(lambda x: x.server_cpu / len(x.latencies)),
        }
        if s[0].run_seconds:
            out["run_ms"] = 1000 * median(lambda x: x.run_seconds)
            out["setup_ms"] = 1000 * median(lambda x: x.setup)
        if floor is not None:
            # Per repetition: this variant's time per item over the floor's in the same one.
            pairs = list(zip(s, floor.samples, strict=True))
            out["ratios"] = [x.per_item / f.per_item for x, f in pairs]
            out["ratio"] = statistics.median(out["ratios"])
            out["median_ratio"] = statistics.median(
                statistics.median(x.latencies) / statistics.median(f.latencies) for x, f in pairs
            )
            if s[0].run_seconds:
                out["run_ratio"] = statistics.median(
                    x.run_seconds / f.run_seconds for x, f in pairs
                )
        return out


async def timed_calls(
    call: Callable[[int], Awaitable[str]], calls: int, server_pid: Callable[[], int]
) -> Sample:
    """`calls` calls one after the other; each must answer i + 1."""
    pid = server_pid()
    latencies = []
    cpu, server = time.process_time(), cpu_seconds(pid)
    started = time.perf_counter()
    for i in range(calls):
        before = time.perf_counter()
        result = await call(i)
        latencies.append(time.perf_counter() - before)
        if result != str(i + 1):
            raise AssertionError(f"add({i}, 1) answered {result!r}")
    seconds = time.perf_counter() - started
    return Sample(latencies, seconds, time.process_time() - cpu, cpu_seconds(pid) - server)


def stdio_server_pid() -> int:
    """The newest stdio server this process launched (0: none runs)."""
    from tether.programs.worker.deadline import descendants

    found: list[tuple[int, int]] = []  # (start time, pid)
    for pid in descendants(os.getpid()):
        with contextlib.suppress(OSError):
            if b"mcp-stdio" in Path(f"/proc/{pid}/cmdline").read_bytes():
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                found.append((int(stat[19]), pid))
    return max(found)[1] if found else 0


# The agent -------------------------------------------------------------------------------------


def agent_script(turns: int) -> list[dict[str, Any]]:
    calls = [{"tool_calls": [{"name": "add", "input": {"a": i, "b": 1}}]} for i in range(turns)]
    return [*calls, {"text": "done"}]


async def agent_run(tools: list[Any], turns: int, server_pid: Callable[[], int]) -> Sample:
    """One run of `turns` tool turns and an answer. A turn is the time from one model call to
    the next (the tool call and what the loop does around it); the CPU is counted from the
    first model call to the last, so it is the turns', not the set-up's."""
    from tether import create_agent
    from tether.durable import memory_runtime
    from tether.providers.scripted import ScriptedProvider

    marks: list[tuple[float, float, float]] = []  # wall, this process's CPU, the server's CPU
    pid = 0

    class Timed(ScriptedProvider):  # `scripted(...)`, noting when each model call starts
        async def complete(self, request: Any, on_text: Any = None) -> Any:
            nonlocal pid
            pid = pid or server_pid()  # stdio: the process this run launched
            marks.append((time.perf_counter(), time.process_time(), cpu_seconds(pid)))
            return await super().complete(request, on_text)

    agent = create_agent(
        provider=Timed(agent_script(turns)),
        tools=tools,
        durable=memory_runtime(),
        behavior={"max_turns": turns + 1},
    )
    started = time.perf_counter()
    stats = await agent.run("go")
    run_seconds = time.perf_counter() - started
    assert stats.status == "completed", stats.error
    assert len(marks) == turns + 1, len(marks)
    (first, first_cpu, first_server), (last, last_cpu, last_server) = marks[0], marks[-1]
    return Sample(
        latencies=[b[0] - a[0] for a, b in itertools.pairwise(marks)],
        seconds=last - first,
        client_cpu=last_cpu - first_cpu,
        server_cpu=last_server - first_server,
        run_seconds=run_seconds,
        setup=first - started,
    )


# The run ---------------------------------------------------------------------------------------


async def bench(
    servers: dict[str, ServerProcess], args: argparse.Namespace
) -> dict[str, list[Variant]]:
    import httpx2

    from tether import tool
    from tether.sandbox.config import SandboxConfig
    from tether.tools.mcp import MCPServer, MCPToolset

    workspace = tempfile.mkdtemp(prefix="tether-bench-workspace-")
    floor_url = f"{servers['http'].url}/add"
    client = httpx2.AsyncClient(timeout=60)

    async def http_add(a: int, b: int) -> str:
        response = await client.post(floor_url, json={"a": a, "b": b})
        response.raise_for_status()
        return str(response.json()["sum"])

    @tool(name="add", replay="safe", concurrency_safe=True)
    async def add(a: int, b: int) -> str:
        """Add two integers."""
        return await http_add(a, b)

    def mcp_config(kind: str) -> MCPServer:
        command = [sys.executable, os.path.abspath(__file__), "--serve", "mcp-stdio"]
        if kind == "mcp-stdio":
            return MCPServer(name="bench", command=command)
        if kind == "mcp-stdio-confined":  # as a spec's stdio servers run, by default
            return MCPServer(
                name="bench", command=command, sandbox=SandboxConfig(), workspace=workspace
            )
        return MCPServer(name="bench", url=f"{servers[kind].url}/mcp")

    def pid_of(kind: str) -> Callable[[], int]:
        if kind.startswith("mcp-stdio"):
            return stdio_server_pid
        pid = servers[kind].pid
        return lambda: pid

    kinds = ["http", "mcp-http"]
    kinds += ["mcp-stdio", "mcp-stdio-confined"] if args.stdio else []
    toolsets = {kind: MCPToolset(mcp_config(kind)) for kind in kinds if kind != "http"}

    def calls_variant(kind: str) -> Variant:
        pid = pid_of(kind)
        toolset = toolsets.get(kind)

        async def call(i: int) -> str:
            if toolset is None:
                return await http_add(i, 1)
            output = await toolset.call("add", {"a": i, "b": 1})
            assert isinstance(output, str), output
            return output

        async def measure(n: int) -> Sample:
            return await timed_calls(call, n, pid)

        return Variant(kind, LABELS[kind], measure)

    def turns_variant(kind: str) -> Variant:
        pid = pid_of(kind)

        async def measure(n: int) -> Sample:
            tools = [add] if kind == "http" else [MCPToolset(mcp_config(kind))]
            return await agent_run(tools, n, pid)

        return Variant(kind, LABELS[kind], measure)

    calls = [calls_variant(kind) for kind in kinds]
    turns = [turns_variant(kind) for kind in kinds]
    try:
        # Warm-up (not counted): connections, imports, the servers' first requests.
        for toolset in toolsets.values():
            [entry] = await toolset.list_tools()
            assert entry["name"] == "add" and entry["read_only"], entry
        for variant in calls:
            await variant.measure(WARMUP_CALLS)
        for variant in turns:
            await variant.measure(WARMUP_TURNS)
        for r in range(args.repeat):
            rounds: dict[str, list[Sample]] = {variant.name: [] for variant in calls}
            for k, start in enumerate(range(0, args.calls, ROUND)):
                for variant in calls if k % 2 == 0 else reversed(calls):
                    n = min(ROUND, args.calls - start)
                    rounds[variant.name].append(await variant.measure(n))
            for variant in calls:
                variant.samples.append(Sample.merge(rounds[variant.name]))
            for variant in turns if r % 2 == 0 else reversed(turns):
                variant.samples.append(await variant.measure(args.turns))
    finally:
        for toolset in toolsets.values():
            await toolset.aclose()
        await client.aclose()
        shutil.rmtree(workspace, ignore_errors=True)
    return {"calls": calls, "turns": turns}


@contextlib.contextmanager
def started_servers(kinds: list[str], log_dir: Path) -> Iterator[dict[str, ServerProcess]]:
    with contextlib.ExitStack() as stack:
        yield {kind: stack.enter_context(ServerProcess(kind, log_dir)) for kind in kinds}


def report(results: dict[str, list[Variant]], args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {
        "calls_per_repetition": args.calls,
        "tool_turns_per_run": args.turns,
        "repeat": args.repeat,
    }
    for level, variants in results.items():
        floor = variants[0]
        out[level] = {v.name: v.summary(None if v is floor else floor) for v in variants}
    return out


def print_table(summary: dict[str, Any], results: dict[str, list[Variant]]) -> None:
    print(f"MCP tool calls vs direct HTTP calls of the same tool, median of {summary['repeat']}")
    for level, title in (
        ("calls", f"(a) {summary['calls_per_repetition']} calls on one open connection"),
        ("turns", f"(b) agent runs: {summary['tool_turns_per_run']} tool turns and an answer"),
    ):
        runs = level == "turns"
        print(f"  {title}")
        print(
            f"    {'':20}{level + '/s':>8}{'median':>8}{'p99':>8}{'CPU client':>11}"
            f"{'server':>7}{'set-up  run' if runs else '':>14}"
            f"{'median':>7}  ratio (each repetition)"
        )
        for variant in results[level]:
            row = summary[level][variant.name]
            ratio, median_ratio, run_ratio = "1", 1.0, 1.0
            if "ratio" in row:
                ratio = f"{row['ratio']:.2f} ({', '.join(f'{r:.2f}' for r in row['ratios'])})"
                median_ratio, run_ratio = row["median_ratio"], row.get("run_ratio", 0.0)
            setup = f"{row['setup_ms']:8.1f}{run_ratio:6.2f}" if runs else f"{'':14}"
            print(
                f"    {variant.label:20}{row['per_s']:8.0f}{row['median_ms']:8.3f}"
                f"{row['p99_ms']:8.3f}{row['client_cpu_ms']:11.3f}{row['server_cpu_ms']:7.3f}"
                f"{setup}{median_ratio:7.2f}  {ratio}"
            )
    print(
        "  Times in ms. CPU: ms per call (turn) of this process (the client, the agent loop) and "
        "of the server process. set-up: the run's start to its first model call. Ratios over the "
        "floor, in the same repetition: run: whole runs; median: median latencies; ratio: time "
        "per call (turn)."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300, help="calls per repetition in (a)")
    parser.add_argument("--turns", type=int, default=100, help="tool turns per run in (b)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-stdio", dest="stdio", action="store_false", help="skip stdio")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.add_argument("--serve", choices=SERVER_KINDS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port)
        return
    if args.repeat < 1 or args.calls < 2 or args.turns < 2:
        parser.error("--repeat must be at least 1, --calls and --turns at least 2")
    kinds = ["http", "mcp-http"]
    with (
        tempfile.TemporaryDirectory(prefix="tether-mcp-bench-") as directory,
        started_servers(kinds, Path(directory)) as servers,
    ):
        results = asyncio.run(bench(servers, args))
    summary = report(results, args)
    if args.json:
        print(json.dumps(summary, separators=(",", ":")))
    else:
        print_table(summary, results)


if __name__ == "__main__":
    main()
