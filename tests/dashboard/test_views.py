"""The dashboard's pages through Django's test client: sign-in, tenancy (another workspace's
objects are 404 on every page and JSON read), what a failed job's page tells its owner, deleting a
volume by its name, API keys shown once, and lists whose query count does not grow with rows."""

import html
import io
import json
import re

import pytest
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from billing.models import Refund
from billing.services import open_billing_account
from dashboard.templatetags.dashboard import dollars
from tests.billing.test_ledger import failed_after_an_hour
from tests.conftest import fill_volume
from tests.dashboard.conftest import PASSWORD, member_of, signed_in
from tests.training.conftest import job_body, upload_dataset
from training import errors
from training.models import Checkpoint, JobEvent, LogChunk, MetricPoint, Sample, TrainingJob
from veri import services
from veri.models import ApiKey, Membership, Workspace
from volumes.models import Volume
from volumes.services import create_volume
from volumes.stores import store_for

pytestmark = pytest.mark.django_db


def test_pages_ask_to_sign_in_and_the_login_form_lets_the_owner_in(owner):
    client = Client()
    response = client.get("/jobs/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
    response = client.post("/accounts/login/", {"username": "owner@acme.test", "password": "wrong"})
    assert "do not match" in response.content.decode()
    response = client.post(
        "/accounts/login/", {"username": "owner@acme.test", "password": PASSWORD}, follow=True
    )
    assert response.redirect_chain[-1][0] == "/jobs/"
    assert "acme" in response.content.decode()


def test_a_signed_in_user_in_no_workspace_is_told_how_to_get_one(db):
    user = get_user_model().objects.create_user("loner@x.test", password=PASSWORD)
    response = signed_in(user).get("/jobs/")
    assert response.status_code == 403
    assert "not in a workspace" in response.content.decode()


def test_another_workspaces_job_volume_checkpoint_and_key_answer_404(
    browser, submit, other_api_client
):
    mine = submit()
    other = Workspace.objects.get(name="other")
    open_billing_account(workspace=other, credit_micros=10_000_000)
    theirs_data = upload_dataset(other_api_client, [{"prompt": "p", "answer": "a"}])
    response = other_api_client.post("/v1/training_jobs", job_body(theirs_data), format="json")
    theirs_job = response.json()["id"]
    theirs_volume, _ = create_volume(workspace=other, name="secret-corpus")
    theirs_key, _ = services.create_api_key(workspace=other, name="theirs")
    theirs_checkpoint = Checkpoint.objects.create(
        workspace=other,
        job=TrainingJob.objects.get(public_id=theirs_job),
        step=5,
        files=[{"path": "adapter_config.json", "size": 2}],
    )
    mine_checkpoint = Checkpoint.objects.create(
        workspace=mine.workspace,
        job=mine,
        step=5,
        files=[{"path": "adapter_config.json", "size": 2}],
    )
    ((_, key),) = mine_checkpoint.file_keys()
    store_for(mine.output_prefix).put_bytes(key, b"{}")
    own = f"/jobs/{mine.public_id}/checkpoints/{mine_checkpoint.public_id}/adapter_config.json"
    assert browser.get(own, follow=True).getvalue() == b"{}"  # signed at the click
    for url in (
        f"/jobs/{theirs_job}/",
        f"/jobs/{theirs_job}/logs.json",
        f"/jobs/{theirs_job}/log.txt",
        f"/jobs/{theirs_job}/metrics.json",
        f"/jobs/{theirs_job}/samples.json",
        f"/jobs/{theirs_job}/status.json",
        f"/volumes/{theirs_volume.public_id}/",
        "/volumes/secret-corpus/",
        f"/jobs/{theirs_job}/checkpoints/{theirs_checkpoint.public_id}/adapter_config.json",
        # Their checkpoint under my job's URL, and a file my checkpoint does not list.
        f"/jobs/{mine.public_id}/checkpoints/{theirs_checkpoint.public_id}/adapter_config.json",
        f"/jobs/{mine.public_id}/checkpoints/{mine_checkpoint.public_id}/../other/x",
    ):
        assert browser.get(url).status_code == 404, url
    for url in (
        f"/jobs/{theirs_job}/cancel/",
        f"/jobs/{theirs_job}/resume/",
        f"/volumes/{theirs_volume.public_id}/delete/",
        f"/keys/{theirs_key.prefix}/revoke/",
    ):
        assert browser.post(url, {"confirm": "secret-corpus"}).status_code == 404, url
    theirs_volume.refresh_from_db()
    assert theirs_volume.status == Volume.Status.READY
    assert ApiKey.objects.get(pk=theirs_key.pk).revoked_at is None
    listed = browser.get("/jobs/").content.decode()
    assert mine.public_id in listed and theirs_job not in listed
    assert "secret-corpus" not in browser.get("/volumes/").content.decode()
    # Switching to a workspace one is not a member of changes nothing.
    assert browser.post("/workspace/", {"workspace": other.public_id}).status_code == 404
    assert mine.public_id in browser.get("/jobs/").content.decode()


def test_a_failed_jobs_page_shows_code_attribution_advice_and_refund(browser, submit):
    job = failed_after_an_hour(submit, "provider_reclaimed")
    refund = Refund.objects.get(job=job)
    page = browser.get(f"/jobs/{job.public_id}/").content.decode()
    assert "provider_reclaimed" in page
    assert re.search(r"data-attribution>\s*platform", page)
    advice = re.search(r"data-advice>(.*?)</dd>", page).group(1)
    assert (
        html.unescape(re.sub("</?code>", "`", advice)) == errors.CATALOG["provider_reclaimed"].hint
    )
    assert refund.amount_micros > 0
    assert f"data-refund>{dollars(refund.amount_micros)} USD, {refund.status}" in page
    status = browser.get(f"/jobs/{job.public_id}/status.json").json()
    assert status["status"] == "failed" and status["finished"] is True


def test_a_customers_failure_shows_no_refund(browser, submit):
    job = failed_after_an_hour(submit, "oom")
    page = browser.get(f"/jobs/{job.public_id}/").content.decode()
    assert re.search(r"data-attribution>\s*customer", page)
    assert "data-refund>none" in page


def test_the_json_reads_return_what_the_worker_sent_after_a_cursor(browser, submit):
    job = submit()
    LogChunk.objects.bulk_create(
        [LogChunk(job=job, seq=i, text=f"line {i}", at=timezone.now()) for i in range(5)]
    )
    MetricPoint.objects.bulk_create(
        [
            MetricPoint(
                job=job, step=s, at=timezone.now(), values={"loss": 1 / s, "reward": s / 10}
            )
            for s in (1, 2, 3)
        ]
    )
    Sample.objects.create(
        job=job, step=2, index=0, prompt="2+2?", completion="4", reward=1.0, rewards={"exact": 1.0}
    )
    logs = browser.get(f"/jobs/{job.public_id}/logs.json?after=2").json()
    assert [line["text"] for line in logs["lines"]] == ["line 3", "line 4"]
    assert logs["next_seq"] == 4 and logs["finished"] is False
    assert browser.get(f"/jobs/{job.public_id}/logs.json?after=junk").json()["lines"][0]["seq"] == 0
    metrics = browser.get(f"/jobs/{job.public_id}/metrics.json?after_step=1").json()
    assert [p["step"] for p in metrics["points"]] == [2, 3]
    JobEvent.objects.create(
        job=job, type="alarm_reward_flat", detail={"message": "The reward stayed at 0.5."}
    )
    samples = browser.get(f"/jobs/{job.public_id}/samples.json").json()
    assert samples["groups"][0]["rollouts"][0]["rewards"] == {"exact": 1.0}
    assert [(a["type"], a["message"]) for a in samples["alarms"]] == [
        ("alarm_reward_flat", "The reward stayed at 0.5.")
    ]
    text = browser.get(f"/jobs/{job.public_id}/log.txt")
    assert text.getvalue().decode().splitlines() == [f"line {i}" for i in range(5)]


def test_cancel_from_the_page_ends_the_job(browser, submit):
    job = submit()
    response = browser.post(f"/jobs/{job.public_id}/cancel/")
    assert response.status_code == 302
    job.refresh_from_db()
    assert job.status == "cancelled"


def test_deleting_a_volume_needs_its_exact_name(browser, billed):
    volume, _ = create_volume(workspace=billed, name="corpus")
    response = browser.post(f"/volumes/{volume.public_id}/delete/", {"confirm": "Corpus"})
    assert response.status_code == 400
    assert "nothing was deleted" in response.content.decode()
    volume.refresh_from_db()
    assert volume.status == Volume.Status.READY
    response = browser.post(f"/volumes/{volume.public_id}/delete/", {"confirm": "corpus"})
    assert response.status_code == 302
    assert not Volume.objects.filter(pk=volume.pk, status=Volume.Status.READY).exists()
    assert f"/volumes/{volume.public_id}/" not in browser.get("/volumes/").content.decode()


def test_a_new_api_key_is_shown_once_and_works_until_revoked(browser, billed):
    response = browser.post("/keys/", {"name": "laptop"}, follow=True)
    assert response.redirect_chain == [("/keys/", 302)]  # a reload cannot make a second key
    assert "no-store" in response["Cache-Control"]  # nor Back show it again from a cache
    page = response.content.decode()
    raw = re.search(r"data-new-key>(veri_sk_[0-9a-f]+_[0-9a-f]+)<", page).group(1)
    assert services.authenticate_api_key(raw_key=raw) is not None
    again = browser.get("/keys/").content.decode()
    assert raw not in again and "laptop" in again
    assert ApiKey.objects.filter(name="laptop").count() == 1
    key = ApiKey.objects.get(name="laptop")
    browser.post(f"/keys/{key.prefix}/revoke/")
    assert services.authenticate_api_key(raw_key=raw) is None


def test_no_emailed_password_reset_is_offered(owner):
    assert Client().get("/accounts/password_reset/").status_code == 404


def test_password_change_keeps_the_user_signed_in(owner):
    client = signed_in(owner)
    assert client.get("/accounts/password_change/").status_code == 200
    new = "another long password 2"
    response = client.post(
        "/accounts/password_change/",
        {"old_password": PASSWORD, "new_password1": new, "new_password2": new},
        follow=True,
    )
    assert "Password changed" in response.content.decode()
    assert client.get("/jobs/").status_code == 200
    assert Client().login(username="owner@acme.test", password=new)


def test_a_member_of_two_workspaces_switches_between_them(owner, billed):
    other, _ = services.create_workspace(name="beta")
    member_of(other, "owner@acme.test")
    create_volume(workspace=other, name="beta-only")
    client = signed_in(owner)
    assert "beta-only" not in client.get("/volumes/").content.decode()
    client.post("/workspace/", {"workspace": other.public_id})
    assert "beta-only" in client.get("/volumes/").content.decode()
    Membership.objects.filter(workspace=other).delete()  # removed from it: back to acme
    assert "beta-only" not in client.get("/volumes/").content.decode()


def test_the_new_job_form_submits_and_shows_a_services_error_by_its_field(browser, dataset, cloud):
    fields = {
        "method": "grpo",
        "base_model": "../etc",
        "dataset": dataset["id"],
        "gpu": "aws:L4-24GB",
        "max_steps": "5",
    }
    reward = b"def reward(completions, **kwargs):\n    return [1.0 for _ in completions]\n"
    response = browser.post(
        "/jobs/new/", {**fields, "reward_file": SimpleUploadedFile("r.py", reward)}
    )
    assert response.status_code == 200
    form = response.context["form"]
    assert form.errors.get("base_model"), form.errors
    response = browser.post(
        "/jobs/new/",
        {**fields, "base_model": "tiny/model", "reward_file": SimpleUploadedFile("r.py", reward)},
    )
    assert response.status_code == 302, response.context["form"].errors
    job_id = response["Location"].split("/")[2]
    assert job_id.startswith("job_")
    assert job_id in browser.get("/jobs/").content.decode()


def test_lists_take_the_same_number_of_queries_for_3_rows_as_for_30(browser, submit, billed):
    def count(url: str) -> int:
        with CaptureQueriesContext(connection) as queries:
            assert browser.get(url).status_code == 200
        return len(queries)

    def grow(n: int) -> None:
        for _ in range(n):
            job = submit()
            Checkpoint.objects.create(
                workspace=billed, job=job, step=1, size_bytes=1, files=[{"path": "a", "size": 1}]
            )
        for i in range(n):
            create_volume(workspace=billed, name=f"v{Volume.objects.count()}-{i}")

    grow(3)
    few = {url: count(url) for url in ("/jobs/", "/volumes/", "/datasets/", "/billing/", "/keys/")}
    grow(27)
    many = {url: count(url) for url in few}
    assert many == few


def create_workspace(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("create_workspace", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_create_workspace_with_an_owner_makes_an_account_that_can_sign_in(db, monkeypatch):
    monkeypatch.setenv("OWNER_PASSWORD", PASSWORD)
    out, err = create_workspace(
        "acme", "--owner", "Ada@Example.com", "--password-env", "OWNER_PASSWORD"
    )
    assert out.strip().startswith("veri_sk_")
    assert "Owner: ada@example.com (a new account)" in err
    client = Client()
    assert client.login(username="Ada@Example.com", password=PASSWORD)
    assert "acme" in client.get("/jobs/").content.decode()
    # The same person owns a second workspace; their password stays.
    _, err = create_workspace("beta", "--owner", "ada@example.com")
    assert "existing account, password unchanged" in err
    assert client.post("/workspace/", {"workspace": Workspace.objects.get(name="beta").public_id})
    assert Membership.objects.filter(user__username="ada@example.com").count() == 2
    with pytest.raises(CommandError, match="empty or unset"):
        create_workspace("gamma", "--owner", "new@example.com", "--password-env", "UNSET_VAR")
    with pytest.raises(CommandError, match="--password-env"):  # no terminal to ask on
        create_workspace("gamma", "--owner", "new@example.com")
    monkeypatch.setenv("SHORT", "abc")
    with pytest.raises(CommandError, match="too short"):
        create_workspace("gamma", "--owner", "new@example.com", "--password-env", "SHORT")
    assert not Workspace.objects.filter(name="gamma").exists()  # nothing half-made


def test_a_datasets_page_shows_its_first_rows_and_deletes_it_unless_used(browser, dataset, submit):
    page = browser.get("/datasets/").content.decode()
    assert f"/datasets/{dataset['id']}/" in page and f"{dataset['size_bytes']} B" in page
    detail = browser.get(f"/datasets/{dataset['id']}/").content.decode()
    assert html.escape('"prompt": "What is 0 + 0?"') in detail
    assert html.escape('"prompt": "What is 5 + 5?"') not in detail  # the first five rows only
    job = submit()
    refused = browser.post(f"/datasets/{dataset['id']}/delete/", follow=True).content.decode()
    assert f"used by job {job.public_id}" in html.unescape(refused)
    assert TrainingJob.objects.filter(dataset__public_id=dataset["id"]).exists()
    job.delete()
    deleted = browser.post(f"/datasets/{dataset['id']}/delete/", follow=True).content.decode()
    assert "Deleted dataset" in deleted and f"/datasets/{dataset['id']}/" not in deleted


def test_the_volume_page_writes_sizes_in_binary_units(browser, billed, settings, local_store_url):
    settings.VERI_STORE = local_store_url
    fill_volume(billed, "corpus", {"small.txt": b"x" * 234, "big.bin": b"x" * 552_038})
    page = browser.get("/volumes/corpus/").content.decode()
    assert "234 B" in page and "539.1 KiB" in page and "539.3 KiB" in page
    assert "234 bytes" not in page and " KB" not in page
    usage = json.loads(html.unescape(re.search(r'data-series="([^"]*)"', page).group(1)))
    assert [point["bytes"] for point in usage] == [552_272]  # drawn from the first upload
