"""gunicorn settings, read by `make demo`, the Docker image and compose (`--config gunicorn.conf.py`).

Slow and large clients (issue #23): requests are answered by threads (`threads` per worker process) of
`efficiency.webserver.HeadTimeoutThreadWorker`, which reads the request line and headers in its event
loop, so a client sending one header line per second costs a socket and no thread, and closes it with
408 after `GUNICORN_HEADER_TIMEOUT` seconds (10); a request body must keep arriving (at most
`GUNICORN_BODY_IDLE_TIMEOUT`, 30 s, between reads) and be complete within `GUNICORN_BODY_TIMEOUT` (120 s).
An upload holds one thread while it streams to disk: `workers` x `threads` uploads at once before
other requests queue. In compose, nginx (efficiency/deploy/nginx.conf) sits in front with its own
timeouts, body limit and request buffering, so gunicorn sees only whole requests.

Bounds on what one request may cost (issue #13). gunicorn has no body-size limit of its own:
`efficiency.middleware.RequestLimitsMiddleware` refuses a Content-Length above the caps (413) before the
body is read, and nginx in front refuses it too (`client_max_body_size`).
Command-line flags override these values (e.g. `--workers`).
"""

import os


def _int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise SystemExit(f"{name}={value!r} is not an integer") from None


wsgi_app = "efficiency.wsgi"
bind = os.environ.get("GUNICORN_BIND", "0.0.0.0:8000")
workers = _int("WEB_CONCURRENCY", 4)
worker_class = "efficiency.webserver.HeadTimeoutThreadWorker"
# Threads per worker: each answers one request at a time (pages hold the GIL for their Python work, so
# more threads add concurrency for waiting on the database, Prometheus and uploads, not CPU).
threads = _int("GUNICORN_THREADS", 8)
# Open connections per worker (slow heads and kept-alive ones included), past which it stops accepting.
worker_connections = _int("GUNICORN_WORKER_CONNECTIONS", 1000)
# The worker process must report to the arbiter within this time or it is restarted. With threads its
# event loop reports, not a request: request reads are bounded by the body timeouts above.
timeout = _int("GUNICORN_TIMEOUT", 120)
graceful_timeout = 30
keepalive = 5
# The request line and headers: gunicorn's maxima, stated so they are not raised by accident.
limit_request_line = 8190
limit_request_fields = 100
limit_request_field_size = 8190
# A worker is replaced after this many requests (bounded memory growth), staggered by the jitter.
max_requests = _int("GUNICORN_MAX_REQUESTS", 2000)
max_requests_jitter = 200
