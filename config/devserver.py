"""Django's development server (`manage.py runserver`, the tests' live server) with Nagle's
algorithm off, as gunicorn runs production.

Django's request handler sends a response's headers and its body in two writes. On a kept-alive
connection the client delays its ACK of the headers (it has nothing to send back yet), and with
Nagle's algorithm the body waits for that ACK: 40 ms added to every request after a
connection's first (python/cpython#108736), where the answer itself takes 2 ms. The worker's
heartbeats and log batches, Tinker's polls, the CLI's calls all keep their connections."""

import socket

from django.core.servers import basehttp


class NoDelay:
    def get_request(self):
        connection, address = super().get_request()
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return connection, address


class WSGIServer(NoDelay, basehttp.WSGIServer):
    """runserver's (it adds threads, as it does to Django's own)."""


class ThreadedWSGIServer(NoDelay, basehttp.ThreadedWSGIServer):
    """The live server's of Django's and pytest-django's test helpers."""
