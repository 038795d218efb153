"""The simulated dcgm-exporter endpoint for the demo's running jobs: `loader.load` writes their specs to
the state directory, and this view simulates their samples at the time Prometheus scrapes it."""

from __future__ import annotations

import json
import time
from functools import lru_cache
from pathlib import Path

import numpy as np
from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse

from jobs.simulate import TOKENS_METRIC, SimResult, SimSpec, exporter_text, simulate

LIVE_SPECS_FILE = "demo-live-jobs.json"


def live_specs(state_dir: Path) -> list[SimSpec]:
    """The running demo jobs' specs, as written by `load`."""
    path = state_dir / LIVE_SPECS_FILE
    if not path.exists():
        return []
    specs = []
    for raw in json.loads(path.read_text()):
        raw["hosts"] = tuple(raw["hosts"])
        raw["disabled"] = frozenset(raw["disabled"])
        specs.append(SimSpec(**raw))
    return specs


@lru_cache(maxsize=4)
def _live_results(path: str, mtime: float) -> tuple[SimResult, ...]:
    # Cached per specs file version: simulating a week of a job takes about a second.
    return tuple(simulate(spec) for spec in live_specs(Path(path).parent))


def live_exporter_text(state_dir: Path, at: float) -> str:
    """dcgm-exporter's /metrics text for the running demo jobs at time `at`, plus their token counters."""
    path = state_dir / LIVE_SPECS_FILE
    if not path.exists():
        return ""
    results = _live_results(str(path), path.stat().st_mtime)
    lines = [exporter_text(results, at)]
    tokens = []
    for res in results:
        idx = int(np.searchsorted(res.timestamps, at, side="right")) - 1
        if 0 <= idx < len(res.timestamps):
            labels = f'job_id="{res.spec.job_id}",hostname="{res.gpus[0].hostname}"'
            tokens.append(f"{TOKENS_METRIC}{{{labels}}} {int(res.throughput.tokens_total[idx])}")
    if tokens:
        lines += [f"# TYPE {TOKENS_METRIC} counter", *tokens, ""]
    return "\n".join(lines)


def live_exporter_view(request: HttpRequest) -> HttpResponse:
    """The simulated exporter endpoint (only when DEMO_STATE_DIR is set; 404 otherwise)."""
    if not settings.DEMO_STATE_DIR:
        raise Http404("the demo exporter is off")
    body = live_exporter_text(Path(settings.DEMO_STATE_DIR), time.time())
    return HttpResponse(body, content_type="text/plain; version=0.0.4; charset=utf-8")
