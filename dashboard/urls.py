"""Django's route table: pages, login, admin and the read API. The agents' POST endpoints are
served ahead of Django by `ingest.door` (dashboard/asgi.py)."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path

from dashboard.web import api
from dashboard.web.pages import cost as cost_pages
from dashboard.web.pages import live, reference
from dashboard.web.pages import views as pages
from ingest import views as ingest

urlpatterns = [
    path("api/v1/schema", ingest.openapi, name="api-schema"),
    path("metrics", ingest.prometheus, name="metrics"),
    path("api/v1/runs", api.runs, name="api-runs"),
    path("api/v1/runs/<str:key>", api.run_detail, name="api-run"),
    path("api/v1/runs/<str:key>/alerts", api.run_alerts, name="api-run-alerts"),
    path("api/v1/runs/<str:key>/baseline", api.run_baseline, name="api-run-baseline"),
    path("api/v1/runs/<str:key>/incidents", api.run_incidents, name="api-run-incidents"),
    path("api/v1/runs/<str:key>/timeline", api.run_timeline, name="api-run-timeline"),
    path("api/v1/runs/<str:key>/cost", api.run_cost, name="api-run-cost"),
    path("api/v1/runs/<str:key>/now", live.run_now_view, name="api-run-now"),
    path("api/v1/compare", api.compare, name="api-compare"),
    path("api/v1/alerts/<int:alert_id>/ack", api.alert_ack, name="api-alert-ack"),
    path("api/v1/alerts/<int:alert_id>/resolve", api.alert_resolve, name="api-alert-resolve"),
    path("api/v1/incidents/<int:incident_id>/ack", api.incident_ack, name="api-incident-ack"),
    path("api/v1/silences", api.silences, name="api-silences"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("", pages.runs, name="runs"),
    path("runs/<str:key>/", pages.run, name="run"),
    path("runs/<str:key>/baseline/", pages.run_baseline, name="run-baseline"),
    path("runs/<str:key>/ranks/<int:rank>/", pages.rank, name="rank"),
    path("runs/<str:key>/frame/", pages.frame, name="frame"),
    path("alerts/", pages.alerts, name="alerts"),
    path("alerts/reference/", reference.alert_reference, name="alert-reference"),
    path("alerts/<int:alert_id>/ack/", pages.alert_ack, name="alert-ack"),
    path("alerts/<int:alert_id>/unack/", pages.alert_unack, name="alert-unack"),
    path("incidents/<int:incident_id>/ack/", pages.incident_ack, name="incident-ack"),
    path("silences/", pages.silence_create, name="silence-create"),
    path("silences/<int:silence_id>/expire/", pages.silence_expire, name="silence-expire"),
    path("projects/<slug:name>/cost/", cost_pages.project_cost, name="project-cost"),
    path("compare/", pages.compare, name="compare"),
    path("compare/frame/", pages.compare_frame, name="compare-frame"),
]
