"""Command-line client for training nodes and schedulers: one module, only `requests`, no Django.

Copy this file to a node (or run `python -m jobs.intake.client` from a checkout): it is copied as one file,
so it
stays a single module at the root of jobs/ and imports nothing from the service. Configuration comes from the
environment: EFFICIENCY_URL (e.g. https://efficiency.example.com) and EFFICIENCY_TOKEN (an API token).

    python client.py register job.json          # POST /api/v1/jobs/ (idempotent)
    python client.py end 48213 [--at ISO8601]   # PATCH ended_at
    python client.py progress 48213 --step 100 --tokens 409600
    python client.py upload 48213 trace.json.gz [--kind kineto] [--rank 3] [--wait]
    python client.py status 48213               # the job summary as JSON
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import requests

TIMEOUT_S = 60
UPLOAD_TIMEOUT_S = 600


class ClientError(Exception):
    """A request the server refused, with its explanation."""


class Client:
    """A thin wrapper over the REST API with token authentication and clear errors."""

    def __init__(self, base_url: str, token: str, session: requests.Session | None = None) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ClientError(f"EFFICIENCY_URL must start with http:// or https:// (got {base_url!r})")
        self.base_url = base_url.rstrip("/")
        self.session = session or requests.Session()
        self.session.headers["Authorization"] = f"Token {token}"

    def _request(self, method: str, path: str, *, timeout: float = TIMEOUT_S, **kwargs: Any) -> Any:
        url = f"{self.base_url}/api/v1/{path}"
        try:
            response = self.session.request(method, url, timeout=timeout, **kwargs)
        except requests.RequestException as exc:
            raise ClientError(f"cannot reach {self.base_url}: {exc}") from None
        if response.status_code >= 400:
            try:
                detail: Any = response.json()
            except ValueError:
                detail = response.text[:500]
            raise ClientError(f"{method} {path}: HTTP {response.status_code}: {detail}")
        return response.json() if response.content else None

    def register(self, body: dict[str, Any]) -> Any:
        """Register (or update) a job."""
        return self._request("POST", "jobs/", json=body)

    def end(self, job: str, at: str | None = None) -> Any:
        """Mark a job ended now (or at an ISO 8601 time)."""
        ended = at or datetime.now(UTC).isoformat()
        return self._request("PATCH", f"jobs/{quote(job, safe='')}/", json={"ended_at": ended})

    def progress(self, job: str, tokens: int, step: int | None = None, at: str | None = None) -> Any:
        """Push cumulative tokens (and step) at a time (default now)."""
        point = {"timestamp": at or datetime.now(UTC).isoformat(), "tokens": tokens, "step": step}
        return self._request("POST", f"jobs/{quote(job, safe='')}/progress/", json=point)

    def upload(self, job: str, path: Path, kind: str | None = None, rank: int | None = None) -> Any:
        """Upload a profiling artifact (streamed from disk)."""
        data = {k: str(v) for k, v in (("kind", kind), ("rank", rank)) if v is not None}
        with path.open("rb") as handle:
            return self._request(
                "POST",
                f"jobs/{quote(job, safe='')}/artifacts/",
                files={"file": (path.name, handle)},
                data=data,
                timeout=UPLOAD_TIMEOUT_S,
            )

    def artifact(self, artifact_id: int) -> Any:
        """An artifact's status (and analysis once parsed)."""
        return self._request("GET", f"artifacts/{artifact_id}/")

    def status(self, job: str) -> Any:
        """The job summary."""
        return self._request("GET", f"jobs/{quote(job, safe='')}/")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="efficiency-client", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("register", help="register a job from a JSON file (- for stdin)")
    p.add_argument("file")
    p = sub.add_parser("end", help="mark a job ended")
    p.add_argument("job")
    p.add_argument("--at", help="ISO 8601 time (default now)")
    p = sub.add_parser("progress", help="push cumulative tokens and step")
    p.add_argument("job")
    p.add_argument("--tokens", type=int, required=True)
    p.add_argument("--step", type=int)
    p.add_argument("--at")
    p = sub.add_parser("upload", help="upload a profiling artifact")
    p.add_argument("job")
    p.add_argument("path", type=Path)
    p.add_argument("--kind")
    p.add_argument("--rank", type=int)
    p.add_argument("--wait", action="store_true", help="wait until parsed and print the outcome")
    p = sub.add_parser("status", help="print the job summary")
    p.add_argument("job")
    return parser


def main(argv: list[str] | None = None, env: dict[str, str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    args = _parser().parse_args(argv)
    env = dict(os.environ) if env is None else env
    url, token = env.get("EFFICIENCY_URL", ""), env.get("EFFICIENCY_TOKEN", "")
    if not url or not token:
        print("set EFFICIENCY_URL and EFFICIENCY_TOKEN", file=sys.stderr)
        return 2
    try:
        client = Client(url, token)
        if args.command == "register":
            text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
            result = client.register(json.loads(text))
        elif args.command == "end":
            result = client.end(args.job, args.at)
        elif args.command == "progress":
            result = client.progress(args.job, args.tokens, args.step, args.at)
        elif args.command == "upload":
            if not args.path.is_file():
                raise ClientError(f"{args.path}: no such file")
            result = client.upload(args.job, args.path, args.kind, args.rank)
            while args.wait and result["status"] in ("queued", "parsing"):
                time.sleep(2)
                result = client.artifact(result["id"])
            if isinstance(result, dict) and not args.wait:
                result.pop("analysis", None)
        else:
            result = client.status(args.job)
    except (ClientError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2))
    return 1 if isinstance(result, dict) and result.get("status") == "failed" else 0


if __name__ == "__main__":
    sys.exit(main())
