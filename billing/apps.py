from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "billing"

    def ready(self) -> None:
        # Training asks for money through this hook, never by importing billing (a higher floor).
        from billing.hooks import TrainingMoney
        from training.hooks import register_money

        register_money(TrainingMoney())
        # Serving's replicas' uptime and funds, the same way.
        from billing.hooks import ServingMoney
        from serving.hooks import register_money as register_serving_money

        register_serving_money(ServingMoney())
