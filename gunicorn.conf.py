"""gunicorn settings, read automatically from the working directory (`make demo`, the Docker image, compose).

Bounds on what one request may cost a sync worker (issue #13). gunicorn has no body-size limit of its own:
`efficiency.middleware.RequestLimitsMiddleware` refuses a Content-Length above the caps (413) before the
body is read, and the reverse proxy in front should refuse it too (nginx `client_max_body_size`).
Command-line flags override these values (e.g. `--timeout`).
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


bind = os.environ.get("GUNICORN_BIND", "0.0.0.0:8000")
workers = _int("WEB_CONCURRENCY", 4)
# A request (an upload of ARTIFACT_MAX_BYTES included) must finish in this time or its worker is
# restarted; 512 MiB at 10 MB/s takes ~55 s.
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
