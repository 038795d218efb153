"""gunicorn worker for the web server: threads, with the request head read without holding a thread.

Why (issue #23, item 6): with sync workers, two sockets that sent one header line per second kept
`/healthz` from answering for 24 s, and two 500 MiB uploads held it for 18 s; one slow client held one
whole worker process. gunicorn's own gthread worker answers from a thread pool, but a thread that has
seen the first byte of a request blocks on the socket, with no time limit, until the last header line
arrives: N slow-header sockets take N threads for as long as their senders like.

`HeadTimeoutThreadWorker` is gthread with three bounds, as nginx has them (client_header_timeout,
client_body_timeout; https://nginx.org/en/docs/http/ngx_http_core_module.html):

* The request line and headers are read by the worker's event loop (non-blocking, no thread), until the
  blank line that ends them; only a complete head is handed to a thread. A head not complete within
  `GUNICORN_HEADER_TIMEOUT` seconds (default 10) is answered 408 and the connection closed. Slow-header
  sockets therefore cost a file descriptor each, never a thread.
* Each read of a request body waits at most `GUNICORN_BODY_IDLE_TIMEOUT` seconds (default 30) for data,
  and the whole body must arrive within `GUNICORN_BODY_TIMEOUT` seconds (default 120: 512 MiB at about
  5 MB/s) of the head: a client that trickles one byte every few seconds is cut off too.
* An upload holds one thread of `threads` while its body streams to disk (Django's upload handlers);
  uploads are for members only (`RequestLimitsMiddleware` refuses anonymous ones from the headers), and
  `threads` x `workers` bounds how many may stream at once before requests queue.

TLS and HTTP/2 prior knowledge (neither is used here: TLS ends at the proxy) keep gthread's own path.
"""

from __future__ import annotations

import contextlib
import errno
import selectors
import socket
import time
from functools import partial
from typing import Any

from gunicorn.http2 import negotiation  # type: ignore[import-untyped]
from gunicorn.workers.gthread import TConn, ThreadWorker  # type: ignore[import-untyped]

from efficiency.env import env_float

#: Sent, best effort, to a client whose request head did not arrive in time (RFC 9110 section 15.5.9).
REQUEST_TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Type: text/plain\r\n"
    b"Content-Length: 36\r\n\r\nrequest headers not received in time"
)
_HEAD_END = b"\r\n\r\n"
_READ_SIZE = 65536


class BodyTimeout(TimeoutError):
    """A request body stalled for longer than the idle timeout, or missed its deadline."""


class DeadlineSocket:
    """A socket whose `recv` waits at most `idle` seconds for data and fails after `deadline`.

    Replaces the socket a request parser reads from (`SocketUnreader.sock`); every other method is the
    real socket's. The timeout is set around each `recv` only and restored afterwards, so response
    writes (which share the socket) are not bounded by it.
    """

    def __init__(self, sock: socket.socket, idle: float) -> None:
        self._sock = sock
        self.idle = idle
        self.deadline = float("inf")
        self._outer: float | None = sock.gettimeout()

    def start(self, seconds: float) -> None:
        """Start the deadline for the current request's remaining reads: `seconds` from now."""
        self.deadline = time.monotonic() + seconds

    def settimeout(self, value: float | None) -> None:
        """Records a caller's timeout (gunicorn's body drain sets one): each `recv` honours it too."""
        self._outer = value
        self._sock.settimeout(value)

    def gettimeout(self) -> float | None:
        """The caller's timeout, not the per-recv one."""
        return self._outer

    def setblocking(self, flag: bool) -> None:
        """Blocking mode on the real socket; recorded like `settimeout`."""
        self._outer = None if flag else 0.0
        self._sock.setblocking(flag)

    def recv(self, size: int, flags: int = 0) -> bytes:
        """One read of at most `size` bytes, bounded by the idle timeout and the request's deadline."""
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise BodyTimeout(errno.ETIMEDOUT, "request body not received in time")
        limit = min(self.idle, remaining)
        if self._outer is not None:
            limit = min(limit, self._outer)
        self._sock.settimeout(limit)
        try:
            return self._sock.recv(size, flags)
        except TimeoutError as exc:
            raise BodyTimeout(errno.ETIMEDOUT, f"no request data for {limit:.1f} s") from exc
        finally:
            self._sock.settimeout(self._outer)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class HeadTimeoutThreadWorker(ThreadWorker):
    """gthread with the request head read in the event loop under a deadline, and bounded body reads."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.heads: dict[TConn, float] = {}  # connection -> monotonic deadline of its request head
        self.header_timeout = 10.0
        self.body_idle_timeout = 30.0
        self.body_timeout = 120.0

    def init_process(self) -> None:
        """Reads the timeouts (here, not at import: gunicorn imports the class in the arbiter too)."""
        self.header_timeout = env_float("GUNICORN_HEADER_TIMEOUT", 10.0, min_value=0.5, max_value=600)
        self.body_idle_timeout = env_float("GUNICORN_BODY_IDLE_TIMEOUT", 30.0, min_value=0.5, max_value=3600)
        self.body_timeout = env_float("GUNICORN_BODY_TIMEOUT", 120.0, min_value=1, max_value=86_400)
        super().init_process()

    # -- the request head, in the event loop ------------------------------------------------------

    def _reads_heads(self, conn: TConn) -> bool:
        return not self.cfg.is_ssl and not negotiation.prior_knowledge_allowed(self.cfg, conn.client)

    def accept(self, listener: socket.socket) -> None:
        """Accepts a connection and waits for its request head without a thread."""
        try:
            client_sock, client_addr = listener.accept()
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        self.nr_conns += 1
        conn = TConn(self.cfg, client_sock, client_addr, listener.getsockname())
        if self._reads_heads(conn):
            self._await_head(conn)
        else:
            client_sock.setblocking(True)
            self.enqueue_req(conn)

    def on_client_socket_readable(self, conn: TConn, client: socket.socket) -> None:
        """A kept-alive connection sends its next request: read that head in the loop too."""
        self.poller.unregister(client)
        self.keepalived_conns.remove(conn)
        if self._reads_heads(conn):
            self._await_head(conn)
            self._on_head_readable(conn, client)
        else:
            self.enqueue_req(conn)

    def _await_head(self, conn: TConn) -> None:
        conn.sock.setblocking(False)
        conn.head = bytearray()
        self.heads[conn] = time.monotonic() + self.header_timeout
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_head_readable, conn))

    def _on_head_readable(self, conn: TConn, client: socket.socket) -> None:
        if conn not in self.heads:
            return
        try:
            data = conn.sock.recv(_READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the client went away before sending a whole head
            self._drop_head(conn)
            return
        searched_from = max(len(conn.head) - len(_HEAD_END) + 1, 0)
        conn.head += data
        # Past the parser's own limits, the parser (in a thread) answers 400/431 from what it has.
        limit = self.cfg.limit_request_line + self.cfg.limit_request_fields * (
            self.cfg.limit_request_field_size + 2
        )
        if conn.head.find(_HEAD_END, searched_from) < 0 and len(conn.head) <= limit:
            return
        del self.heads[conn]
        self.poller.unregister(conn.sock)
        conn.pending_head = bytes(conn.head)
        conn.head = bytearray()
        conn.sock.setblocking(True)
        conn.data_ready = True  # gthread's wait for a first byte is over
        self.enqueue_req(conn)

    def _drop_head(self, conn: TConn, answer: bytes = b"") -> None:
        self.heads.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.poller.unregister(conn.sock)
        if answer:
            with contextlib.suppress(OSError):  # non-blocking, best effort: the client may not read it
                conn.sock.send(answer)
        self.nr_conns -= 1
        conn.close()

    def murder_pending(self) -> None:
        """gthread's pending-connection expiry, plus heads past their deadline (all, when stopping)."""
        super().murder_pending()
        now = time.monotonic()
        for conn, deadline in list(self.heads.items()):
            if not self.alive:
                self._drop_head(conn)
            elif deadline <= now:
                self.log.info(
                    "Request head from %s not complete in %.1f s: closed", conn.client, self.header_timeout
                )
                self._drop_head(conn, REQUEST_TIMEOUT_RESPONSE)

    # -- the rest of the request, in a thread -----------------------------------------------------

    def handle(self, conn: TConn) -> Any:
        """gthread's handler, with the head read so far put back in front and body reads bounded."""
        head = conn.__dict__.pop("pending_head", None)
        if head is not None:
            conn.sock.setblocking(True)
            conn.init()
            if not isinstance(conn.parser.unreader.sock, DeadlineSocket):
                conn.parser.unreader.sock = DeadlineSocket(conn.sock, self.body_idle_timeout)
            conn.parser.unreader.unread(head)
            # The head is whole: what is read from here on is the body (or the next pipelined request).
            conn.parser.unreader.sock.start(self.body_timeout)
        elif conn.parser is not None and isinstance(conn.parser.unreader.sock, DeadlineSocket):
            # Read-ahead of a pipelined request, handed over with its head perhaps incomplete.
            conn.parser.unreader.sock.start(self.header_timeout + self.body_timeout)
        return super().handle(conn)
