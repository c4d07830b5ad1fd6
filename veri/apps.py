from django.apps import AppConfig


class VeriConfig(AppConfig):
    name = "veri"
    verbose_name = "Tenancy"
