"""Re-evaluate stored jobs when an input other than their signals changes: a parsed profiler trace (step
time gives throughput), a baseline promoted or retired (the reference MFU; queued by
jobs.evaluation.baselines), a price book entry (cost and waste). The same evaluation step as a poll
(`steps.evaluate_and_store`) on the archived signals, then the diagnosis, without Prometheus: a throughput
PromQL expression is read from the series the last poll archived."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from django.db import transaction

from jobs.evaluation.store import COLUMNS
from jobs.metrics import archive
from jobs.models import Job, PriceEntry
from jobs.pipeline.findings import run_diagnosis
from jobs.pipeline.steps import evaluate_and_store
from jobs.runtime.enqueue import enqueue

log = logging.getLogger(__name__)
# Price-book changes of the current transaction, per thread (web and worker processes are single-threaded
# per request/task, but a threaded server must not mix two requests' sets).
_LOCAL = threading.local()


def reevaluate(job_id: int, *, diagnose: bool = True) -> Job:
    """Recompute and store one job's evaluation from its archive (idempotent) and, unless `diagnose` is
    False, re-run its diagnosis: the findings' dollars are shares of the job's waste, so a new price or
    reference must move them too. Returns the saved job."""
    with transaction.atomic():
        job = Job.objects.select_for_update(of=("self",)).select_related("gpu_model").get(pk=job_id)
        sigs = archive.load_job_signals(job, per_gpu=("gpu_util",))
        derived = evaluate_and_store(job, sigs, client=None)
        job.save(update_fields=[*COLUMNS, "updated_at"])
        if sigs is not None and derived:
            archive.upsert(archive.derived_rows(job, sigs, derived))
    if diagnose:
        run_diagnosis(job)
    return job


def reevaluate_many(job_ids: Iterable[int]) -> int:
    """Re-evaluate each job; one failing job is logged and does not stop the others."""
    done = 0
    for job_id in job_ids:
        try:
            reevaluate(job_id)
            done += 1
        except Job.DoesNotExist:
            continue
        except Exception:
            log.exception("re-evaluation of job %s failed", job_id)
    return done


def jobs_of_gpu_model(gpu_model_id: int) -> list[int]:
    """Jobs priced with this GPU model's price book."""
    return list(Job.objects.filter(gpu_model_id=gpu_model_id).values_list("pk", flat=True))


def _enqueue(job_ids: list[int]) -> None:
    if job_ids:
        enqueue("reevaluate_jobs", job_ids)


def after_price_change(sender: type, instance: PriceEntry, **_: object) -> None:
    """post_save / post_delete receiver of PriceEntry: once the transaction commits, queue one
    re-evaluation of the jobs of every GPU model whose book changed in it (seeding a whole catalog in one
    transaction queues one task per GPU model, not one per entry)."""
    pending = _pending_price_models()
    pending.add(instance.gpu_model_id)
    transaction.on_commit(_flush_price_changes)


def _pending_price_models() -> set[int]:
    if not hasattr(_LOCAL, "gpu_models"):
        _LOCAL.gpu_models = set()
    models: set[int] = _LOCAL.gpu_models
    return models


def _flush_price_changes() -> None:
    # Every save registers this callback; the first one to run takes the whole set, the rest find it empty.
    pending = _pending_price_models()
    ids, _LOCAL.gpu_models = sorted(pending), set()
    for gpu_model_id in ids:
        _enqueue(jobs_of_gpu_model(gpu_model_id))
