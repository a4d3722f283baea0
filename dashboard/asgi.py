"""ASGI entry point (`dashboard.asgi:application`): HTTP through Django, websockets through Channels.

The routes dashboard/urls.py marks `lean(...)` (ingest: every agent's batches) are served on the
event loop or by Django's synchronous handler on a persistent thread pool (`ingest.fastpath`,
`ingest.loop`, which say why); LOCKSTEP_INGEST_FASTPATH=0 serves them through Django's ASGI
handler like every other route.
"""
import gc
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
django_application = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs the app registry loaded)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402

from dashboard.delivery.routing import websocket_urlpatterns  # noqa: E402
from ingest.fastpath import LeanRoutes  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": LeanRoutes(django_application) if settings.LOCKSTEP_INGEST_FASTPATH else django_application,
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)

# Everything loaded so far (Django, the models, the protocol) lives as long as the process: out of
# the collector's sight, a full collection no longer walks it. Under ingest load those collections
# had cost about a third of the writer's CPU per batch (bench/ingest_cadence.py, docs/bench-ingest.md).
gc.freeze()
