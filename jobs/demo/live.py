"""The simulated dcgm-exporter endpoint for the demo's running jobs: `loader.load` writes their specs to
the state directory, and this view simulates their samples at the time Prometheus scrapes it. The model
server among them (a spec carrying `SERVING_KEY`) also exports its vLLM counters there, as its pod's
/metrics would: the demo's Prometheus scrapes the endpoint with honor_labels, so the namespace/pod target
labels a ServiceMonitor would add are written on its series (jobs.simulate.vllm)."""

from __future__ import annotations

import json
import time
from functools import lru_cache
from pathlib import Path

import numpy as np
from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse

from jobs.simulate import TOKENS_METRIC, SimResult, SimSpec, exporter_text, simulate, vllm

LIVE_SPECS_FILE = "demo-live-jobs.json"
#: The key of a live spec that serves a model: its `vllm.ServingLoad` as a dict.
SERVING_KEY = "serving"


def live_jobs(state_dir: Path) -> list[tuple[SimSpec, vllm.ServingLoad | None]]:
    """The running demo jobs' specs, as written by `load`, each with its serving load (None: not a server)."""
    path = state_dir / LIVE_SPECS_FILE
    if not path.exists():
        return []
    out = []
    for raw in json.loads(path.read_text()):
        serving = raw.pop(SERVING_KEY, None)
        raw["hosts"] = tuple(raw["hosts"])
        raw["disabled"] = frozenset(raw["disabled"])
        out.append((SimSpec(**raw), None if serving is None else vllm.ServingLoad(**serving)))
    return out


def live_specs(state_dir: Path) -> list[SimSpec]:
    """The running demo jobs' specs, as written by `load`."""
    return [spec for spec, _ in live_jobs(state_dir)]


@lru_cache(maxsize=4)
def _live_results(path: str, mtime: float) -> tuple[tuple[SimResult, vllm.EngineSeries | None], ...]:
    # Cached per specs file version: simulating a week of a job takes about a second.
    out: list[tuple[SimResult, vllm.EngineSeries | None]] = []
    for spec, serving in live_jobs(Path(path).parent):
        if serving is None:
            out.append((simulate(spec), None))
        else:
            server = vllm.simulate_server(spec, serving)
            out.append((server.result, server.engines))
    return tuple(out)


def live_exporter_text(state_dir: Path, at: float) -> str:
    """dcgm-exporter's /metrics text for the running demo jobs at time `at`, plus the training jobs' token
    counters and the model server's engine counters."""
    path = state_dir / LIVE_SPECS_FILE
    if not path.exists():
        return ""
    pairs = _live_results(str(path), path.stat().st_mtime)
    lines = [exporter_text([res for res, _ in pairs], at)]
    tokens = []
    for res, engines in pairs:
        if engines is not None:
            continue  # a server's tokens are its engine's counters, below
        idx = int(np.searchsorted(res.timestamps, at, side="right")) - 1
        if 0 <= idx < len(res.timestamps):
            labels = f'job_id="{res.spec.job_id}",hostname="{res.gpus[0].hostname}"'
            tokens.append(f"{TOKENS_METRIC}{{{labels}}} {int(res.throughput.tokens_total[idx])}")
    if tokens:
        lines += [f"# TYPE {TOKENS_METRIC} counter", *tokens, ""]
    for res, engines in pairs:
        if engines is not None and (text := vllm.exposition_text(engines, at, res.spec.step_s)):
            lines.append(text)
    return "\n".join(lines)


def live_exporter_view(request: HttpRequest) -> HttpResponse:
    """The simulated exporter endpoint (only when DEMO_STATE_DIR is set; 404 otherwise)."""
    if not settings.DEMO_STATE_DIR:
        raise Http404("the demo exporter is off")
    body = live_exporter_text(Path(settings.DEMO_STATE_DIR), time.time())
    return HttpResponse(body, content_type="text/plain; version=0.0.4; charset=utf-8")
