"""`http_request`: HTTP calls to an allow-list of hosts, ports and addresses.

The model chooses the URL, the method, the headers and the body, so every request is checked
before anything is sent:
- the scheme is http or https and the host matches `allowHosts` (`*.example.com` patterns);
- the port (80 or 443 when the URL names none) is in `allowPorts` (default: 80 and 443);
- the model's headers hold no `Host`, `Content-Length`, `Transfer-Encoding` or other hop-by-hop
  header: the tool frames the request itself (a refused header is a tool error);
- the host is resolved once and EVERY address it resolves to must be public: loopback,
  link-local (169.254.169.254, the cloud metadata service, included), private (RFC 1918, CGNAT
  100.64/10, ULA fc00::/7), unspecified, multicast, documentation and other reserved ranges are
  refused (`BLOCKED_NETWORKS`) unless a CIDR of `allowCidrs` holds the address. An IPv4-mapped
  IPv6 address (`::ffff:127.0.0.1`) and a NAT64 one (`64:ff9b::/96`) are checked as the IPv4
  address they carry; 6to4 and Teredo, which also tunnel to one, are refused. The connection
  then goes to the checked address (the URL is rewritten to the IP; the original name is sent
  as `Host` and as the TLS server name, and the certificate is verified against it), so a second
  DNS answer (DNS rebinding) cannot send it elsewhere. Environment proxies (`HTTP_PROXY`...) and
  `.netrc` are ignored: a proxy would resolve the name itself.
- redirects are not followed: a 3xx comes back to the model, whose next call is checked again.

A POST or PATCH (the methods that are not idempotent) carries an `Idempotency-Key` header: the
same for every attempt of one call, another for every other call. A call runs at most once per
attempt, and an unsafe one is not sent again after a crash; but a `replay: safe` tool is, and a
body cut off between its request and its journaled result can have reached the server. A server
that honours the header (the IETF draft's, Stripe's) then acts once.

The response is streamed and decoded (gzip, deflate, br, zstd) in bounded pieces; reading stops
as soon as `maxResponseBytes` of DECODED body are in, so a compressed bomb costs at most about a
megabyte past the cap, never its whole decoded size. The result says the body was cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import ipaddress
import socket
from typing import Annotated, Any, Literal

import httpx2
from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from ..base import ToolContext, ToolDef, ToolError
from ..decorator import tool

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

DEFAULT_PORTS = {"http": 80, "https": 443}
BLOCKED_NETWORKS: dict[str, str] = {
    # IPv4
    "0.0.0.0/8": "unspecified ('this network')",
    "10.0.0.0/8": "private (RFC 1918)",
    "100.64.0.0/10": "shared (carrier-grade NAT)",
    "127.0.0.0/8": "loopback",
    "169.254.0.0/16": "link-local (cloud metadata)",
    "172.16.0.0/12": "private (RFC 1918)",
    "192.0.0.0/24": "reserved (IETF protocol assignments)",
    "192.0.2.0/24": "reserved (documentation)",
    "192.88.99.0/24": "reserved (6to4 relay)",
    "192.168.0.0/16": "private (RFC 1918)",
    "198.18.0.0/15": "reserved (benchmarking)",
    "198.51.100.0/24": "reserved (documentation)",
    "203.0.113.0/24": "reserved (documentation)",
    "224.0.0.0/4": "multicast",
    "240.0.0.0/4": "reserved (and broadcast)",
    # IPv6 (IPv4-mapped and NAT64 addresses are checked as their IPv4 address before this)
    "::/128": "unspecified",
    "::1/128": "loopback",
    "::/96": "reserved (IPv4-compatible)",
    "::ffff:0:0:0/96": "reserved (IPv4-translated)",
    "64:ff9b:1::/48": "private (local NAT64)",
    "100::/64": "reserved (discard)",
    "2001::/23": "reserved (IETF protocol assignments, Teredo)",
    "2001:db8::/32": "reserved (documentation)",
    "2002::/16": "reserved (6to4)",
    "fc00::/7": "private (unique local)",
    "fe80::/10": "link-local",
    "fec0::/10": "reserved (site-local)",
    "ff00::/8": "multicast",
}
_BLOCKED = [(ipaddress.ip_network(cidr), why) for cidr, why in BLOCKED_NETWORKS.items()]
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")

REFUSED_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "proxy-authenticate",
        "te",
        "trailer",
        "upgrade",
    }
)
"""Headers the tool sets itself (framing, routing) or that speak to a hop, not the server."""
KEYED_METHODS = frozenset({"POST", "PATCH"})
"""The methods that are not idempotent (RFC 9110): their requests carry an Idempotency-Key."""
IDEMPOTENCY_HEADER = "Idempotency-Key"


class HttpRequestConfig(BaseModel):
    """`config` of the http_request built-in."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")
    allow_hosts: list[str] = Field(min_length=1, description="Hosts it may call; `*.x.com` ok.")
    allow_ports: list[int] = Field(
        default=[80, 443], min_length=1, description="Ports it may call (default 80 and 443)."
    )
    allow_cidrs: list[str] = Field(
        default_factory=list,
        description="Non-public address ranges it may call anyway, e.g. ['10.1.2.0/24'].",
    )
    timeout_seconds: float = Field(default=30, gt=0)
    max_response_bytes: int = Field(default=64 * 1024, gt=0)
    idempotency_key: bool = Field(
        default=True,
        description="Send POST and PATCH with an Idempotency-Key header, the same for every "
        "attempt of one call (unless the model's headers have one).",
    )

    @field_validator("allow_ports")
    @classmethod
    def _ports(cls, value: list[int]) -> list[int]:
        for port in value:
            if not 0 < port < 65536:
                raise ValueError(f"{port} is not a TCP port (1-65535)")
        return value

    @field_validator("allow_cidrs")
    @classmethod
    def _cidrs(cls, value: list[str]) -> list[str]:
        for cidr in value:
            try:
                ipaddress.ip_network(cidr)
            except ValueError as error:
                raise ValueError(f"{cidr!r} is not a CIDR such as 10.0.0.0/8: {error}") from None
        return value

    def networks(self) -> list[IPNetwork]:
        return [ipaddress.ip_network(cidr) for cidr in self.allow_cidrs]


def _parse(url: str) -> httpx2.URL | None:
    try:
        return httpx2.URL(url)
    except (httpx2.InvalidURL, TypeError, ValueError):
        return None


def host_allowed(url: str, patterns: list[str]) -> bool:
    """Whether `url` is http(s) and its host (as the HTTP client parses it) matches a pattern."""
    parts = _parse(url)
    if parts is None or parts.scheme not in DEFAULT_PORTS or not parts.host:
        return False
    host = parts.host.lower()
    return any(fnmatch.fnmatchcase(host, p.lower()) for p in patterns)


def effective_address(address: IPAddress) -> IPAddress:
    """The IPv4 address an IPv4-mapped or NAT64 IPv6 address reaches; else `address`."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address in _NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def address_refused(address: IPAddress, allowed: list[IPNetwork]) -> str | None:
    """Why a connection to `address` is refused (None: it may be called)."""
    target = effective_address(address)
    if any(target.version == net.version and target in net for net in allowed):
        return None
    for network, why in _BLOCKED:
        if target.version == network.version and target in network:
            shown = f"{address} ({target})" if target != address else str(address)
            return f"{shown} is a {why} address"
    return None


async def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address `host` resolves to, in the resolver's order, without duplicates."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as error:
        raise ToolError(f"cannot resolve {host}: {error}") from None
    addresses: list[IPAddress] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%")[0])
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise ToolError(f"cannot resolve {host}: no address")
    return addresses


def check_headers(headers: dict[str, str] | None) -> None:
    for name in headers or {}:
        if name.strip().lower() in REFUSED_HEADERS:
            raise ToolError(
                f"the header {name!r} may not be set: the tool sets Host and the framing headers "
                f"itself (refused: {', '.join(sorted(REFUSED_HEADERS))})"
            )


def with_idempotency_key(
    headers: dict[str, str], method: str, ctx: ToolContext | None
) -> dict[str, str]:
    """`headers`, plus the call's Idempotency-Key for a POST or PATCH that has none."""
    if ctx is None or method not in KEYED_METHODS:
        return headers
    if any(name.strip().lower() == IDEMPOTENCY_HEADER.lower() for name in headers):
        return headers  # the model's own (an API may want keys of its own making)
    return {**headers, IDEMPOTENCY_HEADER: ctx.idempotency_key}


async def read_capped(response: httpx2.Response, limit: int) -> tuple[bytes, bool]:
    """Up to `limit` bytes of the decoded body, and whether there was more. Stops reading there:
    the decoders hand out bounded pieces, so at most one piece past `limit` is ever decoded."""
    body = bytearray()
    async with contextlib.aclosing(response.aiter_bytes()) as pieces:
        async for piece in pieces:
            body += piece
            if len(body) > limit:
                return bytes(body[:limit]), True
    return bytes(body), False


async def checked_addresses(
    target: httpx2.URL, settings: HttpRequestConfig, allowed: list[IPNetwork]
) -> list[IPAddress]:
    """The addresses of `target`'s host, once every one of them passed the address rules."""
    host = target.raw_host.decode("ascii")
    port = target.port or DEFAULT_PORTS[target.scheme]
    try:
        async with asyncio.timeout(settings.timeout_seconds):
            addresses = await resolve(host, port)
    except TimeoutError:
        raise ToolError(f"resolving {host} timed out") from None
    for address in addresses:
        if why := address_refused(address, allowed):
            raise ToolError(
                f"{target.host} resolves to {why}, which this tool may not call "
                "(a spec can allow a range with config.allowCidrs)"
            )
    return addresses


async def send_pinned(
    target: httpx2.URL,
    address: IPAddress,
    settings: HttpRequestConfig,
    method: str,
    headers: dict[str, str],
    body: str | None,
) -> str:
    """The request to `target`, sent to `address` (no new DNS answer), and its capped result."""
    host = target.raw_host.decode("ascii")
    # An explicit transport: no proxy from the environment (a proxy would resolve the name
    # itself) and no .netrc; SSL_CERT_FILE / SSL_CERT_DIR still apply.
    async with httpx2.AsyncClient(
        transport=httpx2.AsyncHTTPTransport(),
        trust_env=False,
        timeout=settings.timeout_seconds,
        follow_redirects=False,
    ) as client:
        try:
            request = client.build_request(
                method,
                target.copy_with(host=str(effective_address(address))),
                headers={**headers, "Host": target.netloc.decode("ascii")},  # no user info
                content=body,
                extensions={"sni_hostname": host},  # TLS: SNI and the certificate's name
            )
        except (httpx2.InvalidURL, ValueError) as error:
            raise ToolError(f"{method} {target}: {error}") from None
        response = await client.send(request, stream=True)
        try:
            content, cut = await read_capped(response, settings.max_response_bytes)
        finally:
            await response.aclose()
    note = _cut_note(response, len(content)) if cut else ""
    return f"HTTP {response.status_code}\n{content.decode(errors='replace')}{note}"


def http_request_tool(name: str, config: dict[str, Any]) -> ToolDef:
    settings = HttpRequestConfig.model_validate(config)
    allowed_networks = settings.networks()

    @tool(name=name)
    async def http_request(
        url: Annotated[str, Field(description="Absolute http(s) URL.")],
        method: Literal["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"] = "GET",
        headers: dict[str, str] | None = None,
        body: str | None = None,
        ctx: ToolContext | None = None,
    ) -> str:
        """Make an HTTP request to an allowed host and return the status and body."""
        target = _parse(url)
        if target is None or not host_allowed(url, settings.allow_hosts):
            shown = target.host if target is not None and target.host else url
            raise ToolError(
                f"{shown!r} is not an allowed host (allowed: {', '.join(settings.allow_hosts)})"
            )
        check_headers(headers)
        port = target.port or DEFAULT_PORTS[target.scheme]
        if port not in settings.allow_ports:
            allowed = ", ".join(str(p) for p in settings.allow_ports)
            raise ToolError(f"port {port} is not allowed (allowed: {allowed})")
        addresses = await checked_addresses(target, settings, allowed_networks)
        sent = headers or {}
        if settings.idempotency_key:
            sent = with_idempotency_key(sent, method, ctx)
        for address in addresses[:-1]:  # in the resolver's order, as a client would
            try:
                return await send_pinned(target, address, settings, method, sent, body)
            except httpx2.ConnectError:
                continue  # the next checked address
            except httpx2.HTTPError as error:
                raise ToolError(f"{method} {url} failed: {error}") from None
        try:
            return await send_pinned(target, addresses[-1], settings, method, sent, body)
        except httpx2.HTTPError as error:
            raise ToolError(f"{method} {url} failed: {error}") from None

    return http_request


def _cut_note(response: httpx2.Response, shown: int) -> str:
    """What the result says of the body it does not show."""
    length = response.headers.get("content-length", "")
    identity = response.headers.get("content-encoding", "identity").strip().lower() == "identity"
    if identity and length.isascii() and length.isdigit() and len(length) <= 18:
        return f"\n[... {int(length) - shown} more bytes not shown ...]"
    return f"\n[... the body was cut after {shown} bytes; the rest was not read ...]"
