"""Money: one account per workspace, an append-only ledger of integer micro-dollars, refunds and
their review, and who changed a job's attribution. The balance is the sum of the ledger."""

from django.conf import settings
from django.db import models

from veri.models import Workspace


class BillingAccount(models.Model):
    """A workspace may run jobs only with one (submit answers 402 otherwise)."""

    workspace = models.OneToOneField(
        Workspace, on_delete=models.CASCADE, related_name="billing_account"
    )
    stripe_customer_id = models.CharField(max_length=100, blank=True)
    # The mode of the key the customer was made with ("test" or "live"; blank: made before modes
    # were recorded). A key of the other mode cannot see it: Veri then makes one in that mode.
    stripe_customer_mode = models.CharField(max_length=4, blank=True)
    # Since when the balance (less running jobs' accrued cost) has been at or below zero; past a
    # grace period the running jobs are stopped with balance_exhausted.
    exhausted_since = models.DateTimeField(null=True, blank=True)
    # Why mirroring the ledger to Stripe last failed; cleared when an entry goes through.
    stripe_mirror_error = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        permissions = [("add_credit", "Can add credit to a workspace (an adjustment entry)")]

    def __str__(self) -> str:
        return f"billing account of {self.workspace}"


class JobBilling(models.Model):
    """Billing's record of one training job's money: what it costs (attributed once, when it has
    ended and its machine is terminated) and when that was charged to the ledger. Training's row
    holds none of it; this row, locked, serializes charging and crediting the job."""

    job = models.OneToOneField(
        "training.TrainingJob", on_delete=models.CASCADE, primary_key=True, related_name="billing"
    )
    cost_micros = models.PositiveBigIntegerField(null=True, blank=True)
    cost_attributed_at = models.DateTimeField(null=True, blank=True)
    billing_deducted_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"billing of job {self.job_id}"


class AppendOnly(Exception):
    """Ledger entries are never changed or removed; a correction is a new `adjustment`."""


class LedgerQuerySet(models.QuerySet):
    def update(self, **kwargs):
        raise AppendOnly("Ledger entries cannot be updated.")

    def delete(self):
        raise AppendOnly("Ledger entries cannot be deleted.")


class LedgerEntry(models.Model):
    class Kind(models.TextChoices):
        TOP_UP = "top_up"
        JOB_CHARGE = "job_charge"
        DEPLOYMENT_CHARGE = "deployment_charge"  # a replica's uptime (serving)
        TINKER_CHARGE = "tinker_charge"  # a Tinker model's machine uptime (tinker_api)
        STORAGE_CHARGE = "storage_charge"
        REFUND_CREDIT = "refund_credit"
        ADJUSTMENT = "adjustment"
        # A top-up paid back through Stripe (negative; positive when that refund failed).
        TOP_UP_REFUNDED = "top_up_refunded"
        # A disputed top-up held while the dispute is open (negative); a lost dispute keeps it.
        DISPUTE_HOLD = "dispute_hold"
        DISPUTE_RELEASED = "dispute_released"  # the hold given back: the dispute was won

    # PROTECT: a workspace with money history is never deleted with its ledger.
    workspace = models.ForeignKey(Workspace, on_delete=models.PROTECT, related_name="ledger")
    kind = models.CharField(max_length=20, choices=Kind.choices)
    # Micro-dollars; charges are negative, credits positive.
    amount_micros = models.BigIntegerField()
    # Named after what the entry pays for (`job_charge:<job pk>`): a second write of it fails.
    idempotency_key = models.CharField(max_length=200, unique=True)
    job = models.ForeignKey("training.TrainingJob", on_delete=models.PROTECT, null=True, blank=True)
    # The volume's public id, not a foreign key: deleting a volume must not touch its charges
    # (a cascade would UPDATE ledger rows, which the database refuses).
    volume_ref = models.CharField(max_length=40, blank=True)
    refund = models.ForeignKey("Refund", on_delete=models.PROTECT, null=True, blank=True)
    description = models.CharField(max_length=300, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True
    )  # null: the platform itself (a task, a webhook)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    objects = LedgerQuerySet.as_manager()

    class Meta:
        # Django's deletion cascades and related lookups use the base manager: this one refuses
        # bulk updates and deletes too.
        base_manager_name = "objects"
        verbose_name_plural = "ledger entries"
        indexes = [models.Index(fields=["workspace", "-id"])]

    def __str__(self) -> str:
        return f"{self.kind} {self.amount_micros:+} micro-USD ({self.idempotency_key})"

    def save(self, *args, **kwargs):
        if not self._state.adding:
            raise AppendOnly("Ledger entries cannot be updated.")
        # Never an UPDATE, even for a new instance given an existing pk.
        kwargs["force_insert"] = True
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise AppendOnly("Ledger entries cannot be deleted.")


class Refund(models.Model):
    """Money back for a job that failed through the platform's fault, as the catalog says: credited
    at once, or pending an operator's review (approve → credited, or deny with a reason)."""

    class Status(models.TextChoices):
        PENDING = "pending"
        APPROVED = "approved"  # decided; the credit is being written
        CREDITED = "credited"
        DENIED = "denied"

    workspace = models.ForeignKey(Workspace, on_delete=models.PROTECT, related_name="refunds")
    job = models.OneToOneField(
        "training.TrainingJob", on_delete=models.PROTECT, related_name="refund"
    )
    amount_micros = models.BigIntegerField()
    reason_code = models.CharField(max_length=40)  # the job's error code
    status = models.CharField(max_length=10, choices=Status.choices, db_index=True)
    decision_reason = models.TextField(blank=True)
    reviewer = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True
    )
    created_at = models.DateTimeField(auto_now_add=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    credited_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        permissions = [("review_refund", "Can approve, deny and re-attribute refunds")]

    def __str__(self) -> str:
        return f"refund of {self.job} ({self.status})"


class AttributionChange(models.Model):
    """An operator's re-attribution of a failed job, with the reason; it re-drives the refund."""

    job = models.ForeignKey(
        "training.TrainingJob", on_delete=models.CASCADE, related_name="attribution_changes"
    )
    from_attribution = models.CharField(max_length=20)
    to_attribution = models.CharField(max_length=20)
    reason = models.TextField()
    changed_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT)
    changed_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.job}: {self.from_attribution} → {self.to_attribution}"


class StripeMirror(models.Model):
    """Which ledger entries are mirrored to the Stripe customer balance (the ledger itself is
    never written to again), and the whole cents each moved there: the rounded running sum of
    the mirrored entries less what was mirrored before, so sub-cent entries add up instead of
    each rounding to nothing."""

    entry = models.OneToOneField(LedgerEntry, on_delete=models.PROTECT, related_name="mirror")
    amount_cents = models.BigIntegerField()  # a credit positive, as in the ledger
    stripe_transaction_id = models.CharField(max_length=100, blank=True)  # blank: 0 cents, unsent
    mirrored_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.entry_id} → {self.stripe_transaction_id}"


class StripeDeployment(models.Model):
    """One row: this database's id in what it sends to Stripe, made once (see
    `STRIPE_DEPLOYMENT_ID`, which overrides it)."""

    deployment_id = models.CharField(max_length=24, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.deployment_id


class StripeCheckout(models.Model):
    """A top-up through a Stripe Checkout Session: made when Veri creates the session, credited
    once, when Stripe reports it paid, whichever event says so (`checkout.session.completed`
    paid at once, or `checkout.session.async_payment_succeeded` for a delayed payment method).
    Its PaymentIntent ties the refunds and disputes Stripe reports later to the workspace."""

    class Status(models.TextChoices):
        OPEN = "open"  # the page was made; nothing paid yet
        PROCESSING = "processing"  # completed with a delayed payment method, not paid yet
        PAID = "paid"  # credited
        FAILED = "failed"  # the delayed payment failed: nothing credited

    session_id = models.CharField(max_length=255, unique=True)
    workspace = models.ForeignKey(
        Workspace, on_delete=models.PROTECT, related_name="stripe_checkouts"
    )
    payment_intent_id = models.CharField(max_length=255, blank=True, db_index=True)
    amount_cents = models.BigIntegerField()
    currency = models.CharField(max_length=3, default="usd")
    livemode = models.BooleanField(default=False)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.OPEN)
    entry = models.OneToOneField(
        LedgerEntry, on_delete=models.PROTECT, null=True, blank=True, related_name="checkout"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.session_id} ({self.status})"


class StripeDispute(models.Model):
    """A chargeback (or the inquiry before one) on a top-up: the amount is held in the ledger
    while it is open, given back when it is won, kept when it is lost."""

    OPEN, WON, LOST = "open", "won", "lost"

    dispute_id = models.CharField(max_length=255, unique=True)
    checkout = models.ForeignKey(StripeCheckout, on_delete=models.PROTECT, related_name="disputes")
    amount_cents = models.BigIntegerField()
    reason = models.CharField(max_length=60, blank=True)
    stripe_status = models.CharField(max_length=40)  # Stripe's own word for where it stands
    outcome = models.CharField(
        max_length=4, choices=[(OPEN, OPEN), (WON, WON), (LOST, LOST)], default=OPEN
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.dispute_id} ({self.outcome})"


class StripeEvent(models.Model):
    """Every Stripe event Veri consumes, once per event id, with what it did. `unapplied` ones
    (an unknown workspace, another currency, an amount out of range, a payment Veri cannot tie
    to a workspace) wait for an operator: they were acknowledged so that Stripe stops resending,
    and nothing was written to the ledger."""

    class Outcome(models.TextChoices):
        APPLIED = "applied"  # what it reports is in the ledger (or was already)
        IGNORED = "ignored"  # nothing to do (not paid yet, another deployment's, ...)
        UNAPPLIED = "unapplied"  # Veri cannot apply it: an operator looks

    event_id = models.CharField(max_length=255, unique=True)
    type = models.CharField(max_length=100)
    livemode = models.BooleanField(default=False)
    api_version = models.CharField(max_length=40, blank=True)
    object_id = models.CharField(max_length=255, blank=True, db_index=True)
    workspace = models.ForeignKey(
        Workspace, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    outcome = models.CharField(max_length=10, choices=Outcome.choices, db_index=True)
    detail = models.CharField(max_length=500)
    payload = models.JSONField()  # the event as Stripe sent it
    received_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    deliveries = models.PositiveIntegerField(default=1)

    def __str__(self) -> str:
        return f"{self.event_id} {self.type} ({self.outcome})"


class StripeMirrorRetry(models.Model):
    """A ledger entry whose balance transaction Stripe answered with a 500. Stripe replays that
    answer for the same idempotency key, so the entry waits out the key's window, is looked up
    in the customer's balance transactions (a 500 may still have taken effect), and only if it
    is not there is sent again under the next key."""

    entry = models.OneToOneField(LedgerEntry, on_delete=models.PROTECT, related_name="+")
    generation = models.PositiveIntegerField(default=0)  # which key: 0 is the first
    failed_at = models.DateTimeField()  # when Stripe first answered 500 under this key

    def __str__(self) -> str:
        return f"entry {self.entry_id}, key {self.generation}"
