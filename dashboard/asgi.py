"""ASGI entry point (`dashboard.asgi:application`): HTTP through Django, websockets through Channels.

The routes dashboard/urls.py marks `lean(...)` (ingest: every agent's batches) are served on the
event loop or by Django's synchronous handler on a persistent thread pool (`ingest.fastpath`,
`ingest.loop`, which say why); LOCKSTEP_INGEST_FASTPATH=0 serves them through Django's ASGI
handler like every other route.
"""
import gc
import os
import sys

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

# The collector, tuned for a server whose garbage is nearly all freed by reference counting.
# Everything loaded so far (Django, the models, the protocol) lives as long as the process: frozen,
# a full collection no longer walks it. And a young generation of 700 objects made the collector
# run at every swing of the ingest queue (a queued batch holds a few dozen objects): 11% of the
# server's CPU under relay load, gen-1 passes of 2 ms each. With 20,000 it ran once or twice in a 30 s bench run
# (bench/ingest_cadence.py; docs/bench-ingest.md).
gc.freeze()
gc.set_threshold(20_000, 10, 10)

# Each ingest process runs two threads that share the GIL: the event loop (requests) and the group
# writer (`ingest.groupcommit`). The loop lets go of the GIL many times per request (inflating its
# body, every libuv callback), and the writer, once it has it, keeps it for up to the switch
# interval: 1 ms instead of Python's 5 bounds the loop's wait (bench/ingest_cadence.py, side by
# side: 3-10% more requests/s at 2 steps per batch, docs/bench-ingest.md).
sys.setswitchinterval(0.001)
