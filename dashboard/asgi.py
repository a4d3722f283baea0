"""ASGI entry point (`dashboard.asgi:application`): the agents' door, then Django; websockets through Channels.

The agents' four endpoints (ingest, bulk, blobs, flight recorder) are mounted by path and served
on the event loop by `ingest.door`, which says why; every other path (pages, login, admin, the
read API) goes to Django's handler behind the edge (`dashboard.web.edge`). Both read bodies with
`ingest.bodies`: one route table of body limits, one deadline.
"""

import gc
import os
import sys
from typing import cast

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
django_application = get_asgi_application()

from channels.routing import ProtocolTypeRouter  # noqa: E402  (needs the app registry loaded)

from dashboard.apps import bound_sessions  # noqa: E402
from dashboard.delivery import routing  # noqa: E402
from dashboard.web.edge import ASGIApp, BodyEdge, ClientAddress  # noqa: E402
from ingest.door import Door  # noqa: E402

# Django's handler is an ASGI app; its stub types the scope as a dict and the messages as Mappings, narrower than ours
django_asgi_app = cast(ASGIApp, django_application)
bound_sessions()  # before the first connection: every lock wait and statement of this server is bounded
application = ClientAddress(  # the client's address: the socket's peer, or a trusted proxy's word for it
    ProtocolTypeRouter(
        {
            # one body reader and limit table (`ingest.bodies`): the door reads its routes' bodies, BodyEdge Django's
            "http": Door(BodyEdge(django_asgi_app)),
            "websocket": routing.application,  # the Origin (scheme, host and port), the session, the feed
        }
    )
)

# Everything loaded so far (Django, the models, the protocol) lives as long as the process: frozen,
# the collector's full passes no longer walk it (under relay load they had cost about a third of
# the group writer's CPU, bench/ingest_cadence.py; docs/bench-ingest.md). The thresholds stay
# Python's: Django's connection wrappers hold reference cycles, and a wrapper left behind by a
# finished request context closes its PostgreSQL connection only when the collector frees it (with
# a young generation of 20,000 they piled up until PostgreSQL refused clients).
gc.freeze()

# Each ingest process runs two threads that share the GIL: the event loop (requests) and the group
# writer (`ingest.groupcommit`). The loop lets go of the GIL many times per request (inflating its
# body, every libuv callback), and the writer, once it has it, keeps it for up to the switch
# interval: 1 ms instead of Python's 5 bounds the loop's wait (bench/ingest_cadence.py, side by
# side: 3-10% more requests/s at 2 steps per batch, docs/bench-ingest.md).
sys.setswitchinterval(0.001)
