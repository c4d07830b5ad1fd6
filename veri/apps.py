from django.apps import AppConfig


class VeriConfig(AppConfig):
    name = "veri"
    verbose_name = "Tenancy"

    def ready(self) -> None:
        from veri import schema  # noqa: F401 - registers the schema's auth extensions
