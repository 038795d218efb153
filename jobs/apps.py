"""App config for the jobs app."""

from django.apps import AppConfig


class JobsConfig(AppConfig):
    """Everything about training jobs: registry, metrics, artifacts, findings, baselines, reports."""

    name = "jobs"
    verbose_name = "GPU jobs"
