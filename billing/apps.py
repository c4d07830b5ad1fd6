from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "billing"

    def ready(self) -> None:
        # Training asks for money through this hook, never by importing billing (a higher floor).
        from billing.hooks import TrainingMoney
        from training.hooks import register_money

        register_money(TrainingMoney())
        # Serving's replicas' uptime, the same way.
        from billing.services import charge_deployment_uptime
        from serving.hooks import register_uptime_charge

        register_uptime_charge(charge_deployment_uptime)
