"""Top-level routes: pages, admin, API v1 with its OpenAPI schema and docs, health."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView

from jobs.api.root import ApiRootView
from jobs.demo.live import live_exporter_view
from jobs.outputs.exporter import metrics_view
from jobs.sso.views import LocalAndSsoLogoutView
from jobs.views import healthz

admin.site.site_header = "efficiency administration"
admin.site.site_title = "efficiency admin"

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics_view, name="metrics"),
    path("simulated/dcgm-exporter/metrics", live_exporter_view, name="demo-exporter"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    # Ends the local session, and the provider's too after an SSO login when OIDC_END_SESSION_ENDPOINT is set.
    path("logout/", LocalAndSsoLogoutView.as_view(), name="logout"),
    # OpenID Connect login (jobs.sso.views): 404 unless OIDC_ENABLED=true.
    path("oidc/", include("jobs.sso.views")),
    path("admin/", admin.site.urls),
    path("api/v1/", ApiRootView.as_view(), name="api-root"),  # before the router's root, which it replaces
    path("api/v1/", include("jobs.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularRedocView.as_view(url_name="api-schema"), name="api-docs"),
    path("", include("jobs.urls")),
]
