"""The task cluster's watchdog: it ticks every few seconds, a qcluster stops within seconds on
SIGTERM, and the next tick survives the restart."""

import os
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import wait_for
from training import tasks
from training.models import WatchdogState

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True, serialized_rollback=True)]


def state() -> WatchdogState:
    return WatchdogState.objects.get(pk=1)


def test_sigterm_stops_the_cluster_in_seconds_and_no_tick_is_lost(qcluster):
    env = {"VERI_WATCH_PERIOD_SECONDS": "1"}
    cluster = qcluster(**env)
    assert tasks.ensure_watch_chain() == "started"
    run, started = state().run, state().last_tick_at
    wait_for(lambda: state().last_tick_at > started, 60, "the first tick")
    first = state().last_tick_at
    wait_for(lambda: state().last_tick_at > first, 15, "a second tick")
    assert tasks.ensure_watch_chain() == "ticking"  # one chain at a time

    stopping = time.monotonic()
    cluster.send_signal(signal.SIGTERM)
    cluster.wait(timeout=60)
    assert time.monotonic() - stopping < 8, "qcluster took too long to stop"
    stopped_at = state().last_tick_at

    qcluster(**env)
    wait_for(lambda: state().last_tick_at > stopped_at, 30, "ticks after the restart")
    assert state().run == run  # the same chain went on: its next link waited in the broker


def test_sigterm_to_the_whole_process_group_stops_it_in_seconds(qcluster):
    """A shell's `kill %1` or a process manager signals every process of the cluster: its guard
    process used to die waiting on the stop event, and the main process then hung for good."""
    cluster = qcluster(VERI_WATCH_PERIOD_SECONDS="1")
    assert tasks.ensure_watch_chain() == "started"
    started = state().last_tick_at
    wait_for(lambda: state().last_tick_at > started, 60, "the first tick")

    stopping = time.monotonic()
    os.killpg(cluster.pid, signal.SIGTERM)
    cluster.wait(timeout=60)
    assert time.monotonic() - stopping < 8, "qcluster took too long to stop"
    wait_for(lambda: not group_members(cluster.pid), 8, "the cluster's processes to end")


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
