"""The one route table, for Django's handlers and for the lean route alike (`lean(...)`: ingest.fastpath)."""
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path

from dashboard.web import api
from dashboard.web.pages import views as pages
from ingest import flight as ingest_flight
from ingest import views as ingest
from ingest.fastpath import lean

urlpatterns = [
    path("api/v1/ingest", lean(ingest.ingest, on_loop="ingest"), name="ingest"),
    path("api/v1/ingest/bulk", lean(ingest.ingest_bulk, on_loop="bulk"), name="ingest-bulk"),
    path("api/v1/blobs", lean(ingest.upload_blobs), name="blobs"),
    path("api/v1/flight-recorder", ingest_flight.upload_flight_record, name="flight-recorder"),
    path("api/v1/schema", ingest.openapi, name="api-schema"),
    path("metrics", ingest.prometheus, name="metrics"),
    path("api/v1/runs", api.runs, name="api-runs"),
    path("api/v1/runs/<str:key>", api.run_detail, name="api-run"),
    path("api/v1/runs/<str:key>/alerts", api.run_alerts, name="api-run-alerts"),
    path("api/v1/runs/<str:key>/baseline", api.run_baseline, name="api-run-baseline"),
    path("api/v1/runs/<str:key>/timeline", api.run_timeline, name="api-run-timeline"),
    path("api/v1/compare", api.compare, name="api-compare"),
    path("api/v1/alerts/<int:alert_id>/ack", api.alert_ack, name="api-alert-ack"),
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
    path("alerts/<int:alert_id>/ack/", pages.alert_ack, name="alert-ack"),
    path("alerts/<int:alert_id>/unack/", pages.alert_unack, name="alert-unack"),
    path("silences/", pages.silence_create, name="silence-create"),
    path("silences/<int:silence_id>/expire/", pages.silence_expire, name="silence-expire"),
    path("compare/", pages.compare, name="compare"),
    path("compare/frame/", pages.compare_frame, name="compare-frame"),
]
