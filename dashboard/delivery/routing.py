from channels.auth import AuthMiddlewareStack
from channels.routing import URLRouter
from django.urls import path, re_path

from dashboard.delivery.consumers import AlertFeed, RunFeed, unknown_path
from dashboard.delivery.origin import SameOrigin

websocket_urlpatterns = [
    re_path(r"^ws/runs/(?P<key>[^/]+)/$", RunFeed.as_asgi()),
    path("ws/alerts/", AlertFeed.as_asgi()),
    # last: any other path is a 404, not the router's error (an ASGI app, which django-stubs' re_path does not know)
    re_path(r"", unknown_path),  # type: ignore[arg-type]
]

# What dashboard/asgi.py serves for websockets: the Origin checked first, then the session's user, then the path
application = SameOrigin(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))
