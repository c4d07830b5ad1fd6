import os
import signal
import subprocess
import sys

import pytest
from django.db import connection
from django.test import override_settings

from providers.local import LocalProvider
from providers.models import Instance
from tests.conftest import REPO


def database_url() -> str:
    """The test database, as a URL a subprocess (qcluster, manage.py) can open."""
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    return f"postgres://{s['USER']}:{s['PASSWORD']}@{s['HOST']}:{s['PORT']}/{s['NAME']}"


@pytest.fixture
def qcluster(transactional_db, settings):
    """A real django-q2 cluster in a subprocess, on the test database and the test's store. Its
    watchdog ticks every second (a test may say otherwise): a queued job waits for a tick to be
    launched, so the default 5 s would add seconds to every job. Training workers heartbeat
    every 2 s: a pause or a budget stop reaches a job with its next heartbeat, and the default
    30 s is that much more training to wait through. A Tinker operation's held polls (the
    model's for its next operation, the client's for the result) look every 20 ms: the default
    100 ms twice over each of the hundreds of operations of a Tinker test's loops."""
    # The API server (live_server, in this process) hands these out and holds those polls.
    settings.VERI_WORKER_HEARTBEAT_MAX_SECONDS = 2
    settings.VERI_TINKER_POLL_INTERVAL_SECONDS = 0.02
    processes, folders = [], set()

    def start(**extra_env) -> subprocess.Popen:
        env = {
            **os.environ,
            "DATABASE_URL": database_url(),
            "VERI_STORE": settings.VERI_STORE,
            "VERI_Q_WORKERS": "2",
            "VERI_Q_POLL_SECONDS": "0.1",  # each task a job passes through starts sooner
            # Connections kept, as docs/deploy.md says to run it: the database broker's every
            # look at the queue would otherwise open one (ten a second at this poll).
            "VERI_DB_CONN_MAX_AGE": "60",
            "VERI_WATCH_PERIOD_SECONDS": "1",
            **extra_env,
        }
        if "VERI_LOCAL_INSTANCES_DIR" in extra_env:  # the test's own: nothing else runs there
            folders.add(extra_env["VERI_LOCAL_INSTANCES_DIR"])
        if settings.AWS_ENDPOINT_URL:
            env["AWS_ENDPOINT_URL"] = settings.AWS_ENDPOINT_URL
        process = subprocess.Popen(
            [sys.executable, "manage.py", "qcluster"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        processes.append(process)
        return process

    yield start
    # Local machines outlive the test's cluster (own sessions): a failed job's, and every
    # deployment's replica and Tinker model the test left running. Stop them all.
    for instance in Instance.objects.filter(provider="local", terminated_at__isnull=True):
        if instance.external_id:
            LocalProvider().terminate(instance.external_id)
    for folder in folders:
        with override_settings(VERI_LOCAL_INSTANCES_DIR=folder):
            for machine in LocalProvider().tagged_instances():
                LocalProvider().terminate(machine)
    # The cluster and its workers go at once (their own session): a graceful stop waits out
    # django-q's stop loop, seconds after every test, and no task's outcome matters any more
    # (the test's database is emptied next).
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
