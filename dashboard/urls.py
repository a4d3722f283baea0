from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path

from dashboard import api
from dashboard.pages import views as pages
from ingest import views as ingest

urlpatterns = [
    path("api/v1/ingest", ingest.ingest, name="ingest"),
    path("api/v1/runs", api.runs, name="api-runs"),
    path("api/v1/runs/<str:key>", api.run_detail, name="api-run"),
    path("api/v1/runs/<str:key>/alerts", api.run_alerts, name="api-run-alerts"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("", pages.runs, name="runs"),
    path("runs/<str:key>/", pages.run, name="run"),
]
