"""`PrometheusClient(compress=False)` asks for uncompressed answers (Prometheus gzips every answer a client
accepts gzip for, at its own CPU's cost: #26 item 6), the default still accepts gzip, and the copies a
RangeFetcher's threads use keep the client's choice. Against a tiny local HTTP server that records the
header (no Prometheus)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from jobs.metrics.prometheus import PrometheusClient, RangeFetcher

ANSWER = {
    "status": "success",
    "data": {"resultType": "matrix", "result": [{"metric": {"gpu": "0"}, "values": [[1000, "0.5"]]}]},
}


@pytest.fixture
def server() -> Iterator[tuple[str, list[str]]]:
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            seen.append(self.headers.get("Accept-Encoding", ""))
            body = json.dumps(ANSWER).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_the_default_client_accepts_gzip(server: tuple[str, list[str]]) -> None:
    url, seen = server
    with PrometheusClient(url, retries=0) as client:
        client.range("up", 1000, 1000, 30)
    assert "gzip" in seen[-1]


def test_an_uncompressed_client_asks_for_identity(server: tuple[str, list[str]]) -> None:
    url, seen = server
    with PrometheusClient(url, retries=0, compress=False) as client:
        [series] = client.range("up", 1000, 1000, 30)
        client.instant("up", 1000)
    assert seen == ["identity", "identity"]
    assert series.values.tolist() == [0.5]


def test_a_range_fetchers_thread_copies_keep_the_clients_choice(server: tuple[str, list[str]]) -> None:
    url, seen = server
    client = PrometheusClient(url, retries=0, compress=False)
    with RangeFetcher(client, 2, name="test-compression") as fetcher:
        answers = [fetcher.submit("up", 1000, 1000, 30) for _ in range(4)]
        assert all(len(f.result()) == 1 for f in answers)
    assert seen == ["identity"] * 4
    assert client.requests == 4  # the copies' requests counted on the client
