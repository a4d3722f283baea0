from django.urls import path, re_path

from dashboard.delivery.consumers import AlertFeed, RunFeed

websocket_urlpatterns = [
    re_path(r"^ws/runs/(?P<key>[^/]+)/$", RunFeed.as_asgi()),
    path("ws/alerts/", AlertFeed.as_asgi()),
]
