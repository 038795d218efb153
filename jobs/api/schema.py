"""OpenAPI schema post-processing: every operation gets a readable summary (Redoc titles operations by their
summary, and fell back to operationIds such as `jobs_artifacts_create`)."""

from __future__ import annotations

import re
from typing import Any

_VERBS = {"list": "List", "create": "Create", "retrieve": "Get", "update": "Replace",
          "partial_update": "Update", "destroy": "Delete"}  # fmt: skip


def summary_of(operation_id: str, description: str) -> str:
    """The first sentence of the operation's description (its view's docstring), or the operationId in words
    ("jobs_artifacts_create" -> "Create jobs artifacts")."""
    first = re.split(r"(?<=[.!?])\s|\n\n", description.strip(), maxsplit=1)[0].strip().rstrip(".")
    if first and len(first) <= 90:
        return first
    for suffix, verb in sorted(_VERBS.items(), key=lambda kv: -len(kv[0])):
        if operation_id.endswith("_" + suffix):
            return f"{verb} {operation_id[: -len(suffix) - 1].replace('_', ' ')}"
    return operation_id.replace("_", " ").capitalize()


def add_summaries(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular POSTPROCESSING_HOOKS entry: fill `summary` where a view did not set one."""
    for methods in (result.get("paths") or {}).values():
        for operation in methods.values():
            if isinstance(operation, dict) and not operation.get("summary"):
                operation["summary"] = summary_of(
                    str(operation.get("operationId", "")), str(operation.get("description", ""))
                )
    return result
