"""`manage.py qcluster`: django-q2's, except that a SIGTERM stops the cluster only through its
main process, and its guard process (the Sentinel) hands out the due schedules as soon as the
cluster is up.

A SIGTERM sent to the cluster's whole process group (a shell's `kill %1`, `kill -- -PGID`, a
process manager signalling every process) killed each process where it stood. The Sentinel died
waiting on the cluster's stop event, and the main process, stopping the cluster on the same
signal, then waited on that event forever (django-q2 1.11: a multiprocessing Condition's notify
waits for its dead sleeper). A task worker or the monitor died inside its queue's read lock, and
when the Sentinel replaced it before the main process's stop reached it, the new one waited on
that lock forever and the Sentinel on the new one. So the Sentinel and every process it starts
shrug SIGTERM off: the main process alone acts on it, and the Sentinel stops the others as on a
SIGTERM to the main process only (each task worker ends its task, then takes its poison pill),
as Ctrl-C already did (django-q2 has them all ignore SIGINT). A task worker whose task is stuck
past its timeout (in C code, out of reach of django-q2's alarm), which django-q2 ends with
SIGTERM, is killed. The shrug is a handler, not SIG_IGN: a program that a task starts gets
SIGTERM's default back when it is executed.

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


def _shrug_off(signum, frame) -> None:
    """SIGTERM's handler in the Sentinel and the processes it forks (see above)."""


class Sentinel(cluster.Sentinel):
    def start(self) -> None:
        signal.signal(signal.SIGTERM, _shrug_off)  # forked children inherit it
        super().start()

    def guard(self) -> None:
        if Conf.SCHEDULER:
            scheduler(broker=self.broker)
        super().guard()

    def reincarnate(self, process) -> None:
        timed_out = process in self.pool and process.timer.value == 0
        super().reincarnate(process)  # replaces it, and sends the SIGTERM it shrugs off
        if timed_out:
            process.kill()


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
