"""App config for the jobs app."""

from django.apps import AppConfig


class JobsConfig(AppConfig):
    """Everything about training jobs: registry, metrics, artifacts, findings, baselines, reports."""

    name = "jobs"
    verbose_name = "GPU jobs"

    def ready(self) -> None:
        """A price book change re-evaluates the jobs of that GPU model (cost and waste follow the book); job
        and membership changes invalidate the cached compare links.
        The tasks are registered in every process (web too), so `jobs.runtime.enqueue` can queue them by
        name."""
        from django.db.models.signals import post_delete, post_save

        import jobs.tasks  # noqa: F401  (registers the Celery tasks)
        from jobs.models import PriceEntry
        from jobs.pipeline.refresh import after_price_change

        post_save.connect(after_price_change, sender=PriceEntry, dispatch_uid="reevaluate-on-price-save")
        post_delete.connect(after_price_change, sender=PriceEntry, dispatch_uid="reevaluate-on-price-delete")
        # Deleting an artifact (or its job) deletes its blob unless another artifact has the same bytes.
        from jobs.intake.artifacts import artifact_deleted
        from jobs.models import Artifact

        post_delete.connect(artifact_deleted, sender=Artifact, dispatch_uid="artifact-blob-on-delete")
        # The job page's cached compare links follow every job and membership change (worker processes
        # register jobs too, so the receivers are connected here, not where the template tag loads).
        from jobs.models import Job, Membership
        from jobs.templatetags.compare_links import bump_generation, job_saved

        post_save.connect(job_saved, sender=Job, dispatch_uid="compare-links-job-save")
        post_delete.connect(bump_generation, sender=Job, dispatch_uid="compare-links-job-delete")
        post_save.connect(bump_generation, sender=Membership, dispatch_uid="compare-links-membership-save")
        post_delete.connect(
            bump_generation, sender=Membership, dispatch_uid="compare-links-membership-delete"
        )
