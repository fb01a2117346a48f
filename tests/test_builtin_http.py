"""`http_request` against SSRF: addresses, ports, headers, DNS pinning, TLS names, a gzip bomb.

Real HTTP(S) servers on loopback; `localhost` is the name that resolves to a non-public address.
Only the DNS rebinding test fakes an answer (of the resolver, not of HTTP): no test can make the
system resolver answer two different addresses for one name."""

from __future__ import annotations

import datetime
import functools
import ipaddress
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.helpers import tool_context
from tests.test_cli import NO_KEYS, state_home, tether
from tether.tools import ToolError
from tether.tools.builtin import BUILTINS, Workspace
from tether.tools.builtin import http as http_tool

BOMB_SIZE = 100 * 1024 * 1024


@functools.cache
def bomb() -> bytes:
    """BOMB_SIZE zero bytes, gzip-compressed (about 100 KB), built without holding them."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = bytes(1024 * 1024)
    parts = [compressor.compress(block) for _ in range(BOMB_SIZE // len(block))]
    return b"".join([*parts, compressor.flush()])


SMALL_GZIP = zlib.compress(b"small and compressed", wbits=16 + zlib.MAX_WBITS)


class Handler(BaseHTTPRequestHandler):
    name = "good"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, body: bytes, encoding: str | None = None) -> None:
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        if encoding:
            self.send_header("content-encoding", encoding)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/bomb":
            self._send(bomb(), "gzip")
        elif self.path == "/gzip":
            self._send(SMALL_GZIP, "gzip")
        else:
            self._send(f"{self.name} host={self.headers['host']}".encode())


def serve(address: tuple[str, int], name: str = "good") -> ThreadingHTTPServer:
    handler = type("NamedHandler", (Handler,), {"name": name})
    httpd = ThreadingHTTPServer(address, handler)
    threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
    return httpd


def stop(httpd: ThreadingHTTPServer) -> None:
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def port() -> Iterator[int]:
    """A plain HTTP server on 127.0.0.1 (only: a name that also resolves to ::1 falls back)."""
    httpd = serve(("127.0.0.1", 0))
    yield httpd.server_address[1]
    stop(httpd)


def build(config: dict[str, Any], root: Path) -> Any:
    return BUILTINS["http_request"]("http_request", config, Workspace(root))


def on_loopback(port: int, **config: Any) -> dict[str, Any]:
    return {"allowCidrs": ["127.0.0.0/8", "::1/128"], "allowPorts": [port], **config}


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/",
        "http://2130706433/",  # 127.0.0.1 as one decimal number: the resolver takes it
        "http://localhost/",
        "http://[::1]/",
        "http://[::ffff:127.0.0.1]/",  # IPv4-mapped IPv6
        "http://[::ffff:169.254.169.254]/",
        "http://[64:ff9b::a9fe:a9fe]/",  # NAT64 of 169.254.169.254
        "http://169.254.169.254/latest/meta-data/",  # cloud metadata
        "http://10.0.0.1/",
        "http://172.16.5.4/",
        "http://192.168.1.1/",
        "http://100.64.0.1/",  # CGNAT
        "http://0.0.0.0/",
        "http://224.0.0.1/",
        "http://[fc00::1]/",
        "http://[fe80::1]/",
        "http://[2002:7f00:1::]/",  # 6to4 of 127.0.0.1
    ],
)
async def test_http_request_refuses_non_public_addresses(url: str, tmp_path: Path) -> None:
    fetch = build({"allowHosts": ["*"], "timeoutSeconds": 1}, tmp_path)
    with pytest.raises(ToolError, match=r"resolves to .* address, which this tool may not call"):
        await fetch.execute({"url": url}, None)


def test_address_rules() -> None:
    address_refused = http_tool.address_refused
    refused = [
        "127.0.0.1", "10.1.2.3", "172.31.255.255", "192.168.0.1", "100.127.0.1", "169.254.169.254",
        "0.0.0.0", "255.255.255.255", "224.0.0.251", "192.0.2.1", "::", "::1", "::ffff:10.0.0.1",
        "64:ff9b::7f00:1", "fd00::1", "fe80::1", "ff02::1", "2001:db8::1", "2001::1", "::127.0.0.1",
        "::ffff:0:7f00:1",
    ]  # fmt: skip
    for address in refused:
        assert address_refused(ipaddress.ip_address(address), []), address
    public = ["93.184.215.14", "8.8.8.8", "2606:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808"]
    for address in public:
        assert address_refused(ipaddress.ip_address(address), []) is None, address
    allowed = [ipaddress.ip_network("10.1.0.0/16")]
    assert address_refused(ipaddress.ip_address("10.1.2.3"), allowed) is None
    assert address_refused(ipaddress.ip_address("::ffff:10.1.2.3"), allowed) is None
    assert address_refused(ipaddress.ip_address("10.2.0.1"), allowed)


async def test_an_allowed_name_on_a_private_address_needs_its_range(
    port: int, tmp_path: Path
) -> None:
    url = f"http://localhost:{port}/x"
    fetch = build({"allowHosts": ["localhost"], "allowPorts": [port]}, tmp_path)
    with pytest.raises(ToolError, match=r"localhost resolves to .* loopback address"):
        await fetch.execute({"url": url}, None)
    fetch = build({"allowHosts": ["localhost"], **on_loopback(port)}, tmp_path)
    # Connected to the address, the name sent as Host.
    assert await fetch.execute({"url": url}, None) == f"HTTP 200\ngood host=localhost:{port}"
    assert await fetch.execute({"url": f"http://localhost:{port}/gzip"}, None) == (
        "HTTP 200\nsmall and compressed"
    )


async def test_http_request_calls_allowed_ports_only(port: int, tmp_path: Path) -> None:
    fetch = build({"allowHosts": ["127.0.0.1"]}, tmp_path)
    with pytest.raises(ToolError, match=rf"port {port} is not allowed \(allowed: 80, 443\)"):
        await fetch.execute({"url": f"http://127.0.0.1:{port}/"}, None)
    fetch = build({"allowHosts": ["127.0.0.1"], "allowCidrs": ["127.0.0.0/8"]}, tmp_path)
    with pytest.raises(ToolError, match=rf"port {port} is not allowed"):
        await fetch.execute({"url": f"http://127.0.0.1:{port}/"}, None)


@pytest.mark.parametrize(
    "header",
    ["Host", "content-length", "Transfer-Encoding", "Connection", "Upgrade", "TE", " keep-alive"],
)
async def test_http_request_refuses_framing_and_hop_by_hop_headers(
    header: str, port: int, tmp_path: Path
) -> None:
    fetch = build({"allowHosts": ["127.0.0.1"], "timeoutSeconds": 2}, tmp_path)
    value = {"content-length": "5", "Transfer-Encoding": "chunked"}.get(header, "x")
    with pytest.raises(ToolError, match=rf"the header '{header}' may not be set"):
        await fetch.execute({"url": f"http://127.0.0.1:{port}/", "headers": {header: value}}, None)


async def test_http_request_connects_to_the_address_it_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DNS rebinding: the name first resolves to an allowed address, then to another one. The
    request must go to the first (the one checked), whatever a second lookup says."""
    good = serve(("127.0.0.1", 0), "good")
    port = good.server_address[1]
    evil = serve(("127.0.0.2", port), "evil")
    real = socket.getaddrinfo
    lookups: list[str] = []

    def rebinding(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host in ("rebind.test", b"rebind.test"):  # a client may pass the name IDNA-encoded
            lookups.append("rebind.test")
            host = "127.0.0.1" if len(lookups) == 1 else "127.0.0.2"
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    try:
        config = {"allowHosts": ["rebind.test"], "allowCidrs": ["127.0.0.1/32"]}
        fetch = build({**config, "allowPorts": [port]}, tmp_path)
        url = f"http://rebind.test:{port}/"
        assert await fetch.execute({"url": url}, None) == f"HTTP 200\ngood host=rebind.test:{port}"
        assert lookups == ["rebind.test"]
        # And the second answer (127.0.0.2, not allowed) is refused when it is the one checked.
        with pytest.raises(ToolError, match=r"127\.0\.0\.2 is a loopback address"):
            await fetch.execute({"url": url}, None)
    finally:
        stop(good)
        stop(evil)


def _certificate(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A CA (the file a client trusts) and a server certificate for the name `localhost` only:
    no IP address in it, so only a check against the name can pass."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = tmp_path / "ca.pem", tmp_path / "server.pem", tmp_path / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


async def test_https_to_a_pinned_address_verifies_the_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca, cert, key = _certificate(tmp_path)
    server_names: list[str | None] = []
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    record: Callable[..., None] = lambda _sock, name, _ctx: server_names.append(name)  # noqa: E731
    context.sni_callback = record
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
    port = httpd.server_address[1]
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    try:
        fetch = build({"allowHosts": ["localhost", "127.0.0.1"], **on_loopback(port)}, tmp_path)
        result = await fetch.execute({"url": f"https://localhost:{port}/"}, None)
        assert result == f"HTTP 200\ngood host=localhost:{port}"
        assert server_names == ["localhost"]  # the name as SNI, not the address connected to
        # The certificate is checked: it names no address, so the address alone fails.
        with pytest.raises(ToolError, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
            await fetch.execute({"url": f"https://127.0.0.1:{port}/"}, None)
    finally:
        stop(httpd)


async def test_a_gzip_bomb_is_cut_at_the_decoded_cap(port: int, tmp_path: Path) -> None:
    """100 MiB of zeros in ~100 KB of gzip: the tool stops decoding at the cap."""
    assert len(bomb()) < 200 * 1024
    fetch = build(
        {"allowHosts": ["127.0.0.1"], "maxResponseBytes": 1000, **on_loopback(port)}, tmp_path
    )
    tracemalloc.start()
    started = time.monotonic()
    try:
        result = await fetch.execute({"url": f"http://127.0.0.1:{port}/bomb"}, None)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.monotonic() - started < 5
    assert result == (
        "HTTP 200\n" + "\0" * 1000 + "\n[... the body was cut after 1000 bytes; the rest was not "
        "read ...]"
    )
    # Reading the whole body would hold its 100 MiB (twice, joined); the decoders hand out
    # pieces of at most 1 MiB, and reading stops after the first.
    assert peak < 16 * 1024 * 1024, f"peak {peak} bytes"


# Idempotency keys --------------------------------------------------------------------------


class Recorder(BaseHTTPRequestHandler):
    """Records each request's method and Idempotency-Key; `hold` (an Event) keeps the first
    POST's answer back until it is set, so a test can kill its caller while it waits."""

    seen: list[tuple[str, str | None]]
    arrived: threading.Event
    hold: threading.Event | None

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _record(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        first_post = self.command == "POST" and not any(m == "POST" for m, _ in self.seen)
        self.seen.append((self.command, self.headers.get("idempotency-key")))
        self.arrived.set()
        if first_post and self.hold is not None:
            self.hold.wait(60)
        body = b"charged"
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _record


@pytest.fixture
def recorder() -> Iterator[tuple[int, type[Recorder]]]:
    handler = type(
        "Recording", (Recorder,), {"seen": [], "arrived": threading.Event(), "hold": None}
    )
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
    yield httpd.server_address[1], handler
    if handler.hold is not None:
        handler.hold.set()
    stop(httpd)


async def test_a_post_carries_the_same_idempotency_key_at_every_attempt_of_a_call(
    recorder: tuple[int, type[Recorder]], tmp_path: Path
) -> None:
    port, handler = recorder
    fetch = build({"allowHosts": ["127.0.0.1"], **on_loopback(port)}, tmp_path)
    url = f"http://127.0.0.1:{port}/charge"
    for method in ("POST", "POST", "PATCH"):
        await fetch.execute({"url": url, "method": method}, tool_context("call_0_0", run_id="r1"))
    await fetch.execute({"url": url, "method": "POST"}, tool_context("call_1_0", run_id="r1"))
    await fetch.execute({"url": url, "method": "POST"}, tool_context("call_0_0", run_id="r2"))
    # Idempotent methods need none.
    for method in ("GET", "PUT", "DELETE"):
        await fetch.execute({"url": url, "method": method}, tool_context("call_0_0", run_id="r1"))
    keys = [key for _, key in handler.seen]
    assert keys[0] == keys[1] == keys[2] == tool_context("call_0_0", run_id="r1").idempotency_key
    assert re.fullmatch(r"[0-9a-f]{32}", keys[0] or ""), keys
    assert len({keys[0], keys[3], keys[4]}) == 3  # another call, another run: other keys
    assert keys[5:] == [None, None, None]


async def test_the_models_own_idempotency_key_is_kept_and_the_spec_can_send_none(
    recorder: tuple[int, type[Recorder]], tmp_path: Path
) -> None:
    port, handler = recorder
    url = f"http://127.0.0.1:{port}/charge"
    fetch = build({"allowHosts": ["127.0.0.1"], **on_loopback(port)}, tmp_path)
    own = {"url": url, "method": "POST", "headers": {"idempotency-key": "model-1"}}
    await fetch.execute(own, tool_context("call_0_0", run_id="r1"))
    quiet = build(
        {"allowHosts": ["127.0.0.1"], "idempotencyKey": False, **on_loopback(port)}, tmp_path
    )
    await quiet.execute({"url": url, "method": "POST"}, tool_context("call_0_0", run_id="r1"))
    assert handler.seen == [("POST", "model-1"), ("POST", None)]


def test_a_safe_post_sent_again_after_a_sigkill_carries_the_same_key(
    recorder: tuple[int, type[Recorder]], tmp_path: Path
) -> None:
    """`tether run` SIGKILLed while a `replay: safe` POST waits for its answer: the resumed run
    sends it again (its result was never journaled), with the key of the first attempt."""
    port, handler = recorder
    handler.hold = threading.Event()
    charge = {"url": f"http://127.0.0.1:{port}/charge", "method": "POST", "body": "5 EUR"}
    spec = {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": "charger"},
        "spec": {
            "model": {
                "provider": "scripted",
                "name": "s",
                "script": [{"tool_calls": [{"name": "charge", "input": charge}]}, {"text": "ok"}],
            },
            "tools": [
                {
                    "name": "charge",
                    "builtin": "http_request",
                    "replay": "safe",
                    "config": {"allowHosts": ["127.0.0.1"], **on_loopback(port)},
                }
            ],
        },
    }
    (tmp_path / "agent.yaml").write_text(yaml.safe_dump(spec))
    command = [sys.executable, "-m", "tether", "run", "agent.yaml", "--run-id", "r1"]
    env = {**NO_KEYS, "XDG_STATE_HOME": str(state_home(tmp_path))}
    first = subprocess.Popen(
        [*command, "--prompt", "charge it"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        assert handler.arrived.wait(60), "the first attempt's POST never came"
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(30)
    handler.hold.set()

    resumed = tether("run", "agent.yaml", "--run-id", "r1", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "run r1: completed" in resumed.stdout
    [(_, first_key), (_, second_key)] = handler.seen
    assert first_key is not None and first_key == second_key
