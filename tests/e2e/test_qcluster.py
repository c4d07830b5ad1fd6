"""The task cluster's watchdog: it ticks every few seconds, a qcluster stops within seconds on
SIGTERM, and the next tick survives the restart. A task stuck past its timeout loses its worker."""

import os
import signal
import time
from pathlib import Path

import pytest
from django_q.tasks import async_task, result

from tests.conftest import wait_for
from training import tasks
from training.models import WatchdogState

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True, serialized_rollback=True)]


def state() -> WatchdogState:
    return WatchdogState.objects.get(pk=1)


def test_sigterm_stops_the_cluster_in_seconds_and_no_tick_is_lost(qcluster):
    cluster = ticking(qcluster)
    run, first = state().run, state().last_tick_at
    wait_for(lambda: state().last_tick_at > first, 15, "a second tick")
    assert tasks.ensure_watch_chain() == "ticking"  # one chain at a time

    stops_in_seconds(cluster, lambda: cluster.send_signal(signal.SIGTERM))
    stopped_at = state().last_tick_at

    qcluster(VERI_WATCH_PERIOD_SECONDS="1")
    wait_for(lambda: state().last_tick_at > stopped_at, 30, "ticks after the restart")
    assert state().run == run  # the same chain went on: its next link waited in the broker


def test_sigterm_to_the_whole_process_group_stops_it_in_seconds(qcluster):
    """A shell's `kill %1` or a process manager signals every process of the cluster: its guard
    process used to die waiting on the stop event, and the main process then hung for good."""
    cluster = ticking(qcluster)
    stops_in_seconds(cluster, lambda: os.killpg(cluster.pid, signal.SIGTERM))


def test_sigterm_reaching_the_other_processes_first_still_stops_it_in_seconds(qcluster):
    """The order a group's processes act on one signal in is the scheduler's: the guard process
    used to replace a killed task worker or monitor before the main process stopped the cluster,
    and the new one waited forever on the queue lock its predecessor died holding."""
    cluster = ticking(qcluster)
    for pid in group_members(cluster.pid):
        if pid != cluster.pid:
            os.kill(pid, signal.SIGTERM)
    time.sleep(1.5)  # the guard process checks its processes every 0.5 s
    stops_in_seconds(cluster, lambda: os.kill(cluster.pid, signal.SIGTERM))


def ticking(qcluster):
    """A cluster whose watchdog has ticked once."""
    cluster = qcluster(VERI_WATCH_PERIOD_SECONDS="1")
    assert tasks.ensure_watch_chain() == "started"
    started = state().last_tick_at
    wait_for(lambda: state().last_tick_at > started, 60, "the first tick")
    return cluster


def stops_in_seconds(cluster, send_sigterm) -> None:
    stopping = time.monotonic()
    send_sigterm()
    cluster.wait(timeout=60)
    assert time.monotonic() - stopping < 8, "qcluster took too long to stop"
    wait_for(lambda: not group_members(cluster.pid), 8, "the cluster's processes to end")


def test_a_task_stuck_past_its_timeout_loses_its_worker_and_the_next_task_runs(qcluster):
    """django-q2 interrupts a task with an alarm at its timeout; one stuck in C code never sees
    it (here `os.system`, which waits out its command however often it is signalled), and the
    guard process's SIGTERM, which task workers shrug off, would not end it either."""
    cluster = qcluster(VERI_Q_WORKERS="1", VERI_Q_TIMEOUT_SECONDS="2")
    stuck = result(async_task("os.getpid"), wait=30_000)
    assert stuck in group_members(cluster.pid)

    async_task("os.system", "sleep 60")
    wait_for(lambda: stuck not in group_members(cluster.pid), 20, "the stuck worker to end")
    replacement = result(async_task("os.getpid"), wait=30_000)
    assert replacement in group_members(cluster.pid) and replacement != stuck


def group_members(pgid: int) -> list[int]:
    """Live processes of the process group (zombies not counted: their parent has ended)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members
