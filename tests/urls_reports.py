"""Test URLconf: the project's routes plus the weekly email preview (the lead wires it into jobs/urls.py)."""

from django.urls import include, path

from jobs import views_reports

urlpatterns = [
    path("teams/<slug:slug>/reports/<str:week>/", views_reports.report_preview, name="report-preview"),
    path("", include("efficiency.urls")),
]
