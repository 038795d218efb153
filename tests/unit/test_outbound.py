"""jobs.alerts.outbound without a database: URL checks, address classes, the allow-list, and real sends to
local HTTP servers (refused without the allow-list, reached with it, redirects not followed, huge and slow
replies cut, the connection pinned to the vetted address)."""

from __future__ import annotations

import ipaddress
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from jobs.alerts import outbound
from jobs.alerts.outbound import AllowList, BadUrl, OutboundError, Refused, Timeout

NOBODY = AllowList.parse([])
LOOPBACK = AllowList.parse(["127.0.0.1"])


# ------------------------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://[::1", "malformed"),
        ("http://a:99999/", "malformed"),
        ("http://a:0/", "port"),
        ("http://a:port/", "malformed"),
        ("ftp://example.com/x", "only http"),
        ("file:///etc/passwd", "only http"),
        ("gopher://127.0.0.1:6379/_FLUSHALL", "only http"),
        ("http:///nohost", "no host"),
        ("http://user:pw@example.com/", "credentials"),
        ("http://exa mple.com/", "spaces or control"),
        ("http://example.com/\r\nX-Injected: 1", "spaces or control"),
        ("http://" + "a" * 64 + ".com/", "not a valid host name"),
        ("http://" + ".".join(["abcdefghij"] * 30) + "/", "1-253"),
        ("http://127.1/", "looks like an IP"),
        ("http://0x7f.0.0.1/", "looks like an IP"),
        ("http://2130706433/", "looks like an IP"),
        ("http://[fe80::1%25eth0]/", "zone"),
        ("http://-bad.example.com/", "not a valid host name"),
        ("https://example.com/" + "p" * 2000, "at most 2000"),
        ("", "required"),
    ],
)
def test_unusable_urls_are_refused_with_a_reason(url: str, message: str) -> None:
    with pytest.raises(BadUrl, match=message):
        outbound.parse_url(url)


def test_a_url_is_parsed_into_host_port_and_path_with_a_hint_that_hides_the_path() -> None:
    t = outbound.parse_url("HTTPS://Hooks.Slack.com/services/T0/B0/secret?x=1#frag")
    assert (t.scheme, t.host, t.port, t.path) == (
        "https",
        "hooks.slack.com",
        443,
        "/services/T0/B0/secret?x=1",
    )
    assert t.hint == "https://hooks.slack.com/…"
    v6 = outbound.parse_url("http://[2001:4860::8888]:8080")
    assert (v6.host, v6.port, v6.path, v6.hint) == (
        "2001:4860::8888",
        8080,
        "/",
        "http://[2001:4860::8888]:8080/…",
    )
    assert outbound.parse_url("http://bücher.example/ü").host == "xn--bcher-kva.example"
    assert outbound.parse_url("http://bücher.example/ü").path == "/%C3%BC"


def test_the_longest_host_keeps_the_hint_within_its_300_character_column() -> None:
    host = ".".join(["a" * 63] * 3) + "." + "b" * 61  # 253 characters
    t = outbound.parse_url(f"https://{host}:65535/" + "x" * 1500)
    assert len(t.host) == 253 and len(t.hint) <= 300


# ------------------------------------------------------------------------------------------ addresses


@pytest.mark.parametrize(
    ("address", "problem"),
    [
        ("127.0.0.1", "loopback"),
        ("127.53.0.1", "loopback"),
        ("::1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("169.254.169.254", "link-local"),  # cloud metadata
        ("fe80::1", "link-local"),
        ("fd00::1", "unique-local"),
        ("fec0::1", "site-local"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("240.0.0.1", "reserved"),
        ("100.64.0.1", "shared (carrier-grade NAT)"),
        ("192.0.2.1", "private"),  # documentation (TEST-NET-1)
        ("::ffff:127.0.0.1", "loopback (IPv4 inside IPv6)"),
        ("::ffff:10.0.0.1", "private (IPv4 inside IPv6)"),
        ("::127.0.0.1", "loopback (IPv4 inside IPv6)"),  # IPv4-compatible
        ("64:ff9b::a9fe:a9fe", "link-local (IPv4 inside IPv6)"),  # NAT64 of 169.254.169.254
        ("2002:7f00:1::", "loopback (IPv4 inside IPv6)"),  # 6to4 of 127.0.0.1
    ],
)
def test_internal_addresses_are_refused_by_class(address: str, problem: str) -> None:
    assert outbound.address_problem(ipaddress.ip_address(address)) == problem


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8"])
def test_public_addresses_pass(address: str) -> None:
    assert outbound.address_problem(ipaddress.ip_address(address)) is None


def test_any_internal_address_among_the_resolved_ones_refuses_the_host() -> None:
    target = outbound.parse_url("https://hooks.example.com/x")
    assert outbound.vet(target, NOBODY, lambda h, p: ["93.184.216.34"]) == ["93.184.216.34"]
    with pytest.raises(Refused, match="private"):
        outbound.vet(target, NOBODY, lambda h, p: ["93.184.216.34", "10.0.0.7"])


def test_the_allow_list_takes_host_names_and_networks() -> None:
    allowed = AllowList.parse(["Alertmanager.Internal", "10.0.0.0/8", "::1"])
    internal = outbound.parse_url("http://alertmanager.internal:9093/api/v2/alerts")
    assert outbound.vet(internal, allowed, lambda h, p: ["192.168.5.5"]) == ["192.168.5.5"]
    other = outbound.parse_url("http://other.internal/")
    assert outbound.vet(other, allowed, lambda h, p: ["10.9.8.7"]) == ["10.9.8.7"]
    with pytest.raises(Refused):
        outbound.vet(other, allowed, lambda h, p: ["10.9.8.7", "192.168.0.1"])
    assert outbound.vet(outbound.parse_url("http://[::1]:80/"), allowed) == ["::1"]
    with pytest.raises(ValueError, match="not an IP address or network"):
        AllowList.parse(["10.0.0.0/33"])


def test_an_ip_literal_is_judged_at_save_time_without_dns() -> None:
    assert outbound.literal_problem(outbound.parse_url("http://127.0.0.1:9090/api/v1/query"), NOBODY) == (
        "127.0.0.1 is a loopback address"
    )
    assert outbound.literal_problem(outbound.parse_url("http://127.0.0.1:9090/"), LOOPBACK) is None
    assert outbound.literal_problem(outbound.parse_url("http://localhost:9090/"), NOBODY) is None  # at send


# ------------------------------------------------------------------------------------------- sending


@dataclass
class Server:
    url: str = ""
    port: int = 0
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    mode: str = "ok"


@pytest.fixture
def server() -> Iterator[Server]:
    state = Server()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            state.requests.append(("POST", self.path, dict(self.headers.items())))
            if state.mode == "redirect":
                self.send_response(302)
                self.send_header("Location", f"http://127.0.0.1:{state.port}/elsewhere")
                self.end_headers()
            elif state.mode == "huge":
                self.send_response(200)
                self.send_header("Content-Length", str(50 * 1024 * 1024))
                self.end_headers()
                try:
                    for _ in range(50 * 16):
                        self.wfile.write(b"x" * 65536)
                except OSError:
                    pass  # the client stopped reading, as it should
            elif state.mode == "trickle":
                self.send_response(200)
                self.end_headers()
                try:
                    for _ in range(60):
                        self.wfile.write(b"x")
                        self.wfile.flush()
                        time.sleep(0.1)
                except OSError:
                    pass
            else:
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b'{"status":"success","data":"internal secret"}')

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    state.port = httpd.server_address[1]
    state.url = f"http://127.0.0.1:{state.port}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()


def _post(url: str, allowed: AllowList = NOBODY, **kw: object) -> outbound.Reply:
    opts: dict = {"timeout_s": 5.0, "max_bytes": 64 * 1024, **kw}
    return outbound.post(url, b'{"a":1}', {"Content-Type": "application/json"}, allowed=allowed, **opts)


def test_a_local_receiver_is_refused_without_the_allow_list_and_reached_with_it(server: Server) -> None:
    with pytest.raises(Refused, match="loopback"):
        _post(f"{server.url}/hook")
    assert server.requests == []
    reply = _post(f"{server.url}/hook", LOOPBACK)
    assert reply.status == 200 and reply.address == "127.0.0.1"
    assert [(m, p) for m, p, _ in server.requests] == [("POST", "/hook")]


def test_names_resolving_to_loopback_are_refused(server: Server) -> None:
    with pytest.raises(Refused, match="localhost resolves to a loopback address"):
        _post(f"http://localhost:{server.port}/hook")
    with pytest.raises(Refused, match="loopback"):  # any name, e.g. a rebinding service's
        _post(f"http://rebind.example:{server.port}/hook", resolver=lambda h, p: ["127.0.0.1"])
    assert server.requests == []


def test_the_connection_goes_to_the_vetted_address_with_the_urls_host_header(server: Server) -> None:
    calls: list[str] = []

    def resolver(host: str, port: int) -> list[str]:
        calls.append(host)  # a rebinding DNS would answer differently the second time: never asked
        return ["127.0.0.1"]

    reply = _post(
        f"http://hook.internal:{server.port}/x", AllowList.parse(["hook.internal"]), resolver=resolver
    )
    assert reply.status == 200 and calls == ["hook.internal"]
    assert server.requests[0][2]["Host"] == f"hook.internal:{server.port}"


def test_redirects_are_not_followed(server: Server) -> None:
    server.mode = "redirect"
    reply = _post(f"{server.url}/hook", LOOPBACK)
    assert reply.status == 302
    assert [p for _, p, _ in server.requests] == ["/hook"]


def test_a_huge_reply_is_cut_at_max_bytes(server: Server) -> None:
    server.mode = "huge"
    started = time.monotonic()
    reply = _post(f"{server.url}/hook", LOOPBACK, max_bytes=4096)
    assert reply.status == 200 and reply.bytes_read == 4096 and reply.truncated
    assert time.monotonic() - started < 3.0


def test_a_trickling_reply_is_cut_at_the_deadline(server: Server) -> None:
    server.mode = "trickle"  # a byte every 0.1 s for 6 s: each read succeeds, the whole never ends
    started = time.monotonic()
    with pytest.raises(Timeout, match="within 1 s"):
        _post(f"{server.url}/hook", LOOPBACK, timeout_s=1.0)
    assert time.monotonic() - started < 2.0


def test_a_closed_port_is_a_transient_error_without_the_path() -> None:
    with pytest.raises(OutboundError) as info:
        _post("http://127.0.0.1:9/secret-token-path", LOOPBACK)
    assert info.value.transient and "secret-token-path" not in str(info.value)


def test_alert_allowed_hosts_takes_names_addresses_and_networks_and_refuses_typos() -> None:
    from efficiency.env import EnvError, env_hosts

    env = {"ALERT_ALLOWED_HOSTS": "Hooks.Internal, 10.0.0.0/8, ::1, 192.168.1.5"}
    assert env_hosts("ALERT_ALLOWED_HOSTS", [], env=env) == [
        "hooks.internal",
        "10.0.0.0/8",
        "::1",
        "192.168.1.5",
    ]
    assert env_hosts("ALERT_ALLOWED_HOSTS", [], env={}) == []
    for bad in ("http://hooks.internal", "10.0.0.0/33", "hooks internal", "-x.internal", "a:b:c"):
        with pytest.raises(EnvError, match="ALERT_ALLOWED_HOSTS"):
            env_hosts("ALERT_ALLOWED_HOSTS", [], env={"ALERT_ALLOWED_HOSTS": bad})


def _tls_pair(tmp_path, name: str) -> tuple[str, str, str]:
    """A CA and a server certificate for `name` signed by it (files: ca, cert, key)."""
    from datetime import UTC, datetime, timedelta

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.now(UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(1).not_valid_before(now - timedelta(hours=1)).not_valid_after(now + timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(2)
        .not_valid_before(now - timedelta(hours=1)).not_valid_after(now + timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    paths = [tmp_path / f"{name}-{part}.pem" for part in ("ca", "cert", "key")]
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return str(paths[0]), str(paths[1]), str(paths[2])


@pytest.mark.parametrize(("cert_name", "reached"), [("hook.internal", True), ("other.internal", False)])
def test_https_goes_to_the_vetted_address_with_sni_and_a_certificate_for_the_urls_host(
    tmp_path, cert_name: str, reached: bool
) -> None:
    import ssl

    ca, cert, key = _tls_pair(tmp_path, cert_name)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)
    sni: list[str | None] = []
    server_ctx.sni_callback = lambda sock, name, ctx: sni.append(name)  # type: ignore[assignment,misc,return-value]
    hosts: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            hosts.append(self.headers["Host"])
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.socket = server_ctx.wrap_socket(httpd.socket, server_side=True)
    port = httpd.server_address[1]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    client_ctx = ssl.create_default_context(cafile=ca)
    try:
        call = lambda: _post(  # noqa: E731
            f"https://hook.internal:{port}/x",
            AllowList.parse(["hook.internal"]),
            resolver=lambda h, p: ["127.0.0.1"],
            tls_context=client_ctx,
        )
        if reached:
            assert call().status == 204
            assert hosts == [f"hook.internal:{port}"]
        else:  # the certificate is checked against the URL's host, not the address connected to
            with pytest.raises(OutboundError, match=r"TLS with hook\.internal") as info:
                call()
            assert not info.value.transient  # a certificate that does not match stays wrong
            assert hosts == []
        assert sni and sni[0] == "hook.internal"
    finally:
        httpd.shutdown()
        httpd.server_close()
