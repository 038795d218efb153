"""POST /jobs/<id>/artifacts/<pk>/review/: confirm, exclude or include an artifact (team members, staff)."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.views.decorators.http import require_POST

from jobs.access.permissions import can_write_team, readable_job_or_404
from jobs.intake.artifact_review import Review, ReviewError, review_artifact
from jobs.models import Artifact, Job

_DONE = {
    Review.CONFIRM: "confirmed as part of this job; the diagnosis now uses it",
    Review.EXCLUDE: "excluded from the diagnosis; it stays listed",
    Review.INCLUDE: "included in the diagnosis again",
}


@require_POST
def job_artifact_review(request: HttpRequest, external_id: str, artifact_id: int) -> HttpResponse:
    """Apply the posted `action` (confirm / exclude / include) and go back to the artifact on the job page."""
    job = readable_job_or_404(request.user, Job.objects.select_related("team"), external_id=external_id)
    if not can_write_team(request.user, job.team):
        raise PermissionDenied("Only members of the job's team can change which artifacts count.")
    artifact = get_object_or_404(Artifact, pk=artifact_id, job=job)
    try:
        action = Review(request.POST.get("action", ""))
    except ValueError:
        return HttpResponseBadRequest("action must be confirm, exclude or include")
    try:
        review_artifact(artifact, action, request.user)
    except ReviewError as exc:
        messages.error(request, f"{artifact.original_name}: {exc}.")
    else:
        messages.success(request, f"{artifact.original_name} {_DONE[action]}.")
    return HttpResponseRedirect(reverse("job-detail", args=[job.external_id]) + f"#artifact-{artifact.pk}")
