from django.urls import path, re_path

from dashboard.delivery.consumers import AlertFeed, RunFeed, unknown_path

websocket_urlpatterns = [
    re_path(r"^ws/runs/(?P<key>[^/]+)/$", RunFeed.as_asgi()),
    path("ws/alerts/", AlertFeed.as_asgi()),
    # last: any other path is a 404, not the router's error (an ASGI app, which django-stubs' re_path does not know)
    re_path(r"", unknown_path),  # type: ignore[arg-type]
]
