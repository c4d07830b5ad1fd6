"""`manage.py qcluster`: django-q2's, except that its guard process (the Sentinel) ignores SIGTERM
and hands out the due schedules as soon as the cluster is up.

A SIGTERM sent to the cluster's whole process group (a shell's `kill %1`, `kill -- -PGID`, a
process manager signalling every process) killed the Sentinel while it waited on the cluster's
stop event; the main process, stopping the cluster on the same signal, then waited on that event
forever (django-q2 1.11: a multiprocessing Condition's notify waits for its dead sleeper). Now the
main process alone acts on SIGTERM and the Sentinel stops the cluster as on a SIGTERM to the main
process only. The pusher, monitor and task workers keep SIGTERM's default (the Sentinel stops a
timed-out worker with it); under a group SIGTERM a task cut short is handed out again by the
broker, and a lost watchdog link is restarted by the minute schedule.

django-q2 first runs its scheduler 30 s into the guard loop, so after every start the watchdog
(which the minute schedule starts) was away for half a minute: a machine lost meanwhile was
noticed that much later. The Sentinel now runs the scheduler once before its loop."""

import signal

from django_q import cluster
from django_q.conf import Conf
from django_q.management.commands.qcluster import Command as DjangoQCommand
from django_q.scheduler import scheduler


class Sentinel(cluster.Sentinel):
    def start(self) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        super().start()

    def guard(self) -> None:
        if Conf.SCHEDULER:
            scheduler(broker=self.broker)
        super().guard()

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
