from django.apps import AppConfig


class VolumesConfig(AppConfig):
    name = "volumes"
