"""Write simulated jobs as (a) OpenMetrics for `promtool tsdb create-blocks-from openmetrics` and
(b) dcgm-exporter's live /metrics text for one instant; `backfill` runs promtool.

(a) is what Prometheus would have stored after scraping: exporter labels plus the target labels
`instance` and `job`, timestamps in seconds, one `# TYPE` per family with the type the exporter's counters
CSV declares (`jobs.metrics.signals.Signal.prom_type`: NVLINK_BANDWIDTH_TOTAL says `counter` although its
values are an MB/s rate, as real dcgm-exporter output does), counters named without `_total` as
dcgm-exporter does (promtool accepts that), `# EOF` at the end. Missing samples are left out.
(b) follows dcgm-exporter's template (`# HELP`, `# TYPE`, labels gpu, UUID, pci_bus_id, device,
modelName, Hostname, then the rest sorted), doubles printed with %f as Go's exporter does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TextIO

import numpy as np

from jobs.metrics.signals import SIGNALS
from jobs.simulate.core import EXTRA_KEYS, SimResult

_EXTRA_META = {
    "fb_reserved": ("gauge", "Framebuffer memory reserved (in MiB)."),
    "enc_util": ("gauge", "Encoder utilization (in %)."),
    "dec_util": ("gauge", "Decoder utilization (in %)."),
}
# DCGM stores these as doubles; everything else is an int64 field and prints without decimals.
FLOAT_KEYS = frozenset(
    {k for k, s in SIGNALS.items() if s.field.startswith("DCGM_FI_PROF_") and s.raw_unit == "ratio"}
    | {"power_usage"}
)
TOKENS_METRIC = "train_tokens_total"
EXPORTER_PORT = 9400


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels_text(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())


def _meta(key: str) -> tuple[str, str]:
    if key in SIGNALS:
        return SIGNALS[key].prom_type, SIGNALS[key].help
    return _EXTRA_META[key]


def _family_order() -> list[str]:
    return [*SIGNALS, *EXTRA_KEYS]


def _exporter_labels(labels: dict[str, str]) -> dict[str, str]:
    # Fixed head as in dcgm-exporter's template, then Labels/Attributes in Go's sorted map order.
    head = ["gpu", "UUID", "uuid", "pci_bus_id", "device", "modelName"]
    host = [k for k in labels if k.endswith(("Hostname", "hostname"))]
    out = {k: labels[k] for k in head + host if k in labels}
    out |= {k: labels[k] for k in sorted(labels) if k not in out}
    return out


def _fmt_ts(ts: float) -> str:
    return f"{ts:.3f}".rstrip("0").rstrip(".")


def _fmt_value(v: float, is_float: bool) -> str:
    if is_float:
        return format(float(v), ".6g")
    return str(int(v))


def openmetrics_lines(
    results: Sequence[SimResult],
    *,
    target_labels: bool = True,
    rename_exported: Iterable[str] = (),
    throughput: bool = True,
) -> Iterator[str]:
    """OpenMetrics exposition of every sample of every job (one string per line, with newline).

    `rename_exported` names labels to store as `exported_<name>`, as Prometheus does when a scraped
    label clashes with a target label (e.g. Kubernetes SD's `namespace`/`pod`) and honor_labels is off.
    """
    renames = set(rename_exported)
    families: dict[str, list[tuple[SimResult, str]]] = {}
    for key in _family_order():
        for res in results:
            if key in res.fields:
                families.setdefault(res.metric_name(key), []).append((res, key))
    for name, members in families.items():
        prom_type, help_text = _meta(members[0][1])
        yield f"# HELP {name} {help_text}\n"
        yield f"# TYPE {name} {prom_type}\n"
        for res, key in members:
            is_float = key in FLOAT_KEYS
            values = res.fields[key]
            ts_text = [_fmt_ts(t) for t in res.timestamps]
            for g, gpu in enumerate(res.gpus):
                if res.sample_offsets is not None:  # scraped at the target's offset after the grid time
                    ts_text = [_fmt_ts(t + float(res.sample_offsets[g])) for t in res.timestamps]
                labels = _exporter_labels(gpu.labels)
                labels = {(f"exported_{k}" if k in renames else k): v for k, v in labels.items()}
                if target_labels:
                    labels |= {"instance": f"{gpu.hostname}:{EXPORTER_PORT}", "job": "dcgm-exporter"}
                prefix = f"{name}{{{_labels_text(labels)}}} "
                row = values[g]
                for t in np.flatnonzero(~np.isnan(row)):
                    yield f"{prefix}{_fmt_value(row[t], is_float)} {ts_text[t]}\n"
    if throughput:
        yield from _throughput_lines(results, target_labels)
    yield "# EOF\n"


def _throughput_lines(results: Sequence[SimResult], target_labels: bool) -> Iterator[str]:
    jobs = [r for r in results if r.spec.job_id is not None]
    if not jobs:
        return
    yield "# HELP train_tokens Tokens processed by the training loop (rank 0).\n"
    yield "# TYPE train_tokens counter\n"
    for res in jobs:
        host = res.gpus[0].hostname
        labels = {"job_id": str(res.spec.job_id), "hostname": host}
        if target_labels:
            labels |= {"instance": f"{host}:8000", "job": "trainer"}
        prefix = f"{TOKENS_METRIC}{{{_labels_text(labels)}}} "
        for t, v in zip(res.timestamps, res.throughput.tokens_total, strict=True):
            yield f"{prefix}{int(v)} {_fmt_ts(t)}\n"


def write_openmetrics(
    results: Sequence[SimResult], out: str | os.PathLike[str] | TextIO, **kwargs: object
) -> None:
    """Write `openmetrics_lines(results, **kwargs)` to a path or an open text file."""
    if isinstance(out, str | os.PathLike):
        with open(out, "w", encoding="utf-8") as fh:
            fh.writelines(openmetrics_lines(results, **kwargs))  # type: ignore[arg-type]
    else:
        out.writelines(openmetrics_lines(results, **kwargs))  # type: ignore[arg-type]


def exporter_text(results: Sequence[SimResult], at: float, hostname: str | None = None) -> str:
    """dcgm-exporter's /metrics body at time `at` (latest sample <= at) for one host (or all)."""
    lines: list[str] = []
    for key in _family_order():
        members = [r for r in results if key in r.fields]
        body: list[str] = []
        name = ""
        for res in members:
            idx = int(np.searchsorted(res.timestamps, at, side="right")) - 1
            if idx < 0 or at > res.timestamps[-1] + res.spec.step_s:
                continue
            name = res.metric_name(key)
            for g, gpu in enumerate(res.gpus):
                v = res.fields[key][g, idx]
                if (hostname is None or gpu.hostname == hostname) and not np.isnan(v):
                    val = f"{v:f}" if key in FLOAT_KEYS else str(int(v))
                    body.append(f"{name}{{{_labels_text(_exporter_labels(gpu.labels))}}} {val}")
        if body:
            prom_type, help_text = _meta(key)
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {prom_type}", *body]
    return "\n".join(lines) + "\n"


class BackfillError(RuntimeError):
    """promtool failed; the message carries its output."""


def backfill(
    openmetrics_path: str | os.PathLike[str],
    tsdb_dir: str | os.PathLike[str],
    *,
    promtool: str | None = None,
    max_block_duration: str | None = None,
    timeout_s: float = 300.0,
) -> str:
    """Run `promtool tsdb create-blocks-from openmetrics FILE DIR`; returns promtool's output.

    Blocks are cut at 2 h boundaries by default; `max_block_duration` (e.g. "24h") is passed only when
    given, since older promtool releases (2.42) lack the flag. Start Prometheus over `tsdb_dir` after
    this: blocks written while it runs are only picked up at its next reload of the directory.
    """
    binary = promtool or shutil.which("promtool")
    if binary is None:
        raise BackfillError("promtool not found on PATH (Debian/Ubuntu: apt-get install prometheus)")
    Path(tsdb_dir).mkdir(parents=True, exist_ok=True)
    args = [binary, "tsdb", "create-blocks-from", "openmetrics"]
    if max_block_duration:
        args.append(f"--max-block-duration={max_block_duration}")
    args += [os.fspath(openmetrics_path), os.fspath(tsdb_dir)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, check=False)
    if proc.returncode != 0:
        raise BackfillError(f"promtool exited {proc.returncode}: {(proc.stderr or proc.stdout)[-2000:]}")
    return proc.stdout
