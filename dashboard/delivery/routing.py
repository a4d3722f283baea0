from django.urls import path, re_path

from dashboard.delivery.consumers import AlertFeed, RunFeed, unknown_path

websocket_urlpatterns = [
    re_path(r"^ws/runs/(?P<key>[^/]+)/$", RunFeed.as_asgi()),
    path("ws/alerts/", AlertFeed.as_asgi()),
    re_path(r"", unknown_path),  # last: any other path is a 404, not the router's error
]
