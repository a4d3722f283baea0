"""POST /api/v1/flight-recorder: a rank's Flight Recorder dump, sent because an ingest reply asked.

Same token, body limit, gzip and error contract as `/api/v1/ingest` (`ingest.door`, which runs
`store` on a thread). Only a dump the server asked for is taken: one that answers a request handed
out to that rank (`flight_recorder: true` in its ingest reply) and not answered yet; any other is a
409 and nothing is stored (20 unasked 1.9 MiB dumps had been 42 MiB stored in 4.5 s). Its bytes
count against the project's byte quota, which graph texts share (`ingest.quotas`: 507 or 429 past
it, nothing stored). The dump is stored by evidence (`dashboard.evidence.flight`), the ledger's
requests it answers are marked, and after commit the ledger announces it (detection analyses the
dumps once every asked rank answered).
"""

from __future__ import annotations

import msgspec
from django.db import transaction

from agents import protocol
from dashboard.evidence import flight as evidence_flight
from dashboard.ledger import flight as ledger_flight
from dashboard.ledger import signals as ledger
from dashboard.tenancy.models import Project, Run
from ingest import quotas, validation
from ingest.refusals import Refusal


def store(project: Project, body: bytes) -> protocol.FlightRecordReply:
    """Keep one dump of a run of `project`; 404 for a run it does not have, 400 for a rank outside it,
    409 for a dump nobody asked of that rank, 507 or 429 past the project's byte quota."""
    record = validation.decode_flight_record(body)
    run = Run.objects.filter(project=project, key=record.run).first()
    if run is None:
        raise Refusal(404, f"no run {record.run!r}", "run")  # another project's run: the same 404 as a missing one
    if record.rank >= run.world_size:
        raise Refusal(400, f"rank {record.rank} is outside world_size {run.world_size}", "rank")
    with transaction.atomic():
        asked = ledger_flight.answered(run.id, record.rank)
        if not asked:
            raise Refusal(
                409,
                f"no Flight Recorder dump of rank {record.rank} of run {record.run!r} was asked for, or it was "
                "answered already: only a dump an ingest reply asked for (flight_recorder: true) is taken",
                "rank",
            )
        evidence_flight.keep(run, record.rank, record.session, record.ts, msgspec.to_builtins(record.dump), len(body))
        quotas.check_bytes(project.id, "the dump")  # raises, rolling the dump and its answers back
        transaction.on_commit(lambda: ledger.announce_flight_record(run.id, record.rank, asked))
    return protocol.FlightRecordReply(stored=True, answered=len(asked))
