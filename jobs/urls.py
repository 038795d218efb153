"""Page routes of the jobs app."""

from django.urls import path

from jobs import views
from jobs.alerts import views as alert_views
from jobs.views import exports
from jobs.views import reports as report_views
from jobs.views.artifact_review import job_artifact_review
from jobs.views.compare import job_compare
from jobs.views.settings_page import effective_settings_page

urlpatterns = [
    path("", views.job_list, name="job-list"),
    path("jobs.csv", exports.job_list_csv, name="job-list-csv"),
    path("leaderboard.csv", exports.leaderboard_csv, name="leaderboard-csv"),
    path("jobs/compare/", job_compare, name="job-compare"),
    path("jobs/<str:external_id>/", views.job_detail, name="job-detail"),
    path("jobs/<str:external_id>/figures.json", views.job_figures, name="job-figures"),
    path("jobs/<str:external_id>/series.csv", exports.job_series_csv, name="job-series-csv"),
    path("jobs/<str:external_id>/artifacts/", views.job_artifact_upload, name="job-artifact-upload"),
    path(
        "jobs/<str:external_id>/artifacts/<int:artifact_id>/reparse/",
        views.job_artifact_reparse,
        name="job-artifact-reparse",
    ),
    path(
        "jobs/<str:external_id>/artifacts/<int:artifact_id>/review/",
        job_artifact_review,
        name="job-artifact-review",
    ),
    path("jobs/<str:external_id>/promote/", views.job_promote_baseline, name="job-promote-baseline"),
    path("leaderboard/", views.leaderboard, name="leaderboard"),
    path("teams/", views.team_list, name="team-list"),
    path("teams/<slug:slug>/", views.team_detail, name="team-detail"),
    path("teams/<slug:slug>/budget/", views.team_budget, name="team-budget"),
    path("teams/<slug:slug>/reports/<str:week>/", report_views.report_preview, name="report-preview"),
    path("teams/<slug:slug>/alerts/", alert_views.team_alerts, name="team-alerts"),
    path(
        "teams/<slug:slug>/alerts/subscriptions/",
        alert_views.team_subscription_add,
        name="team-alert-subscription-add",
    ),
    path("teams/<slug:slug>/alerts/idle-policy/", alert_views.team_idle_policy, name="team-idle-policy"),
    path("alerts/mine/", alert_views.my_alerts, name="my-alerts"),
    path(
        "alerts/subscriptions/<int:pk>/delete/",
        alert_views.subscription_delete,
        name="alert-subscription-delete",
    ),
    path("baselines/", views.baseline_list, name="baseline-list"),
    path("baselines/<int:pk>/retire/", views.baseline_retire, name="baseline-retire"),
    path("catalog/", views.gpu_catalog, name="gpu-catalog"),
    path("readiness/", views.cluster_readiness, name="cluster-readiness"),
    path("settings/", effective_settings_page, name="effective-settings"),
]
