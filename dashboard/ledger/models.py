"""The ledger: what every rank must report once (slots), how far each rank got (watermarks), and
what the server asked ranks for (detail requests).

Ingest records reports here inside its batch transaction; detection settles what is ready. Only
this app writes these tables or names them in SQL (`dashboard.ledger.slots`). Tables are named
`ledger_*` for it.
"""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q

from dashboard.tenancy.models import Run


class Slot(models.Model):
    """Something every rank must report once; settles when all did or the settle timeout passed.

    `reported` counts rank reports; the slot is pending while it was never settled or more
    reports arrived since (`reported > settled_n`), so late reports re-run the rules. A slot whose
    settle raised is quarantined (`slots.quarantine`): settled without a verdict and marked
    `quarantined_at`, so the sweep stops retrying it (a later report tries once more) and /metrics
    counts it.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE)
    reported = models.PositiveIntegerField(default=0)
    first_seen = models.DateTimeField()
    settled_at = models.DateTimeField(null=True)
    settled_n = models.PositiveIntegerField(default=0)
    dissenters = ArrayField(models.PositiveIntegerField(), default=list)
    consensus = models.JSONField(default=dict)
    quarantined_at = models.DateTimeField(null=True)

    class Meta:
        abstract = True

    @property
    def pending(self) -> bool:
        return self.settled_at is None or self.reported > self.settled_n


class CompileSlot(Slot):
    """(run, normalized frame key, n-th compile of that frame).

    `step` is the earliest step a rank reported it at: a rank that has reported progress past it
    without reporting the compile did not compile it (its events arrive in order), so once every
    rank has, the slot is complete without waiting for the settle timeout (`slots.compiles_passed`).
    """

    frame = models.CharField(max_length=512)
    index = models.PositiveIntegerField()
    step = models.BigIntegerField(null=True)  # None: compiled outside the training steps

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "frame", "index"], name="compile_slot_once")]
        indexes = [
            models.Index(fields=["settled_at", "first_seen"], name="compile_slot_sweep"),
            models.Index(fields=["run"], name="compile_slot_quarantined", condition=Q(quarantined_at__isnull=False)),
        ]


class GradSlot(Slot):
    """(run, step, comparison group); the buckets are compared inside one slot."""

    step = models.BigIntegerField()
    group = models.CharField(max_length=64)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "step", "group"], name="grad_slot_once")]
        indexes = [
            models.Index(fields=["settled_at", "first_seen"], name="grad_slot_sweep"),
            models.Index(fields=["run"], name="grad_slot_quarantined", condition=Q(quarantined_at__isnull=False)),
            # a batch's late reports (`slots.grad_reports_ctes`): one descent finds no settled slot
            # among its steps, where probing each step by grad_slot_once cost ~2 us per rank-step
            models.Index(
                fields=["run", "group", "step"], name="grad_slot_settled", condition=Q(settled_at__isnull=False)
            ),
        ]


class GradWatermark(models.Model):
    """The highest step each rank reported for one comparison group: one row per rank, not per step.

    A grad slot is complete once every rank's watermark passed it, so ingest updates one row per
    batch instead of a counter per rank-step (1024 ranks would otherwise rewrite each slot row
    1024 times). See dashboard.ledger.slots.

    `step` is deliberately not indexed: with room left in each page (fillfactor 50) the update every
    batch makes is HOT, writing no index entry at all (an index on step cost three index entries
    and four WAL records per batch). The highest step comes from the slots instead, and the lowest
    is read only once a slot may be complete (`grads_ready_sql`).
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, db_index=False)  # both indexes lead with run
    group = models.CharField(max_length=64)
    rank = models.PositiveIntegerField()
    step = models.BigIntegerField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "group", "rank"], name="watermark_per_rank")]


class DetailRequest(models.Model):
    """The server wants one rank's per-parameter fingerprints of one step (to name the parameters
    behind a grad divergence). Handed to the rank in its next ingest reply, answered by `detail` events."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE)
    rank = models.PositiveIntegerField()
    step = models.BigIntegerField()
    group = models.CharField(max_length=64)
    alert_id = models.BigIntegerField(
        db_index=True
    )  # the alert that asked (detection's; no foreign key: the ledger sits below it)
    asked_at = models.DateTimeField(null=True)
    answered_at = models.DateTimeField(null=True)
    asks = models.PositiveSmallIntegerField(default=0)  # hand-outs so far: a reply lost on the way is asked again

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "rank", "step", "group"], name="detail_once")]
        indexes = [
            models.Index(fields=["run", "rank"], condition=models.Q(asked_at__isnull=True), name="detail_unasked")
        ]


class WeightsRequest(models.Model):
    """The server wants every rank's weight fingerprint of `group` after one step (a `param` event, as
    every `LOCKSTEP_PARAM_EVERY` steps), to confirm a divergence of the weights' inputs. One row for
    every rank, as agreement is stored: it is handed out in each batch's reply while its rank is
    still below the step (a reply lost on the way is made good by the next), and the weight slot of
    that step is the answer. A row per rank cost a 100,000-rank divergence 100,000 rows in the
    settle that pages it, and as many updates in the ingest of the step after."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE)
    step = models.BigIntegerField()
    group = models.CharField(max_length=64)
    alert_id = models.BigIntegerField()  # detection's alert; no foreign key: the ledger sits below it
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "step", "group"], name="weights_once")]


class FlightRecorderRequest(models.Model):
    """The server wants one rank's Flight Recorder dump (a `hang_forecast` alert asked, at one of its
    revisions). Handed out in the rank's next ingest reply (`flight_recorder: true`), answered by the
    dump's upload (`POST /api/v1/flight-recorder`)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE)
    rank = models.PositiveIntegerField()
    alert_id = models.BigIntegerField()  # detection's alert; no foreign key: the ledger sits below it
    revision = models.PositiveIntegerField()  # the alert's revision that asked: a new episode asks again
    created_at = models.DateTimeField(auto_now_add=True)
    asked_at = models.DateTimeField(null=True)
    answered_at = models.DateTimeField(null=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["alert_id", "revision", "rank"], name="fr_request_once")]
        indexes = [models.Index(fields=["run", "rank"], condition=models.Q(asked_at__isnull=True), name="fr_unasked")]
