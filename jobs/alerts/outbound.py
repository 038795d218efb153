"""Outbound HTTP to URLs that users type (alert webhooks, Slack, Alertmanager): the one way this service
sends a request to an address it was given, used by every sender (jobs.alerts.notify) and by the form that
stores the URL (jobs.alerts.forms). No Django here: the caller passes the settings.

A team member can store any URL, and the worker that sends it sits inside the platform network next to
Prometheus, Postgres, Redis and the cloud metadata endpoint (issue 23: a subscription to
`http://127.0.0.1:<prometheus>/api/v1/query` showed Prometheus' reply on the alerts page). So:

- `parse_url`: http(s) only, a valid host (DNS name or IP literal) and port, no credentials in the URL,
  at most MAX_URL_LENGTH characters; every problem is a `BadUrl` with a message fit for a form.
- `post`: the host is resolved once, at send time, and *every* address it resolves to must be public
  (`address_problem`: loopback, private, link-local, unique-local, multicast, reserved, unspecified,
  shared (CGNAT) and the IPv4-in-IPv6 forms of those are refused) unless the host, or a network holding
  the address, is listed in the allow-list (ALERT_ALLOWED_HOSTS).
- The connection goes to the vetted address itself (`_PinnedHTTPConnection`): no second DNS lookup between
  the check and the connect (DNS rebinding); the URL's host is the Host header, the TLS SNI name and the
  name the certificate is checked against.
- Redirects are never followed (http.client does not follow them; the caller treats a 3xx as a failure).
- Connect, send and read share one deadline (a timer shuts the socket at the deadline, so a receiver that
  trickles its reply byte by byte cannot hold the worker), and at most `max_bytes` of the reply are read and
  then dropped: callers get the status code, never the body.
- Proxy variables (HTTP(S)_PROXY) are not used: a proxy would resolve the host again, out of our sight.
"""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import logging
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

log = logging.getLogger(__name__)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], list[str]]

#: Longest URL accepted (Slack and Alertmanager URLs are well under 200 characters).
MAX_URL_LENGTH = 2000
#: A DNS name is at most 253 characters and each label 1-63 (RFC 1035 2.3.4); so the stored hint
#: (scheme://host:port/…) always fits its 300-character column.
_MAX_HOST = 253
_LABEL = re.compile(r"(?!-)[a-z0-9_-]{1,63}(?<!-)")
#: Hosts a browser or getaddrinfo would read as a (possibly shortened, octal or hex) IPv4 address
#: ("127.1", "0x7f.1", "2130706433"): refused unless written as a plain dotted quad.
_NUMERIC_HOST = re.compile(r"(0x[0-9a-f]*|[0-9]+)(\.(0x[0-9a-f]*|[0-9]*))*\.?")
_CHUNK = 16 * 1024

# Networks whose IPv6 addresses carry an IPv4 address that is the real destination: IPv4-mapped
# (::ffff:0:0/96), IPv4-compatible (::/96, deprecated by RFC 4291 2.5.5.1), NAT64 (64:ff9b::/96, RFC 6052;
# 64:ff9b:1::/48, RFC 8215) and 6to4 (2002::/16, RFC 3056).
_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")
_COMPAT = ipaddress.IPv6Network("::/96")
_NAT64 = (ipaddress.IPv6Network("64:ff9b::/96"), ipaddress.IPv6Network("64:ff9b:1::/48"))
_SIXTOFOUR = ipaddress.IPv6Network("2002::/16")
_UNIQUE_LOCAL = ipaddress.IPv6Network("fc00::/7")
_SHARED = ipaddress.IPv4Network("100.64.0.0/10")  # carrier-grade NAT (RFC 6598): neither private nor global


class OutboundError(Exception):
    """A request that did not get an answer; `transient` says whether trying again later may help."""

    transient = True


class BadUrl(OutboundError, ValueError):
    """The URL cannot be used (malformed, not http(s), bad host or port)."""

    transient = False


class Refused(OutboundError):
    """The URL's host resolves to an address this service does not send to."""

    transient = False


class Timeout(OutboundError):
    """No complete answer within the deadline."""


@dataclass(frozen=True)
class Target:
    """A parsed, checked URL: `host` lowercase ASCII (IDNA) without brackets, `path` with its query."""

    scheme: str
    host: str
    port: int
    path: str
    explicit_port: bool

    @property
    def is_ip(self) -> bool:
        return _ip_or_none(self.host) is not None

    @property
    def hint(self) -> str:
        """What pages may show: scheme://host[:port]/… (never the path, which may hold a token)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}{f':{self.port}' if self.explicit_port else ''}/…"


@dataclass(frozen=True)
class Reply:
    """What a send learned: the status code, and how much of the body was read (then dropped)."""

    status: int
    address: str
    bytes_read: int
    truncated: bool
    elapsed_s: float


# ------------------------------------------------------------------------------------------- parsing


def _ip_or_none(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _dns_name(host: str) -> str:
    try:
        ascii_host = host.encode("idna").decode("ascii").lower()
    except UnicodeError:
        raise BadUrl(f"the host {host[:80]!r} is not a valid host name") from None
    name = ascii_host.rstrip(".")
    if not name or len(name) > _MAX_HOST:
        raise BadUrl(f"the host name must be 1-{_MAX_HOST} characters")
    if not all(_LABEL.fullmatch(label) for label in name.split(".")):
        raise BadUrl(
            f"the host {host[:80]!r} is not a valid host name (letters, digits and hyphens, "
            "labels of 1-63 characters)"
        )
    if _NUMERIC_HOST.fullmatch(name):
        raise BadUrl(f"the host {host[:80]!r} looks like an IP address but is not one (write a.b.c.d)")
    return name


def parse_url(url: str) -> Target:
    """Check a webhook URL without any network access; `BadUrl` says what is wrong."""
    url = url.strip()
    if not url:
        raise BadUrl("a URL is required")
    if len(url) > MAX_URL_LENGTH:
        raise BadUrl(f"the URL is {len(url)} characters long; at most {MAX_URL_LENGTH} are accepted")
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in url):
        raise BadUrl("the URL contains spaces or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # "Invalid IPv6 URL", "Port out of range 0-65535", non-numeric port
        raise BadUrl(f"the URL is malformed ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise BadUrl("only http:// and https:// URLs are accepted")
    if parts.username is not None or parts.password is not None:
        raise BadUrl("credentials in the URL are not accepted; use the secret field")
    raw_host = parts.hostname or ""
    if not raw_host:
        raise BadUrl("the URL has no host")
    if port == 0:
        raise BadUrl("the port must be between 1 and 65535")
    if "%" in raw_host:
        raise BadUrl("IPv6 zone identifiers (%) are not accepted")
    ip = _ip_or_none(raw_host)
    if ip is None and ":" in raw_host:
        raise BadUrl(f"the host {raw_host[:80]!r} is not a valid IP address")
    host = str(ip) if ip is not None else _dns_name(raw_host)
    # Non-ASCII and unsafe characters of the path are percent-encoded as a browser would; existing
    # escapes stay (safe includes %).
    path = quote(parts.path or "/", safe="/%:@!$&'()*+,;=-._~")
    if parts.query:
        path += "?" + quote(parts.query, safe="/%:@!$&'()*+,;=-._~?")
    return Target(
        scheme=scheme,
        host=host,
        port=port or (443 if scheme == "https" else 80),
        path=path,
        explicit_port=port is not None,
    )


# ------------------------------------------------------------------------------------------ addresses


def _embedded_v4(addr: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if addr in _MAPPED:
        return addr.ipv4_mapped
    if addr in _SIXTOFOUR:
        return addr.sixtofour
    if addr in _NAT64[0] or addr in _NAT64[1]:
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    if addr in _COMPAT and int(addr) > 1:  # ::/128 and ::1 are judged as themselves below
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    return None


def address_problem(addr: IPAddress) -> str | None:
    """Why this service must not send to `addr` ("loopback", "private", ...), None for a public address.

    The classes are Python's `ipaddress` properties (IANA special-purpose registries, RFC 6890); IPv6 forms
    that carry an IPv4 address are judged by that address, since that is where the packets go."""
    if isinstance(addr, ipaddress.IPv6Address):
        embedded = _embedded_v4(addr)
        if embedded is not None:
            problem = address_problem(embedded)
            return f"{problem} (IPv4 inside IPv6)" if problem else None
    checks: list[tuple[str, bool]] = [
        ("unspecified", addr.is_unspecified),
        ("loopback", addr.is_loopback),
        ("link-local", addr.is_link_local),
        ("multicast", addr.is_multicast),
        ("unique-local", isinstance(addr, ipaddress.IPv6Address) and addr in _UNIQUE_LOCAL),
        ("site-local", isinstance(addr, ipaddress.IPv6Address) and addr.is_site_local),
        ("shared (carrier-grade NAT)", isinstance(addr, ipaddress.IPv4Address) and addr in _SHARED),
        ("reserved", addr.is_reserved),
        ("private", addr.is_private),
    ]
    for name, hit in checks:
        if hit:
            return name
    if not addr.is_global:  # documentation, benchmarking and other special-purpose ranges
        return "special-purpose"
    return None


@dataclass(frozen=True)
class AllowList:
    """ALERT_ALLOWED_HOSTS parsed: host names (exact, case-insensitive) and IP networks (an address or a
    CIDR block); a listed host may resolve to anything, a listed network allows the addresses in it."""

    hosts: frozenset[str]
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]

    @classmethod
    def parse(cls, entries: Iterable[str]) -> AllowList:
        """Entries as ALERT_ALLOWED_HOSTS lists them; ValueError names a malformed one."""
        hosts: set[str] = set()
        networks = []
        for raw in entries:
            entry = raw.strip().lower()
            if not entry:
                continue
            if "/" in entry or _ip_or_none(entry.strip("[]")) is not None:
                try:
                    networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
                except ValueError:
                    raise ValueError(f"{raw!r} is not an IP address or network") from None
                continue
            try:
                hosts.add(_dns_name(entry))
            except BadUrl as exc:
                raise ValueError(f"{raw!r}: {exc}") from None
        return cls(frozenset(hosts), tuple(networks))

    def allows_host(self, host: str) -> bool:
        return host in self.hosts or (
            (ip := _ip_or_none(host)) is not None and any(ip in n for n in self.networks)
        )

    def allows_address(self, host: str, addr: IPAddress) -> bool:
        return host in self.hosts or any(addr in n for n in self.networks)


def literal_problem(target: Target, allowed: AllowList) -> str | None:
    """At save time, without DNS: why an IP-literal host will be refused (None when it will not be, or
    when the host is a name, which is judged when it is resolved at send time)."""
    ip = _ip_or_none(target.host)
    if ip is None or allowed.allows_host(target.host):
        return None
    problem = address_problem(ip)
    return None if problem is None else f"{target.host} is a {problem} address"


def system_resolver(host: str, port: int) -> list[str]:
    """Every address `host` resolves to (A and AAAA), in the resolver's order, without duplicates."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        raise OutboundError(f"{host} does not resolve ({exc.strerror})") from None
    out: list[str] = []
    for *_, sockaddr in infos:
        address = str(sockaddr[0]).split("%", 1)[0]
        if address not in out:
            out.append(address)
    return out


def vet(target: Target, allowed: AllowList, resolver: Resolver = system_resolver) -> list[str]:
    """The addresses to connect to; `Refused` when ANY address the host resolves to is not public (a
    name that resolves to a public and a private address could be answered by either)."""
    if (literal := _ip_or_none(target.host)) is not None:
        addresses = [str(literal)]
    else:
        addresses = resolver(target.host, target.port)
        if not addresses:
            raise OutboundError(f"{target.host} resolves to no address")
    for address in addresses:
        addr = ipaddress.ip_address(address)
        problem = address_problem(addr)
        if problem is not None and not allowed.allows_address(target.host, addr):
            log.warning("outbound: refused %s: resolves to %s (%s)", target.host, address, problem)
            raise Refused(
                f"refused: {target.host} resolves to a {problem} address; an operator may allow it by "
                "listing the host in ALERT_ALLOWED_HOSTS"
            )
    return addresses


# ------------------------------------------------------------------------------------------- sending


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """HTTP to a fixed, already vetted address; `host` (Host header) stays the URL's host."""

    def __init__(self, host: str, port: int, address: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self.address = address
        # The socket as last connected: http.client drops `sock` once a "Connection: close" reply's
        # headers are read (the response keeps reading it), so the deadline needs its own reference.
        self.live: socket.socket | None = None

    def connect(self) -> None:
        self.sock = self.live = socket.create_connection((self.address, self.port), self.timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def cut(self) -> None:
        """Shut the connection down from another thread (a blocked read then returns at once)."""
        if self.live is not None:
            with contextlib.suppress(OSError):
                self.live.shutdown(socket.SHUT_RDWR)


class _PinnedHTTPSConnection(_PinnedHTTPConnection):
    """HTTPS to a fixed address, with SNI and certificate check for the URL's host."""

    default_port = http.client.HTTPS_PORT

    def __init__(self, host: str, port: int, address: str, timeout: float, context: ssl.SSLContext) -> None:
        super().__init__(host, port, address, timeout)
        self.context = context

    def connect(self) -> None:
        super().connect()
        self.sock = self.live = self.context.wrap_socket(self.sock, server_hostname=self.host)


def default_tls_context() -> ssl.SSLContext:
    """Certificate and host-name checks on, with the CA bundle requests uses (certifi) when installed."""
    try:
        import certifi

        return ssl.create_default_context(cafile=certifi.where())
    except ImportError:  # pragma: no cover - certifi comes with requests
        return ssl.create_default_context()


def _exchange(
    conn: _PinnedHTTPConnection,
    target: Target,
    body: bytes,
    headers: dict[str, str],
    max_bytes: int,
) -> tuple[int, int, bool]:
    conn.request("POST", target.path, body=body, headers={**headers, "Connection": "close"})
    response = conn.getresponse()
    read, truncated = 0, False
    while True:  # read at most max_bytes (+1 to know whether there was more), then drop it
        chunk = response.read(min(_CHUNK, max_bytes + 1 - read))
        if not chunk:
            break
        read += len(chunk)
        if read > max_bytes:
            read, truncated = max_bytes, True
            break
    return response.status, read, truncated


def post(
    url: str,
    body: bytes,
    headers: dict[str, str],
    *,
    allowed: AllowList,
    timeout_s: float,
    max_bytes: int,
    resolver: Resolver = system_resolver,
    tls_context: ssl.SSLContext | None = None,
) -> Reply:
    """POST `body` to `url` under the rules in the module docstring; the reply's status, never its body.

    Raises `BadUrl`/`Refused` (permanent), `Timeout` or `OutboundError` (transient: connection refused,
    reset, DNS failure, TLS failure). Messages never contain the URL's path or query (they may be secret)."""
    target = parse_url(url)
    started = time.monotonic()
    deadline = started + timeout_s
    addresses = vet(target, allowed, resolver)
    last: Exception | None = None
    for address in addresses:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        conn: _PinnedHTTPConnection
        if target.scheme == "https":
            conn = _PinnedHTTPSConnection(
                target.host, target.port, address, remaining, tls_context or default_tls_context()
            )
        else:
            conn = _PinnedHTTPConnection(target.host, target.port, address, remaining)
        fired = threading.Event()

        def cut(c: _PinnedHTTPConnection = conn, flag: threading.Event = fired) -> None:
            flag.set()
            c.cut()

        timer = threading.Timer(remaining, cut)
        timer.daemon = True
        timer.start()
        try:
            status, read, truncated = _exchange(conn, target, body, headers, max_bytes)
        except (OSError, http.client.HTTPException) as exc:
            if fired.is_set() or isinstance(exc, TimeoutError | socket.timeout):
                raise Timeout(f"no answer from {target.host} within {timeout_s:g} s") from None
            last = exc
            connected = conn.live is not None
            log.info("outbound: %s via %s failed: %s", target.host, address, exc)
            if connected:  # the request may have reached the receiver: do not send it again elsewhere
                break
            continue
        finally:
            timer.cancel()
            conn.close()
        if fired.is_set():
            raise Timeout(f"no answer from {target.host} within {timeout_s:g} s")
        return Reply(status, address, read, truncated, time.monotonic() - started)
    if last is None:
        raise Timeout(f"no answer from {target.host} within {timeout_s:g} s")
    error = OutboundError(_describe(target, last))
    # A certificate that does not match the host (or is not trusted) will not change on a retry.
    error.transient = not isinstance(last, ssl.SSLCertVerificationError)
    raise error from None


def _describe(target: Target, exc: Exception) -> str:
    where = f"{target.host}:{target.port}"
    if isinstance(exc, ssl.SSLError):
        return f"TLS with {where} failed: {getattr(exc, 'reason', None) or type(exc).__name__}"
    if isinstance(exc, ConnectionRefusedError):
        return f"connection to {where} refused"
    if isinstance(exc, ConnectionResetError):
        return f"connection to {where} reset"
    if isinstance(exc, http.client.HTTPException):
        return f"{where} sent a malformed HTTP reply ({type(exc).__name__})"
    return f"connection to {where} failed ({type(exc).__name__})"
