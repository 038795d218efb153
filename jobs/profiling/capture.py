"""The ``capture`` block of an artifact analysis: which GPUs, when and which ranks the capture covers.

The contract, relied on by the run checks that compare an artifact with its job (GPU model, capture time
inside the job's window, rank among the job's GPUs)::

    {"gpu_names": [str, ...],      # deviceProperties[].name / nsys TARGET_INFO_GPU.name /
                                   # nvidia-smi name; [] when unknown
     "start_unix": float | None,   # capture start, unix seconds
     "end_unix": float | None,     # capture end, unix seconds
     "ranks": [int, ...],          # distributedInfo.rank ...; [] unknown
     "world_size": int | None,
     "source": str}                # how start_unix was obtained, or why it is unknown

and, only when the file names them (artifacts without GPU, time or rank are matched by these):
``"hosts": [str, ...]`` (dstat's "Host:"), ``"pids": [int, ...]`` and ``"commands": [str, ...]`` (py-spy's
``process PID:"command"`` frames).

Every number is finite or None (never NaN/Inf), every string at most `MAX_CHARS` characters, lists at
most `MAX_ITEMS` long. `make_capture` enforces that whatever the parser hands it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

MAX_CHARS = 200
MAX_ITEMS = 256
#: Timestamps before 2001-09-09 (1e9 s) are not wall-clock times: a relative clock read as epoch.
MIN_PLAUSIBLE_UNIX_S = 1e9


def _text(value: Any) -> str:
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= MAX_CHARS else text[: MAX_CHARS - 1] + "…"


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    out = float(value)
    return out if math.isfinite(out) else None


def make_capture(
    *,
    gpu_names: Iterable[Any] = (),
    start_unix: Any = None,
    end_unix: Any = None,
    ranks: Iterable[Any] = (),
    world_size: Any = None,
    source: str,
    hosts: Iterable[Any] = (),
    pids: Iterable[Any] = (),
    commands: Iterable[Any] = (),
) -> dict[str, Any]:
    """A capture block that satisfies the contract (see the module docstring), from loose inputs.

    A start or end that is not a plausible wall-clock time (before 2001, non-finite, end before start)
    becomes None and the source says so.
    """
    start, end = _finite(start_unix), _finite(end_unix)
    note = ""
    if start is not None and start < MIN_PLAUSIBLE_UNIX_S:
        start, end, note = None, None, " (timestamps are not wall-clock times)"
    if end is not None and (end < MIN_PLAUSIBLE_UNIX_S or (start is not None and end < start)):
        end = None
    names = [_text(n) for n in gpu_names if isinstance(n, str) and n.strip()][:MAX_ITEMS]
    rank_list = sorted({int(r) for r in ranks if isinstance(r, int) and not isinstance(r, bool) and r >= 0})[
        :MAX_ITEMS
    ]
    world = (
        int(world_size)
        if isinstance(world_size, int) and not isinstance(world_size, bool) and world_size > 0
        else None
    )
    out: dict[str, Any] = {
        "gpu_names": names,
        "start_unix": start,
        "end_unix": end,
        "ranks": rank_list,
        "world_size": world,
        "source": _text(source + note),
    }
    # The optional keys appear only when known, so captures of files that never carry them stay as they were.
    host_list = list(dict.fromkeys(_text(h.strip()) for h in hosts if isinstance(h, str) and h.strip()))
    pid_list = sorted({int(p) for p in pids if isinstance(p, int) and not isinstance(p, bool) and p > 0})
    command_list = list(dict.fromkeys(_text(c) for c in commands if isinstance(c, str) and c.strip()))
    for key, values in (("hosts", host_list), ("pids", pid_list), ("commands", command_list)):
        if values:
            out[key] = values[:MAX_ITEMS]
    return out


def capture_from_nvidia_smi(analysis: Mapping[str, Any]) -> dict[str, Any]:
    """The capture block of an nvidia-smi CSV analysis (`monitoring.analyze_nvidia_smi` output).

    The log's own timestamps are wall-clock times (in the logging host's zone, shifted by the parser's
    utc offset); GPU names come from a ``name`` column when the query had one. nvidia-smi knows GPUs, not
    ranks, so ranks stay unknown.
    """
    gpus = analysis.get("gpus")
    rows = [g for g in gpus if isinstance(g, Mapping)] if isinstance(gpus, list) else []
    names = [g.get("name", g.get("gpu_name")) for g in rows]
    start = analysis.get("start_unix_s")
    return make_capture(
        gpu_names=[n for n in names if isinstance(n, str)],
        start_unix=start,
        end_unix=analysis.get("end_unix_s"),
        source=(
            "nvidia-smi timestamp column (first to last sample)"
            if _finite(start) is not None
            else "unknown: the nvidia-smi log has no timestamp column"
        ),
    )
