"""The one outbound HTTP client for Prometheus (and anything serving its HTTP API: Thanos, Mimir,
VictoriaMetrics), plus re-exports of the PromQL builder in `jobs.metrics.promql`.

Pure Python + requests: no Django imports; configuration (URL, timeout, retries) is passed in by the
caller, never read at import time. Results are typed: `Series` holds a label dict and float64 numpy
arrays of timestamps and values ("NaN", "+Inf", "-Inf" parsed); errors are `PrometheusError` subclasses.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from itertools import chain
from typing import Any, Protocol

import msgspec
import numpy as np
import requests

from jobs.metrics.promql import (
    HOST_LABEL_SPELLINGS,
    HOST_LABELS,
    UUID_LABELS,
    GpuRef,
    Matcher,
    Regex,
    Selector,
    duration,
    escape_label_value,
    gpu_key,
    label_matcher,
    label_spellings,
    promql_string,
    regex_any,
    regex_escape,
    regex_matcher,
    validate_label_name,
    validate_metric_name,
)
from jobs.metrics.sampling import grid_frame, place_on_grid

__all__ = [
    "HOST_LABELS",
    "HOST_LABEL_SPELLINGS",
    "MAX_POINTS_PER_SERIES",
    "UUID_LABELS",
    "GpuRef",
    "Health",
    "Matcher",
    "PrometheusClient",
    "PrometheusError",
    "PrometheusQueryError",
    "PrometheusUnavailable",
    "RangeFetcher",
    "Regex",
    "Sample",
    "Selector",
    "Series",
    "choose_step",
    "duration",
    "escape_label_value",
    "gpu_key",
    "label_matcher",
    "label_spellings",
    "plan_chunks",
    "promql_string",
    "regex_any",
    "regex_escape",
    "regex_matcher",
    "to_unix",
    "validate_label_name",
    "validate_metric_name",
]

MAX_POINTS_PER_SERIES = 11_000
"""Prometheus rejects range queries with (end - start) / step above this."""

Timestamp = datetime | float | int


# --------------------------------------------------------------------------------------------------
# Errors


class PrometheusError(Exception):
    """Base class of every error raised by the client."""

    def __init__(self, message: str, *, error_type: str | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.error_type = error_type
        self.status = status


class PrometheusUnavailable(PrometheusError):
    """Transient failure that persisted after all retries: timeout, connection error or HTTP 5xx."""


class PrometheusQueryError(PrometheusError):
    """The server rejected the query (bad_data, execution, not_found, ...); retrying will not help."""

    def __str__(self) -> str:
        return f"{self.error_type or 'error'}: {self.message}"


# --------------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True, slots=True)
class Series:
    """One range-query series: labels, unix timestamps (s) and values, both float64 (NaN/±Inf kept)."""

    labels: dict[str, str]
    timestamps: np.ndarray
    values: np.ndarray

    def __len__(self) -> int:
        return len(self.timestamps)

    def on_grid(self, grid: np.ndarray) -> np.ndarray:
        """Values placed on a regular grid (as returned for start/step), NaN where no point exists.

        A point at grid time g stands for (g - step, g] (`jobs.metrics.sampling`): a value on a grid point
        keeps it, an off-grid value goes to the point closing its window, and two values in one window are
        averaged, so no two samples one step apart ever collide. Values before the grid's first window
        or after its last point are dropped. A one-point grid keeps only values within its millisecond.
        """
        if len(grid) == 0 or len(self.timestamps) == 0:
            return np.full(len(grid), np.nan)
        origin, step = grid_frame(grid)
        return place_on_grid(self.timestamps, self.values, origin, step, len(grid))


@dataclass(frozen=True, slots=True)
class Sample:
    """One instant-query sample (scalar results come back with empty labels)."""

    labels: dict[str, str]
    timestamp: float
    value: float


@dataclass(frozen=True, slots=True)
class Health:
    """Outcome of `ping()`; truthy when Prometheus answered and is ready."""

    ok: bool
    detail: str
    latency_s: float
    version: str | None = None

    def __bool__(self) -> bool:
        return self.ok


class _Data(msgspec.Struct):
    resultType: str
    result: msgspec.Raw


class _Envelope(msgspec.Struct):
    status: str
    data: _Data | None = None
    errorType: str | None = None
    error: str | None = None
    warnings: list[str] = []


class _ListEnvelope(msgspec.Struct):
    status: str
    data: list[str] = []
    errorType: str | None = None
    error: str | None = None


class _MatrixItem(msgspec.Struct):
    metric: dict[str, str]
    values: list[tuple[float, str]] = []


class _MatrixRaw(msgspec.Struct, gc=False):  # gc=False: holds no cycle, need not be tracked
    metric: dict[str, str]
    values: msgspec.Raw = msgspec.Raw(b"[]")  # the points' JSON as sent, parsed for all series at once


class _VectorItem(msgspec.Struct):
    metric: dict[str, str]
    value: tuple[float, str] | None = None


_ENVELOPE = msgspec.json.Decoder(_Envelope)
_LIST_ENVELOPE = msgspec.json.Decoder(_ListEnvelope)
_MATRIX = msgspec.json.Decoder(list[_MatrixItem])
# Prometheus writes sample values as strings (Go's strconv.FormatFloat(v, 'f', -1, 64): "0.523", "NaN",
# "+Inf", "-Inf", "-0"); msgspec's lax mode parses them into floats while it decodes, in C, where numpy
# parsing the strings afterwards cost more than the JSON itself. Lax mode refuses "+Inf" and reads "-0" as
# +0.0: an answer holding either is read by `_MATRIX` and numpy instead (`_matrix_series`).
_MATRIX_RAW = msgspec.json.Decoder(list[_MatrixRaw])
_LAX_FLOATS = msgspec.json.Decoder(list[float], strict=False)
_STRICT_ONLY = (b'"+Inf"', b'"-0"')
_VECTOR = msgspec.json.Decoder(list[_VectorItem])
_SCALAR = msgspec.json.Decoder(tuple[float, str])


def _floats(strings: Sequence[str]) -> np.ndarray:
    # numpy parses "NaN", "+Inf" and "-Inf" as Prometheus writes them.
    return np.array(strings, dtype=np.float64) if strings else np.empty(0)


def to_unix(ts: Timestamp) -> float:
    """Unix seconds from an aware datetime or a number; naive datetimes are rejected (ambiguous zone)."""
    if isinstance(ts, datetime):
        if ts.tzinfo is None or ts.utcoffset() is None:
            raise ValueError("naive datetime: pass an aware datetime (UTC) or unix seconds")
        return ts.timestamp()
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
        raise ValueError(f"invalid timestamp {ts!r}")
    return float(ts)


def choose_step(
    start: Timestamp, end: Timestamp, *, max_points: int = MAX_POINTS_PER_SERIES, min_step_s: float = 1.0
) -> float:
    """Smallest whole-second step (>= min_step_s) that keeps [start, end] within max_points points."""
    span = to_unix(end) - to_unix(start)
    if span < 0:
        raise ValueError("end is before start")
    return float(max(min_step_s, math.ceil(span / max(1, max_points - 1))))


def plan_chunks(
    start: float, end: float, step: float, max_points: int = MAX_POINTS_PER_SERIES
) -> list[tuple[float, float]]:
    """Split [start, end] into ranges of at most max_points evaluation points on the same step grid."""
    if step <= 0:
        raise ValueError("step must be positive")
    # Grid points are start + k*step; computing them from k (not by adding spans) keeps chunks on one grid.
    n_last = math.floor((end - start) / step + 1e-9)
    chunks: list[tuple[float, float]] = []
    first = 0
    while first <= n_last:
        last = min(n_last, first + max_points - 1)
        chunks.append((start + first * step, start + last * step))
        first = last + 1
    return chunks


# --------------------------------------------------------------------------------------------------
# Client


class PrometheusClient:
    """Client for the Prometheus HTTP API (also Thanos, Mimir, VictoriaMetrics).

    Retries timeouts, connection errors and HTTP 5xx up to `retries` times with exponential backoff
    (`backoff_s`, 2x, 4x ...); 4xx answers (bad_data, execution errors) are raised at once.
    Queries are always POSTed form-encoded: job selectors can be long, and POST avoids URL limits.

    `compress=False` asks for uncompressed answers (`Accept-Encoding: identity`; requests otherwise asks
    for gzip and Prometheus then compresses every answer). Compression is Prometheus' CPU: one 7.7 MB
    range answer (256 GPUs x 1,080 steps) cost it 0.53-0.59 CPU-s gzipped against 0.19-0.20 plain, measured
    back to back on Prometheus 2.42 (#26 item 6); worth it only across a slow link.
    """

    def __init__(
        self,
        base_url: str,
        timeout_s: float = 10.0,
        retries: int = 2,
        backoff_s: float = 0.5,
        session: requests.Session | None = None,
        *,
        max_points: int = MAX_POINTS_PER_SERIES,
        sleep: Callable[[float], None] = time.sleep,
        compress: bool = True,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be http(s)://..., got {base_url!r}")
        if timeout_s <= 0 or retries < 0 or backoff_s < 0 or max_points < 2:
            raise ValueError("timeout_s > 0, retries >= 0, backoff_s >= 0 and max_points >= 2 required")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = float(timeout_s)
        self.retries = int(retries)
        self.backoff_s = float(backoff_s)
        self.max_points = int(max_points)
        self.session = session or requests.Session()
        self._owns_session = session is None
        self._sleep = sleep
        self.compress = bool(compress)
        self._headers = None if self.compress else {"Accept-Encoding": "identity"}
        self.last_warnings: list[str] = []
        #: HTTP requests sent (retries included): the poll cycle reports requests per cycle from it.
        self.requests = 0

    # --- public API -------------------------------------------------------------------------------

    def instant(self, query: str, at: Timestamp | None = None) -> list[Sample]:
        """Evaluate `query` at `at` (default: server's now). Vector and scalar results become Samples."""
        form = {"query": query, "timeout": duration(self.timeout_s)}
        if at is not None:
            form["time"] = _fmt_ts(to_unix(at))
        data = self._query("/api/v1/query", form)
        if data.resultType == "vector":
            out = []
            for item in _VECTOR.decode(data.result):
                if item.value is not None:  # native-histogram samples carry "histogram" instead
                    out.append(Sample(item.metric, float(item.value[0]), float(item.value[1])))
            return out
        if data.resultType == "scalar":
            ts, val = _SCALAR.decode(data.result)
            return [Sample({}, float(ts), float(val))]
        if data.resultType == "matrix":  # a range-vector query such as x[5m]
            return [
                Sample(s.labels, float(t), float(v))
                for s in _matrix_series(data.result)
                for t, v in zip(s.timestamps, s.values, strict=True)
            ]
        raise PrometheusQueryError(f"unsupported result type {data.resultType!r}", error_type="bad_data")

    def range(self, query: str, start: Timestamp, end: Timestamp, step: float | None = None) -> list[Series]:
        """Evaluate `query` over [start, end] every `step` seconds (default: `choose_step`).

        When the range holds more than `max_points` points per series it is split into chunks on the
        same grid and the series are stitched back together by label set.
        """
        t0, t1 = to_unix(start), to_unix(end)
        if t1 < t0:
            raise ValueError("end is before start")
        step_s = choose_step(t0, t1, max_points=self.max_points) if step is None else float(step)
        # Prometheus keeps milliseconds: a finer step would be sent as 0 and chunk grids would drift.
        if not step_s >= 0.001 or not math.isfinite(step_s):
            raise ValueError(f"step must be at least 1 ms, got {step}")
        chunks = plan_chunks(t0, t1, step_s, self.max_points)
        parts: dict[tuple[tuple[str, str], ...], list[Series]] = {}
        for c0, c1 in chunks:
            form = {
                "query": query,
                "start": _fmt_ts(c0),
                "end": _fmt_ts(c1),
                "step": _fmt_ts(step_s),
                "timeout": duration(self.timeout_s),
            }
            data = self._query("/api/v1/query_range", form)
            if data.resultType != "matrix":
                raise PrometheusQueryError(f"range query returned {data.resultType!r}", error_type="bad_data")
            answer = _matrix_series(data.result)
            if len(chunks) == 1:  # nothing to stitch (a matrix never holds one label set twice)
                return answer
            for s in answer:
                parts.setdefault(tuple(sorted(s.labels.items())), []).append(s)
        out = []
        for pieces in parts.values():
            if len(pieces) == 1:
                out.append(pieces[0])
            else:
                out.append(
                    Series(
                        pieces[0].labels,
                        np.concatenate([c.timestamps for c in pieces]),
                        np.concatenate([c.values for c in pieces]),
                    )
                )
        return out

    def label_values(
        self,
        label: str,
        match: Sequence[str] = (),
        start: Timestamp | None = None,
        end: Timestamp | None = None,
    ) -> list[str]:
        """Values of `label` (`__name__`, `hpc_job`, ...) on series matching any of `match`."""
        name = label if label == "__name__" else validate_label_name(label)
        params: list[tuple[str, str]] = [("match[]", m) for m in match]
        if start is not None:
            params.append(("start", _fmt_ts(to_unix(start))))
        if end is not None:
            params.append(("end", _fmt_ts(to_unix(end))))
        resp = self._send("GET", f"/api/v1/label/{name}/values", params=params)
        env = self._decode(resp, _LIST_ENVELOPE)
        return list(env.data)

    def label_names(
        self, match: Sequence[str] = (), start: Timestamp | None = None, end: Timestamp | None = None
    ) -> list[str]:
        """Label names (`/api/v1/labels`) on series matching any of `match` in [start, end]."""
        params: list[tuple[str, str]] = [("match[]", m) for m in match]
        if start is not None:
            params.append(("start", _fmt_ts(to_unix(start))))
        if end is not None:
            params.append(("end", _fmt_ts(to_unix(end))))
        resp = self._send("GET", "/api/v1/labels", params=params)
        return list(self._decode(resp, _LIST_ENVELOPE).data)

    def ping(self) -> Health:
        """One quick health probe, never raising: buildinfo (gives the version), else /-/ready."""
        t0 = time.monotonic()
        try:
            resp = self.session.get(f"{self.base_url}/api/v1/status/buildinfo", timeout=self.timeout_s)
            if resp.status_code == 200:
                version = None
                with contextlib.suppress(ValueError, AttributeError):
                    version = resp.json().get("data", {}).get("version")
                return Health(True, "ready", time.monotonic() - t0, version)
            # Some HTTP-API servers lack buildinfo; /-/ready is Prometheus's own readiness endpoint.
            resp = self.session.get(f"{self.base_url}/-/ready", timeout=self.timeout_s)
            ok = resp.status_code == 200
            detail = "ready" if ok else f"HTTP {resp.status_code}: {resp.text.strip()[:200]}"
            return Health(ok, detail, time.monotonic() - t0)
        except requests.RequestException as exc:
            return Health(False, f"{type(exc).__name__}: {exc}", time.monotonic() - t0)

    def close(self) -> None:
        """Close the underlying session if this client created it."""
        if self._owns_session:
            self.session.close()

    def __enter__(self) -> PrometheusClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- transport --------------------------------------------------------------------------------

    def _query(self, path: str, form: dict[str, str]) -> _Data:
        env = self._decode(self._send("POST", path, data=form), _ENVELOPE)
        self.last_warnings = list(env.warnings)
        if env.data is None:
            raise PrometheusQueryError("response without data", error_type="bad_response")
        return env.data

    def _send(
        self,
        method: str,
        path: str,
        *,
        data: dict[str, str] | None = None,
        params: list[tuple[str, str]] | None = None,
    ) -> requests.Response:
        url = self.base_url + path
        last: PrometheusUnavailable | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                self._sleep(self.backoff_s * 2 ** (attempt - 1))
            self.requests += 1
            try:
                resp = self.session.request(
                    method, url, data=data, params=params, timeout=self.timeout_s, headers=self._headers
                )
            except (
                requests.Timeout,
                requests.ConnectionError,
                requests.exceptions.ChunkedEncodingError,
            ) as exc:
                last = PrometheusUnavailable(f"{method} {path}: {type(exc).__name__}: {exc}")
                continue
            if resp.status_code >= 500:
                etype, msg = _error_fields(resp)
                last = PrometheusUnavailable(
                    f"{method} {path}: HTTP {resp.status_code}: {msg}",
                    error_type=etype,
                    status=resp.status_code,
                )
                continue
            return resp
        assert last is not None
        last.message = f"{last.message} (after {self.retries + 1} attempts)"
        last.args = (last.message,)
        raise last

    @staticmethod
    def _decode(resp: requests.Response, decoder: msgspec.json.Decoder[Any]) -> Any:
        if resp.status_code >= 400:
            etype, msg = _error_fields(resp)
            raise PrometheusQueryError(
                msg, error_type=etype or f"http_{resp.status_code}", status=resp.status_code
            )
        try:
            env = decoder.decode(resp.content)
        except msgspec.DecodeError as exc:
            raise PrometheusQueryError(
                f"unreadable response ({exc}): {resp.text[:200]!r}",
                error_type="bad_response",
                status=resp.status_code,
            ) from exc
        if env.status != "success":
            raise PrometheusQueryError(
                env.error or "unknown error", error_type=env.errorType, status=resp.status_code
            )
        return env


class RangeReader(Protocol):
    """What `RangeFetcher` sends queries to (PrometheusClient, or a test double)."""

    def range(self, query: str, start: Any, end: Any, step: float | None = None) -> Sequence[Any]: ...


class RangeFetcher:
    """Sends range queries `workers` at a time, so Prometheus evaluates several while this process decodes
    the last answer (the poll cycle's reads, a finalize's). Each pool thread has its own copy of the
    client: a requests.Session is not safe to share between threads (its connection pool and cookie jar
    are mutated per request), and a copy keeps the client's URL, timeout, retries, point-limit
    splitting and compression. The copies' request counts are added to the client's on `close`.

    One by one on the client itself (each answer already done when `submit` returns) with one worker, or
    with a client that is not a plain PrometheusClient (a test double, a subclass that records or
    rewrites queries: its behaviour would be lost on a copy).
    """

    def __init__(self, client: RangeReader, workers: int, *, name: str = "prometheus-range") -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self.client = client
        self.pool: ThreadPoolExecutor | None = None
        self._local = threading.local()
        self._copies: list[PrometheusClient] = []
        self._lock = threading.Lock()
        if workers > 1 and type(client) is PrometheusClient:
            self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)

    def submit(self, query: str, start: float, end: float, step: float) -> Future[Sequence[Any]]:
        """The answer of `client.range(query, start, end, step)`, as a future (already done when serial)."""
        if self.pool is not None:
            return self.pool.submit(self._range, query, start, end, step)
        done: Future[Sequence[Any]] = Future()
        try:
            done.set_result(self.client.range(query, start, end, step))
        except Exception as exc:  # raised where the answer is read, as a pooled query's would be
            done.set_exception(exc)
        return done

    def _range(self, query: str, start: float, end: float, step: float) -> Sequence[Any]:
        mine: PrometheusClient | None = getattr(self._local, "client", None)
        if mine is None:
            base = self.client
            assert isinstance(base, PrometheusClient)
            mine = PrometheusClient(
                base.base_url, timeout_s=base.timeout_s, retries=base.retries, backoff_s=base.backoff_s,
                max_points=base.max_points, compress=base.compress,
            )  # fmt: skip
            self._local.client = mine
            with self._lock:
                self._copies.append(mine)
        return mine.range(query, start, end, step)

    def close(self) -> None:
        """Drop the queries not yet started (nobody reads their answers once the caller closes: it either
        read them all or failed on one), wait for those in flight, count the copies' requests on the
        client and close the copies."""
        if self.pool is None:
            return
        self.pool.shutdown(wait=True, cancel_futures=True)
        for copy in self._copies:
            if isinstance(self.client, PrometheusClient):
                self.client.requests += copy.requests
            copy.close()
        self._copies.clear()

    def __enter__(self) -> RangeFetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _error_fields(resp: requests.Response) -> tuple[str | None, str]:
    try:
        env = _ENVELOPE.decode(resp.content)
        return env.errorType, env.error or f"HTTP {resp.status_code}"
    except msgspec.DecodeError:
        return None, f"HTTP {resp.status_code}: {resp.text.strip()[:200]}"


def _matrix_series(raw: msgspec.Raw) -> list[Series]:
    """A matrix result's series: every point of the answer parsed in one pass into two arrays (timestamps,
    values), each series' arrays views of them. The poll cycle's answers hold hundreds of short series:
    two numpy conversions per series, and a tuple per point, cost more than the parsing."""
    body = bytes(raw)
    if not any(word in body for word in _STRICT_ONLY):
        fast = _lax_matrix(body)
        if fast is not None:
            return fast
    items = _MATRIX.decode(body)
    flat = list(chain.from_iterable(item.values for item in items))
    ts = np.array([p[0] for p in flat], dtype=np.float64)
    return _cut(items, [len(item.values) for item in items], ts, _floats([p[1] for p in flat]))


def _lax_matrix(body: bytes) -> list[Series] | None:
    """`_matrix_series` by msgspec's lax mode: each series' points kept as raw JSON, their brackets dropped
    and the whole answer's numbers read as one flat list of floats (time, value, time, value, ...). None
    when that does not read the answer (a value lax mode refuses, a bracket inside a value): the caller
    then reads it point by point."""
    items = _MATRIX_RAW.decode(body)
    chunks = [bytes(item.values) for item in items]
    counts = [chunk.count(b"[") - 1 for chunk in chunks]  # one bracket per point, one around them
    numbers = [text for chunk in chunks if (text := chunk.translate(None, b"[]").strip())]
    try:
        both = np.array(_LAX_FLOATS.decode(b"[" + b",".join(numbers) + b"]"), dtype=np.float64)
    except msgspec.DecodeError:
        return None
    if both.size != 2 * sum(counts):
        return None
    return _cut(items, counts, both[0::2].copy(), both[1::2].copy())  # copies: each contiguous


def _cut(
    items: Sequence[_MatrixItem | _MatrixRaw], counts: Sequence[int], ts: np.ndarray, values: np.ndarray
) -> list[Series]:
    """The answer's series, each with its `counts[i]` points: views of the answer's two arrays."""
    out = []
    at = 0
    for item, n in zip(items, counts, strict=True):
        out.append(Series(item.metric, ts[at : at + n], values[at : at + n]))
        at += n
    return out


def _fmt_ts(ts: float) -> str:
    # Millisecond precision is what Prometheus keeps; repr-free formatting avoids 1e+09 notation.
    return f"{ts:.3f}".rstrip("0").rstrip(".")


@contextlib.contextmanager
def capped_timeout(client: PrometheusClient, seconds: float) -> Iterator[None]:
    """The client's timeout (HTTP and Prometheus' own `timeout=`) at most `seconds` for the queries inside,
    so one expensive query cannot hold a poll for the client's full timeout and retries."""
    saved = client.timeout_s
    client.timeout_s = min(saved, seconds)
    try:
        yield
    finally:
        client.timeout_s = saved


def summed_on_grid(series: Sequence[Series], ts: np.ndarray) -> np.ndarray:
    """Several series (one per rank, say) added up on `ts`; a time with no sample at all stays missing."""
    rows = np.vstack([s.on_grid(ts) for s in series])
    return np.where(np.isnan(rows).all(axis=0), np.nan, np.nansum(rows, axis=0))


def read_summed(
    client: PrometheusClient, query: str, ts: np.ndarray, step: float, *, timeout_s: float
) -> np.ndarray | None:
    """`query` over the grid `ts`, its series summed (`summed_on_grid`), within `timeout_s`; None when it
    returned no series."""
    with capped_timeout(client, timeout_s):
        series = client.range(query, float(ts[0]), float(ts[-1]), step)
    return summed_on_grid(series, ts) if series else None
