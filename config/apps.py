from django.apps import AppConfig


class DeploymentConfig(AppConfig):
    """The project's configuration: settings, the URL map, the WSGI entry point, `/healthz`, the
    API schema and the management commands that span the apps (quickstart, reconcile,
    create_workspace). It sits above every app; nothing imports it."""

    name = "config"
    verbose_name = "Deployment"

    def ready(self) -> None:
        from config import schema  # noqa: F401 - registers the schema's auth extensions
