"""`manage.py qcluster`: django-q2's, except that its guard process (the Sentinel) ignores SIGTERM.

A SIGTERM sent to the cluster's whole process group (a shell's `kill %1`, `kill -- -PGID`, a
process manager signalling every process) killed the Sentinel while it waited on the cluster's
stop event; the main process, stopping the cluster on the same signal, then waited on that event
forever (django-q2 1.11: a multiprocessing Condition's notify waits for its dead sleeper). Now the
main process alone acts on SIGTERM and the Sentinel stops the cluster as on a SIGTERM to the main
process only. The pusher, monitor and task workers keep SIGTERM's default (the Sentinel stops a
timed-out worker with it); under a group SIGTERM a task cut short is handed out again by the
broker, and a lost watchdog link is restarted by the minute schedule."""

import signal

from django_q import cluster
from django_q.management.commands.qcluster import Command as DjangoQCommand


class Sentinel(cluster.Sentinel):
    def start(self) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        super().start()

    def spawn_process(self, target, *args):
        # A child keeps SIGTERM's default: it is forked with the handlers in force at the fork.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        try:
            return super().spawn_process(target, *args)
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)


class Command(DjangoQCommand):
    def handle(self, *args, **options):
        cluster.Sentinel = Sentinel  # what Cluster.start forks as the guard process
        return super().handle(*args, **options)
