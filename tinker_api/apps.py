from django.apps import AppConfig


class TinkerApiConfig(AppConfig):
    name = "tinker_api"
    verbose_name = "Tinker: sessions, training clients and their operations"
