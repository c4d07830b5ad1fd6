from django.apps import AppConfig


class ServingConfig(AppConfig):
    name = "serving"
    verbose_name = "Serving: deployments and inference"

    def ready(self) -> None:
        # Training's orphan sweeper asks the floors above it which machines are theirs and live,
        # so a replica's machine is never taken for an ended job's.
        from serving.services import replicas
        from training.hooks import register_live_machines

        register_live_machines(replicas.live_machines)
