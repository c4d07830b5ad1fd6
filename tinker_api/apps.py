from django.apps import AppConfig


class TinkerApiConfig(AppConfig):
    name = "tinker_api"
    verbose_name = "Tinker: sessions, training clients and their operations"

    def ready(self) -> None:
        # Training's orphan sweeper asks the floors above it which machines are theirs and
        # live, so a model's machine is never taken for an ended job's.
        from tinker_api import checks  # noqa: F401 - registers the settings' checks
        from tinker_api.services import checkpoints, sessions
        from training.hooks import register_fine_tuned_names, register_live_machines

        register_live_machines(sessions.live_machines)
        # Its saves' `tinker://` paths name adapters to deployments and managed jobs.
        register_fine_tuned_names(checkpoints.resolve_adapter)
