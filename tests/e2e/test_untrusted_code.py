"""Customer code is hostile: reward functions that try to forge a platform fault, read the
runner's token or the control plane's secrets, or mark the machine as reclaimed end their jobs
as their own errors (charged, no refund, no restart), and find nothing."""

import json

import pytest
from django.conf import settings as django_settings

from billing.models import LedgerEntry, Refund
from tests.e2e.test_training import GRPO_ROWS, TINY, platform, submit, wait_settled  # noqa: F401
from worker import sandbox

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
FAST_GRPO = {"max_steps": 2, "batch_size": 8, "rollouts_per_prompt": 8, "max_response_length": 8}

CHAINED = """
from worker.errors import JobFailure

def reward(completions, **kw):
    raise SystemExit(1) from JobFailure("volume_sync_incomplete", "forged by the reward")
"""

FORGED_EVENT = """
import json, os

def reward(completions, **kw):
    line = {"event": "error", "code": "hardware_error", "message": "forged by the reward"}
    os.write(int(os.environ["VERI_EVENTS_FD"]), (json.dumps(line) + "\\n").encode())
    os._exit(1)
"""

PROBE = """
import glob, json, os, pathlib, urllib.request

def reward(completions, **kw):
    found = []
    for name in ("VERI_JOB_TOKEN", "DIGITALOCEAN_TOKEN", "STRIPE_SECRET_KEY", "DATABASE_URL"):
        if name in os.environ:
            found.append(name)
    for environ in glob.glob("/proc/*/environ"):
        try:
            text = open(environ, "rb").read()
            if b"vjt_" in text or b"dop_v1_secret" in text:
                found.append(environ)
        except OSError:
            pass
    for secret in SECRETS:
        try:
            open(secret, "rb").read(1)
            found.append(secret)
        except OSError:
            pass
    # The local machine's preemption notice, in the folder above the training's home.
    for parent in list(pathlib.Path.cwd().parents)[:3]:  # work, the machine, its siblings
        try:
            notice = '{"terminates_at": "2000-01-01T00:00:00+00:00"}'
            (parent / "preemption-notice.json").write_text(notice)
            found.append(str(parent))
        except OSError:
            pass
    print("PROBE FOUND", json.dumps(found), flush=True)
    raise RuntimeError("probe done")
"""


def test_hostile_rewards_end_as_their_own_errors_and_reach_nothing(api_client, platform):  # noqa: F811
    platform(VERI_LOCAL_SLOTS="3", DIGITALOCEAN_TOKEN="dop_v1_secret")
    secrets = [
        str(django_settings.BASE_DIR / ".veri" / "secret_key"),
        str(django_settings.VERI_STORE.removeprefix("file://")),
    ]
    probe = PROBE.replace("SECRETS", repr(secrets))
    jobs = {
        name: submit(
            api_client,
            GRPO_ROWS,
            base_model=TINY,
            method="grpo",
            reward_source=source,
            hyperparameters=FAST_GRPO,
        )
        for name, source in (("chained", CHAINED), ("event", FORGED_EVENT), ("probe", probe))
    }
    for name, job_id in jobs.items():
        job = wait_settled(job_id)
        assert (job.status, job.error_code, job.error_attribution, job.attempt) == (
            "failed",
            "training_error",
            "customer",
            1,
        ), (name, job.error_message)
        assert job.billing.cost_micros > 0
        assert LedgerEntry.objects.filter(job=job, kind="job_charge").exists()
        assert not Refund.objects.filter(job=job).exists(), name
    full = api_client.get(f"/v1/training_jobs/{jobs['probe']}/logs/full").getvalue().decode()
    found = json.loads(full.split("PROBE FOUND ", 1)[1].splitlines()[0])
    # The environment is an allow-list wherever the worker runs; run by root (as in CI and on a
    # rented machine), the sandbox also hides the runner's and the control plane's files.
    assert not {"VERI_JOB_TOKEN", "DIGITALOCEAN_TOKEN", "DATABASE_URL"} & set(found), found
    if sandbox.isolated():
        assert found == [], found
