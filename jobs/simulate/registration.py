"""What a scheduler would register for a simulated job: the body POST /api/v1/jobs/ takes (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from jobs.metrics.promql import label_matcher
from jobs.metrics.throughput import mark_free_form
from jobs.simulate.core import SimResult
from jobs.simulate.writers import TOKENS_METRIC


def registration_body(
    res: SimResult,
    *,
    team: Any,
    name: str | None = None,
    model: str = "sim-7b",
    ended: bool = True,
    rate_window_s: float = 120.0,
    **overrides: Any,
) -> dict[str, Any]:
    """Job registration for a simulated job: its GPUs, window, model size and shape (n_layers, n_heads,
    head_dim, hidden, seq_len) and a throughput PromQL expression over the simulator's token counter
    (`rate_window_s` must hold two of its samples)."""
    spec = res.spec
    started = datetime.fromtimestamp(spec.start, tz=UTC)
    body: dict[str, Any] = {
        "external_id": spec.job_id,
        "name": name or f"sim-{spec.job_id}",
        "team": team,
        # The full shape, so the job is computed with the organisation's PaLM convention (6N + 12·L·H·Q·T,
        # the FLOPs the simulator's token rate was generated with), not a 6N fallback.
        "model": {"name": model, "n_params": res.throughput.model_params, **spec.shape()},
        "dtype": "bf16",
        "recompute": "none",
        "gpu_model": spec.gpu_model,
        "gpu_count": len(res.gpus),
        "started_at": started,
        "ended_at": started + timedelta(seconds=spec.duration_s) if ended else None,
        "gpus": [{"hostname": g.hostname, "gpu": str(g.index)} for g in res.gpus],
        # A template: $job expands to job_id="<external id>", the simulator's token counter label.
        "throughput_query": f"sum(rate({TOKENS_METRIC}{{$job}}[{int(rate_window_s)}s]))",
    }
    body.update(overrides)
    if body["external_id"] != spec.job_id and "throughput_query" not in overrides:
        # Registered under another id (a reference copy of the run): $job would expand to that id, which
        # the simulator's series do not carry; the trusted caller reads the run's own series free-form.
        own = label_matcher("job_id", str(spec.job_id))
        body["throughput_query"] = mark_free_form(
            f"sum(rate({TOKENS_METRIC}{{{own}}}[{int(rate_window_s)}s]))"
        )
    return body
