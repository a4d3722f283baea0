"""POST /api/v1/flight-recorder: a rank's Flight Recorder dump, sent because an ingest reply asked.

Same token, body limit, gzip and error contract as `/api/v1/ingest` (`ingest.door`, which runs
`store` on a thread). The dump is stored by evidence (`dashboard.evidence.flight`), the ledger's
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
from ingest import validation
from ingest.refusals import Refusal


def store(project: Project, body: bytes) -> protocol.FlightRecordReply:
    """Keep one dump of a run of `project`; 404 for a run it does not have, 400 for a rank outside it."""
    record = validation.decode_flight_record(body)
    run = Run.objects.filter(project=project, key=record.run).first()
    if run is None:
        raise Refusal(404, f"no run {record.run!r}", "run")  # another project's run: the same 404 as a missing one
    if record.rank >= run.world_size:
        raise Refusal(400, f"rank {record.rank} is outside world_size {run.world_size}", "rank")
    with transaction.atomic():
        evidence_flight.keep(run, record.rank, record.session, record.ts, msgspec.to_builtins(record.dump))
        asked = ledger_flight.answered(run.id, record.rank)
        transaction.on_commit(lambda: ledger.announce_flight_record(run.id, record.rank, asked))
    return protocol.FlightRecordReply(stored=True, answered=len(asked))
