"""Page routes of the jobs app."""

from django.urls import path

from jobs import views

urlpatterns = [
    path("", views.job_list, name="job-list"),
    path("jobs/<str:external_id>/", views.job_detail, name="job-detail"),
    path("leaderboard/", views.leaderboard, name="leaderboard"),
    path("teams/", views.team_list, name="team-list"),
    path("teams/<slug:slug>/", views.team_detail, name="team-detail"),
    path("baselines/", views.baseline_list, name="baseline-list"),
]
