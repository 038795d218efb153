"""What a scheduler would register for a simulated job: the body POST /api/v1/jobs/ takes (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

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
        "throughput_query": f'sum(rate({TOKENS_METRIC}{{job_id="{spec.job_id}"}}[{int(rate_window_s)}s]))',
    }
    body.update(overrides)
    return body
