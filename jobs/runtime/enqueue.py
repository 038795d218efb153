"""Queue a Celery task by its registered name, so library code never imports `jobs.tasks`.

`jobs.tasks` imports the modules whose work it runs (ingestion, artifacts, re-evaluation, reports); those
modules queue follow-up work through here instead of importing the tasks back, which keeps the import
graph acyclic. The task is looked up in the app's registry at call time, so eager mode
(CELERY_TASK_ALWAYS_EAGER, used by the tests and the demo) runs it inline as `.delay` would.
"""

from __future__ import annotations

from typing import Any

from celery import current_app


def enqueue(name: str, *args: Any) -> None:
    """`.delay(*args)` on the task registered as `jobs.tasks.<name>`; KeyError for an unknown name."""
    current_app.tasks[f"jobs.tasks.{name}"].delay(*args)
