"""Routes of /api/v1/."""

from rest_framework.routers import DefaultRouter

from jobs.api.views import ArtifactViewSet, BaselineViewSet, JobViewSet

router = DefaultRouter(trailing_slash=True)
router.register("jobs", JobViewSet, basename="job")
router.register("baselines", BaselineViewSet, basename="baseline")
router.register("artifacts", ArtifactViewSet, basename="artifact")

urlpatterns = router.urls
