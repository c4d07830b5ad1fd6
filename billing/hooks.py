"""Billing's answers to training's money hook (`training.hooks.Money`), registered when the app
loads: training asks through it without importing billing."""

from datetime import datetime

from billing import jobs, selectors, services
from billing.models import BillingAccount
from training.hooks import JobMoney
from training.models import TrainingJob
from veri.errors import PaymentRequired
from veri.models import Workspace


class TrainingMoney:
    def check_account(self, *, workspace: Workspace) -> None:
        if not BillingAccount.objects.filter(workspace=workspace).exists():
            raise PaymentRequired(
                "This workspace has no billing account; add one before submitting jobs."
            )

    def require_funds(self, *, workspace: Workspace, first_hour_micros: int) -> None:
        services.require_funds(
            workspace=workspace,
            first_hour_micros=first_hour_micros,
            held_micros=lambda: selectors.unbilled(workspace=workspace).held_micros,
        )

    def attribute_cost(self, *, job: TrainingJob) -> None:
        jobs.attribute_job_cost(job=job)

    def job_money(self, *, job: TrainingJob) -> JobMoney:
        return selectors.job_money(job=job)

    def settle(self, *, job_id: int) -> None:
        services.settle_job_money(job_id=job_id)

    def enforce_stops(self, *, active: list[TrainingJob], now: datetime) -> dict[str, int]:
        return jobs.enforce_stops(active=active, now=now)

    def split_run(self, **run) -> tuple[int, int]:
        return jobs.split_run(**run)


class ServingMoney:
    """Billing's answers to serving's money hook (`serving.hooks.Money`)."""

    def charge_uptime(self, **entry) -> None:
        services.charge_deployment_uptime(**entry)

    def credit_uptime(self, **entry) -> None:
        services.credit_lost_uptime(**entry)

    def require_funds(self, *, workspace: Workspace, deploying: bool = False) -> None:
        services.require_serving_funds(workspace=workspace, deploying=deploying)

    def out_of_funds(self, *, accrued_micros: dict[int, int]) -> set[int]:
        return services.workspaces_spent(accrued_micros=accrued_micros)

    def credit_hint(self) -> str:
        return services.credit_hint()
