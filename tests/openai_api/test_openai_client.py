"""The OpenAI-compatible face driven by the official `openai` client against a live server:
files, job creation and its refusals, listing with the client's auto-pagination, workspace
scoping, errors in OpenAI's shape, graders. (Jobs that train: tests/e2e/test_openai_fine_tuning.)"""

from datetime import timedelta

import httpx
import openai
import pytest

from billing.services import open_billing_account
from tests.conftest import fill_volume
from tests.openai_api.conftest import CHAT_ROWS, PREFERENCE_ROWS, jsonl, openai_client
from training.models import MetricPoint, TrainingJob

pytestmark = pytest.mark.django_db(transaction=True)
TINY = "volume://models/tiny"


@pytest.fixture
def funded(workspace):
    open_billing_account(workspace=workspace, credit_micros=100_000_000)


@pytest.fixture
def models_volume(workspace, tiny_model):
    fill_volume(
        workspace,
        "models",
        {f"tiny/{p.name}": p.read_bytes() for p in tiny_model.iterdir() if p.is_file()},
    )


def test_files_upload_list_read_and_delete(client):
    chat = client.files.create(file=("chat.jsonl", jsonl(CHAT_ROWS)), purpose="fine-tune")
    assert chat.id.startswith("file-") and chat.object == "file" and chat.status == "processed"
    assert chat.bytes == len(jsonl(CHAT_ROWS)) and chat.filename == "chat.jsonl"
    notes = client.files.create(file=("notes.pdf", b"%PDF-1.4 any bytes"), purpose="user_data")
    prefs = client.files.create(file=("prefs.jsonl", jsonl(PREFERENCE_ROWS)), purpose="fine-tune")

    # The client's auto-pagination walks every page of one file each.
    listed = [f.id for f in client.files.list(limit=1)]
    assert listed == [prefs.id, notes.id, chat.id]
    assert [f.id for f in client.files.list(limit=1, order="asc")] == listed[::-1]
    assert [f.id for f in client.files.list(purpose="fine-tune")] == [prefs.id, chat.id]

    assert client.files.retrieve(chat.id).filename == "chat.jsonl"
    assert client.files.content(chat.id).read() == jsonl(CHAT_ROWS)
    assert client.files.content(notes.id).read() == b"%PDF-1.4 any bytes"
    deleted = client.files.delete(notes.id)
    assert deleted.deleted is True and deleted.id == notes.id
    with pytest.raises(openai.NotFoundError) as caught:
        client.files.retrieve(notes.id)
    assert caught.value.body["type"] == "invalid_request_error"


def test_a_malformed_file_is_refused_naming_its_line(client):
    rows = jsonl(CHAT_ROWS[:2]) + b'{"messages": [\n'
    with pytest.raises(openai.BadRequestError) as caught:
        client.files.create(file=("bad.jsonl", rows), purpose="fine-tune")
    assert "line 3" in caught.value.message and caught.value.param == "file"
    with pytest.raises(openai.BadRequestError) as caught:
        client.files.create(file=("odd.jsonl", jsonl([{"question": "?"}])), purpose="fine-tune")
    message = caught.value.message
    assert "supervised: line 1" in message and "dpo: line 1" in message
    with pytest.raises(openai.BadRequestError) as caught:
        client.files.create(file=("x.jsonl", jsonl(CHAT_ROWS)), purpose="batch")
    assert caught.value.param == "purpose"


def test_job_refusals_name_the_parameter(client, funded, models_volume):
    chat = client.files.create(file=("chat.jsonl", jsonl(CHAT_ROWS)), purpose="fine-tune")
    prefs = client.files.create(file=("prefs.jsonl", jsonl(PREFERENCE_ROWS)), purpose="fine-tune")
    create = client.fine_tuning.jobs.create
    with pytest.raises(openai.BadRequestError) as caught:
        create(model=TINY, training_file=chat.id, method={"type": "distillation"})
    assert caught.value.param == "method.type" and caught.value.code == "invalid_method"
    with pytest.raises(openai.BadRequestError) as caught:
        create(
            model=TINY,
            training_file=chat.id,
            method={"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 0}}},
        )
    assert caught.value.param == "method.supervised.hyperparameters.n_epochs"
    with pytest.raises(openai.BadRequestError) as caught:
        create(model=TINY, training_file=prefs.id)  # preference rows cannot train supervised
    assert caught.value.param == "training_file" and "line 1" in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        create(model=TINY, training_file="file-nothere")
    assert caught.value.param == "training_file"
    with pytest.raises(openai.BadRequestError) as caught:
        create(model="../../etc", training_file=chat.id)
    assert caught.value.param == "model"


def test_jobs_list_by_page_and_metadata_and_stay_in_their_workspace(
    client, funded, models_volume, live_server, other_api_client
):
    chat = client.files.create(file=("chat.jsonl", jsonl(CHAT_ROWS)), purpose="fine-tune")
    made = [
        client.fine_tuning.jobs.create(
            model=TINY,
            training_file=chat.id,
            suffix=f"run{n}",
            seed=7,
            metadata={"team": "red" if n % 2 else "blue"},
            method={"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 2}}},
        )
        for n in range(3)
    ]
    first = made[0]
    assert first.id.startswith("ftjob-") and first.status == "queued" and first.seed == 7
    assert first.hyperparameters.n_epochs == 2 and first.method.type == "supervised"
    assert first.model_extra["veri_job_id"].startswith("job_")
    assert [j.id for j in client.fine_tuning.jobs.list(limit=2)] == [j.id for j in made[::-1]]
    red = client.fine_tuning.jobs.list(metadata={"team": "red"})
    assert [j.id for j in red] == [made[1].id]

    other = openai_client(live_server, other_api_client.raw_key)
    with pytest.raises(openai.NotFoundError):
        other.fine_tuning.jobs.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        other.files.retrieve(chat.id)
    assert list(other.fine_tuning.jobs.list()) == []

    cancelled = client.fine_tuning.jobs.cancel(first.id)
    assert cancelled.status == "cancelled" and cancelled.finished_at
    events = [e.message for e in client.fine_tuning.jobs.list_events(first.id)]
    assert events[0] == "The job was cancelled" and events[-1] == "Fine-tuning job queued"


def test_a_wrong_key_is_an_authentication_error(live_server, db):
    client = openai.OpenAI(api_key="veri_sk_nope_nope", base_url=f"{live_server.url}/v1")
    with pytest.raises(openai.AuthenticationError) as caught:
        client.files.list()
    assert caught.value.code == "invalid_api_key"


def test_models_list_the_trainable_bases(client, settings):
    settings.VERI_BASE_MODELS = ["Qwen/Qwen2.5-0.5B-Instruct"]
    assert [m.id for m in client.models.list()] == ["Qwen/Qwen2.5-0.5B-Instruct"]
    assert client.models.retrieve("Qwen/Qwen2.5-0.5B-Instruct").owned_by == "veri"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("ft:gpt-4o:acme::abcdefghijklmnopqrstuvwx")


def test_graders_validate_and_run_score_a_sample(client, workspace):
    check = {
        "type": "string_check",
        "name": "exact",
        "input": "{{sample.output_text}}",
        "reference": "{{item.answer}}",
        "operation": "eq",
    }
    assert client.fine_tuning.alpha.graders.validate(grader=check).grader.name == "exact"
    hit = client.fine_tuning.alpha.graders.run(grader=check, model_sample="4", item={"answer": "4"})
    miss = client.fine_tuning.alpha.graders.run(
        grader=check, model_sample="5", item={"answer": "4"}
    )
    assert (hit.reward, miss.reward) == (1.0, 0.0)
    with pytest.raises(openai.BadRequestError) as caught:
        client.fine_tuning.alpha.graders.validate(grader=check | {"operation": "regex"})
    assert caught.value.param.endswith("operation")
    python = {
        "type": "python",
        "name": "len",
        "source": "def grade(sample, item):\n    return len(sample['output_text']) / 10\n",
    }
    assert (
        client.fine_tuning.alpha.graders.run(grader=python, model_sample="abcde", item={}).reward
        == 0.5
    )


ODD_VALUES = [None, 0, -1, 2**70, 1.5, "", "x" * 5000, [], [1], {}, {"a": {"b": []}}, True]


def test_odd_bodies_are_refused_in_openai_shape_never_a_500(
    live_server, api_client, funded, models_volume
):
    """Every field of a job create, and of the graders' calls, with values of every wrong type."""
    client = openai_client(live_server, api_client.raw_key)
    chat = client.files.create(file=("chat.jsonl", jsonl(CHAT_ROWS)), purpose="fine-tune")
    good = {"model": TINY, "training_file": chat.id}
    fields = [
        "model",
        "training_file",
        "validation_file",
        "method",
        "hyperparameters",
        "suffix",
        "seed",
        "metadata",
        "integrations",
        "veri",
    ]
    http = httpx.Client(
        base_url=f"{live_server.url}/v1",
        headers={"Authorization": f"Bearer {api_client.raw_key}"},
    )
    bodies = [
        ("/fine_tuning/jobs", good | {name: value}) for name in fields for value in ODD_VALUES
    ]
    bodies += [
        ("/fine_tuning/jobs", good | {"method": {"type": "supervised", "supervised": value}})
        for value in ODD_VALUES
    ]
    bodies += [
        (
            "/fine_tuning/jobs",
            good | {"method": {"type": "dpo", "dpo": {"hyperparameters": {k: v}}}},
        )
        for k in ("n_epochs", "beta", "batch_size", "learning_rate_multiplier", "nope")
        for v in ODD_VALUES
    ]
    bodies += [
        ("/fine_tuning/alpha/graders/run", {"grader": v, "model_sample": "x"}) for v in ODD_VALUES
    ]
    bodies += [
        ("/fine_tuning/alpha/graders/run", {"grader": {"type": "string_check"}, "item": v})
        for v in ODD_VALUES
    ]
    for path, body in bodies:
        response = http.post(path, json=body)
        assert response.status_code < 500, (path, body, response.text[:500])
        if response.status_code >= 400:
            assert set(response.json()["error"]) == {"message", "type", "param", "code"}, body
    for raw in (b"{", b"[]", b"null", "\ud800".encode("utf-8", "surrogatepass")):
        response = http.post(
            "/fine_tuning/jobs", content=raw, headers={"Content-Type": "application/json"}
        )
        assert response.status_code == 400, (raw, response.text[:300])
        assert response.json()["error"]["type"] == "invalid_request_error"
    for path in ("/fine_tuning/jobs?limit=0", "/fine_tuning/jobs?after=nope", "/files?order=up"):
        response = http.get(path)
        assert response.status_code == 400 and response.json()["error"]["param"], path


def test_legacy_hyperparameters_auto_and_ignored_options(client, api_client, funded, models_volume):
    chat = client.files.create(file=("chat.jsonl", jsonl(CHAT_ROWS)), purpose="fine-tune")
    legacy = client.fine_tuning.jobs.create(
        model=TINY,
        training_file=chat.id,
        hyperparameters={"n_epochs": 3, "batch_size": "auto", "learning_rate_multiplier": 2},
    )
    assert legacy.method.type == "supervised"
    assert legacy.hyperparameters.n_epochs == 3 and legacy.hyperparameters.batch_size == 8
    # The learning rate is the method's default times the multiplier.
    veri = api_client.get(f"/v1/training_jobs/{legacy.model_extra['veri_job_id']}").json()
    assert veri["hyperparameters"]["learning_rate"] == pytest.approx(4e-4)
    prompts = client.files.create(
        file=("rl.jsonl", jsonl([{"messages": [{"role": "user", "content": "Hi"}], "a": "x"}])),
        purpose="fine-tune",
    )
    rl = client.fine_tuning.jobs.create(
        model=TINY,
        training_file=prompts.id,
        method={
            "type": "reinforcement",
            "reinforcement": {
                "grader": {
                    "type": "string_check",
                    "name": "x",
                    "input": "{{sample.output_text}}",
                    "reference": "{{item.a}}",
                    "operation": "eq",
                },
                "hyperparameters": {"reasoning_effort": "high", "compute_multiplier": 0.5},
            },
        },
    )
    assert rl.hyperparameters.model_extra["compute_multiplier"] == 0.5
    warnings = [e for e in client.fine_tuning.jobs.list_events(rl.id) if e.level == "warn"]
    assert [e.message for e in warnings] == [
        "reasoning_effort is ignored: the open models Veri trains have no reasoning effort setting."
    ]


def test_events_page_newest_first_through_a_long_run(client, funded, models_volume):
    chat = client.files.create(file=("chat.jsonl", jsonl(CHAT_ROWS)), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(
        model=TINY,
        training_file=chat.id,
        method={"type": "supervised", "supervised": {"hyperparameters": {"batch_size": 1}}},
    )
    run = TrainingJob.objects.get(public_id=job.model_extra["veri_job_id"])
    start = run.events.get().at  # queued: the points come after it and before the cancel
    # A long run's metrics, two to an instant (events that share a time keep their order), all
    # within 20 µs of the queued event: the cancel, a request later, comes after every one.
    MetricPoint.objects.bulk_create(
        MetricPoint(job=run, step=step, at=start + timedelta(microseconds=step // 2), values={})
        for step in range(1, 41)
    )
    client.fine_tuning.jobs.cancel(job.id)

    whole = client.fine_tuning.jobs.list_events(job.id, limit=1000)
    assert not whole.has_more
    paged = list(client.fine_tuning.jobs.list_events(job.id, limit=3))  # 14 pages
    assert [e.id for e in paged] == [e.id for e in whole.data]
    assert len({e.id for e in paged}) == len(paged) == 40 + 2  # and queued, cancelled
    assert [e.data["step"] for e in paged if e.type == "metrics"] == list(range(40, 0, -1))
    assert [e.created_at for e in paged] == sorted((e.created_at for e in paged), reverse=True)
    assert paged[0].message == "The job was cancelled"
    assert paged[-1].message == "Fine-tuning job queued"

    with pytest.raises(openai.BadRequestError) as caught:
        client.fine_tuning.jobs.list_events(job.id, after="ftevent-m999999")
    assert caught.value.param == "after"
