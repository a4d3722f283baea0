"""POST /api/v1/flight-recorder: a rank's Flight Recorder dump, sent because an ingest reply asked.

Same token, body limit, gzip and error contract as `/api/v1/ingest` (`views._guarded`). The dump is
stored (the newest `FlightRecord.KEEP` per run and rank), the ledger's requests it answers are
marked, and after commit the ledger announces it (detection analyses the dumps once every asked
rank answered).
"""
from __future__ import annotations

import msgspec
from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from agents import protocol
from dashboard.ledger import flight as ledger_flight
from dashboard.ledger import signals as ledger
from dashboard.tenancy.models import Run
from ingest import metrics, validation, views
from ingest.models import FlightRecord
from ingest.validation import Rejection


@csrf_exempt
@require_POST
def upload_flight_record(request: HttpRequest) -> JsonResponse:
    return views._guarded(_upload, request, "flight_recorder")


def _upload(request: HttpRequest) -> JsonResponse:
    project, body = views._authorized_body(request)
    record = validation.decode_flight_record(body)
    run = Run.objects.filter(project=project, key=record.run).first()
    if run is None:
        raise Rejection(404, f"no run {record.run!r}", "run")  # another project's run: the same 404 as a missing one
    if record.rank >= run.world_size:
        raise Rejection(400, f"rank {record.rank} is outside world_size {run.world_size}", "rank")
    with transaction.atomic():
        FlightRecord.objects.create(run=run, rank=record.rank, session=record.session, ts=record.ts,
                                    entries=len(record.dump.entries), dump=msgspec.to_builtins(record.dump))
        old = FlightRecord.objects.filter(run=run, rank=record.rank).order_by("-received", "-id").values_list("id", flat=True)
        FlightRecord.objects.filter(id__in=list(old[FlightRecord.KEEP:])).delete()
        asked = ledger_flight.answered(run.id, record.rank)
        transaction.on_commit(lambda: ledger.announce_flight_record(run.id, record.rank, asked))
    metrics.REQUESTS.labels("flight_recorder", "accepted", "200").inc()
    return JsonResponse(msgspec.to_builtins(protocol.FlightRecordReply(stored=True, answered=len(asked))))
