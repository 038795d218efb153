"""GET /api/v1/: the API's entry points, each an API URL (the router's own root reversed names such as
"job-list" that the HTML pages also use, so it linked to pages)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.reverse import reverse
from rest_framework.views import APIView


class ApiRootView(APIView):
    """Links to the API's collections and its schema and docs, all under /api/."""

    @extend_schema(exclude=True)
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        from jobs.api.urls import router

        base = reverse("api-root", request=request)
        links: dict[str, str] = {prefix: f"{base}{prefix}/" for prefix, _, _ in router.registry}
        links["leaderboard"] = reverse("api-leaderboard", request=request)
        links["compare"] = reverse("api-job-compare", request=request)
        links["schema"] = reverse("api-schema", request=request)
        links["docs"] = reverse("api-docs", request=request)
        return Response(links)
