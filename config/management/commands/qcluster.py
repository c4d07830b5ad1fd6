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
noticed that much later. The Sentinel now runs the scheduler once before its loop.

It says what it does at INFO (VERI_CLUSTER_LOG_LEVEL): that it started, the schedules it runs,
and (training.tasks) each job it launches or settles; django-q2's own lines stay at WARNING."""

import logging
import signal

from django_q import cluster
from django_q.conf import Conf
from django_q.management.commands.qcluster import Command as DjangoQCommand
from django_q.models import Schedule
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


log = logging.getLogger(__name__)


class Command(DjangoQCommand):
    def handle(self, *args, **options):
        cluster.Sentinel = Sentinel  # what Cluster.start forks as the guard process
        log.info(
            "task cluster %r starting: %d workers, broker %s",
            Conf.PREFIX,
            Conf.WORKERS,
            "redis" if Conf.REDIS else "the database",
        )
        for schedule in Schedule.objects.order_by("name"):
            log.info("schedule %s: %s", schedule.name, _every(schedule))
        return super().handle(*args, **options)  # returns once the cluster is up


def _every(schedule: Schedule) -> str:
    if schedule.schedule_type == Schedule.MINUTES:
        return f"every {schedule.minutes} min"
    if schedule.schedule_type == Schedule.CRON:
        return f"cron {schedule.cron}"
    return schedule.get_schedule_type_display().lower()
