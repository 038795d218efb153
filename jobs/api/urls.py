"""Routes of /api/v1/."""

from django.urls import path
from rest_framework.routers import DefaultRouter

from jobs.api.alerts import AlertListView
from jobs.api.compare import JobCompareView
from jobs.api.leaderboard import LeaderboardView
from jobs.api.views import ArtifactViewSet, BaselineViewSet, JobViewSet

router = DefaultRouter(trailing_slash=True)
# No `.json` format-suffix twins of every route (`/api/v1/jobs.json`): the API speaks JSON only, the
# views' own signatures do not take the `format` argument such a route passes (a 500), and each twin
# is one more URL to keep under access control (tests/test_route_matrix.py).
router.include_format_suffixes = False
router.register("jobs", JobViewSet, basename="job")
router.register("baselines", BaselineViewSet, basename="baseline")
router.register("artifacts", ArtifactViewSet, basename="artifact")

urlpatterns = [
    path("leaderboard/", LeaderboardView.as_view(), name="api-leaderboard"),
    path("alerts/", AlertListView.as_view(), name="api-alerts"),
    path("jobs/compare/", JobCompareView.as_view(), name="api-job-compare"),
    *router.urls,
]
