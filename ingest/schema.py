"""OpenAPI 3.1 description of the ingest API, generated from the protocol structs (no second copy).

Served at /api/v1/schema; schemathesis or any OpenAPI client can fuzz or call the API from it.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import msgspec

from agents import protocol


class Error(msgspec.Struct, omit_defaults=True):
    error: str
    path: str | None = None


_BEARER: list[dict[str, list[str]]] = [{"bearer": []}]


def _answers(ok: str, *statuses: int) -> dict[str, Any]:
    err = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    answers = {"200": {"description": "accepted", "content": {"application/json": {"schema": {"$ref": ok}}}}}
    answers.update({str(code): {"description": "rejected", **err} for code in statuses})
    return answers


def _post(summary: str, body: str, ok: str) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "security": _BEARER,
            "requestBody": {"required": True, "content": {"application/json": {"schema": {"$ref": body}}}},
            "responses": _answers(ok, 400, 401, 403, 409, 413, 415, 422, 429, 503),
        }
    }


@cache
def openapi() -> dict[str, Any]:
    (batch, reply, bulk, bulk_reply, upload, blob_reply, record, record_reply, err), components = (
        msgspec.json.schema_components(
            [
                protocol.Batch,
                protocol.IngestReply,
                protocol.Bulk,
                protocol.BulkReply,
                protocol.BlobUpload,
                protocol.BlobReply,
                protocol.FlightRecord,
                protocol.FlightRecordReply,
                Error,
            ],
            ref_template="#/components/schemas/{name}",
        )
    )
    components["Error"] = components.pop("Error", err)
    return {
        "openapi": "3.1.0",
        "info": {"title": "Lockstep ingest", "version": str(protocol.PROTOCOL_VERSION)},
        "paths": {
            "/api/v1/ingest": _post("One batch of one rank's events (gzip allowed)", batch["$ref"], reply["$ref"]),
            "/api/v1/ingest/bulk": _post(
                "Several ranks' batches in one transaction (a node relay's; gzip allowed)",
                bulk["$ref"],
                bulk_reply["$ref"],
            ),
            "/api/v1/blobs": _post(
                "Graph texts the server asked for in want_blobs", upload["$ref"], blob_reply["$ref"]
            ),
            "/api/v1/flight-recorder": _post(
                "A rank's Flight Recorder dump, asked for by flight_recorder in an ingest reply",
                record["$ref"],
                record_reply["$ref"],
            ),
        },
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
