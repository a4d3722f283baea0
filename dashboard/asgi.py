"""ASGI entry point (`dashboard.asgi:application`): HTTP through Django, websockets through Channels.

`POST /api/v1/ingest` (the hot path: every agent's batches) takes a lean route in front of
Django (`ingest.fastpath`): same view code, answers and errors, without the middleware stack
and per-request thread hops. LOCKSTEP_INGEST_FASTPATH=0 turns it off.
"""
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
django_application = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs the app registry loaded)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from dashboard.delivery.routing import websocket_urlpatterns  # noqa: E402
from ingest.fastpath import IngestRoute  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": IngestRoute(django_application),
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
