"""A user's say on whether an artifact counts: confirm a mismatched one, exclude one, include it again.

The one writer of `Artifact.confirmed_*` and `Artifact.excluded_*`. Each change re-derives the job's
profiler facts from the artifacts that count and re-runs the job's evaluation and diagnosis, so the page,
leaderboard and email move together.
"""

from __future__ import annotations

import logging
from enum import StrEnum
from typing import Any

from django.db import transaction
from django.utils import timezone

from jobs.intake.artifacts import after_parse, refresh_profiler_facts
from jobs.models import Artifact

log = logging.getLogger(__name__)


class Review(StrEnum):
    """What a user can do to an artifact's place in the diagnosis."""

    CONFIRM = "confirm"  # it belongs to this job despite the run check's mismatch, or though unverifiable
    EXCLUDE = "exclude"  # keep it listed, leave it out of findings and dollars
    INCLUDE = "include"  # undo an exclusion


class ReviewError(ValueError):
    """A review that does not apply (e.g. confirming an artifact that matches); shown to the user."""


def review_artifact(artifact: Artifact, action: Review | str, user: Any) -> Artifact:
    """Apply `action` by `user` (permission already checked) and re-evaluate the job; returns the artifact."""
    action = Review(action)
    with transaction.atomic():
        art = Artifact.objects.select_for_update().get(pk=artifact.pk)
        if action is Review.CONFIRM:
            if art.run_check not in (Artifact.RunCheck.MISMATCH, Artifact.RunCheck.UNVERIFIABLE):
                raise ReviewError(
                    "only an artifact that does not match its job, or that carries nothing to check, "
                    "needs confirming"
                )
            art.confirmed_at, art.confirmed_by = timezone.now(), user
        elif action is Review.EXCLUDE:
            art.excluded_at, art.excluded_by = timezone.now(), user
        else:
            art.excluded_at, art.excluded_by = None, None
        art.save(update_fields=["confirmed_at", "confirmed_by", "excluded_at", "excluded_by"])
        refresh_profiler_facts(art.job_id)
    log.info("artifact %s of job %s: %s by %s", art.pk, art.job_id, action.value, user)
    after_parse(art)
    return art
