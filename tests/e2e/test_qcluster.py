"""The task cluster's watchdog: it ticks every few seconds, a qcluster stops within seconds on
SIGTERM, and the next tick survives the restart."""

import signal
import time

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
