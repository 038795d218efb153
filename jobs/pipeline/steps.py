"""The evaluation step every trigger shares: read -> load_context -> evaluate -> store on the job (not
saved). The reads from Prometheus and the archive come first (jobs.pipeline.reads), so the evaluation gets
plain data and calls no metrics code mid-way."""

from __future__ import annotations

import numpy as np
from django.utils import timezone

from jobs.evaluation.cycle import CycleContext
from jobs.evaluation.evaluate import evaluate
from jobs.evaluation.load import load_context
from jobs.evaluation.sharing import Neighbours
from jobs.evaluation.store import store
from jobs.metrics.prometheus import PrometheusClient
from jobs.metrics.signals import JobSignals
from jobs.models import Job
from jobs.pipeline.reads import read_inputs


def evaluate_and_store(
    job: Job,
    sigs: JobSignals | None,
    client: PrometheusClient | None,
    neighbours: Neighbours | None = None,
    *,
    cycle: CycleContext | None = None,
) -> dict[str, np.ndarray]:
    """Re-evaluate the job on `sigs` through the spine (read_inputs -> load_context -> evaluate -> store;
    the caller saves the row) and return the derived series to archive (throughput, MFU). `client` None: a
    throughput PromQL expression is read from the series the last poll archived. `neighbours`: the cycle's
    sharing index; `cycle`: the cycle's shared reads (jobs.evaluation.cycle), None on the per-job paths."""
    now = timezone.now()
    readings = read_inputs(job, sigs, client, now, neighbours, cycle)
    evaluated = evaluate(load_context(job, sigs, readings, now, cycle))
    store(job, evaluated.evaluation)
    return evaluated.derived
