"""`manage.py runserver`: Django's (with the static files, as django.contrib.staticfiles has it),
on a server that answers kept-alive connections without Nagle's delay (config/devserver.py)."""

from django.contrib.staticfiles.management.commands.runserver import Command as StaticRunserver

from config.devserver import WSGIServer


class Command(StaticRunserver):
    server_cls = WSGIServer
