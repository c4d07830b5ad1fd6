"""The evaluation pages through Django's test client: the list and one evaluation (queued here:
its samples waiting for answers), and another workspace's evaluation a 404. The pages of a
finished evaluation are read in tests/e2e/test_evaluations.py."""

import html
import json

import pytest

from serving.models import Evaluation
from tests.dashboard.conftest import member_of, signed_in
from tests.serving.test_evaluations import BASE, CHAT, EXACT, create, served  # noqa: F401
from tests.training.conftest import upload_dataset
from veri import services

pytestmark = pytest.mark.django_db


def test_the_owner_sees_a_queued_evaluation_and_no_one_else_does(browser, api_client, served):  # noqa: F811
    evaluation = create(api_client, served).json()
    listing = browser.get("/evaluations/").content.decode()
    assert evaluation["id"] in listing and "queued" in listing

    page = browser.get(f"/evaluations/{evaluation['id']}/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "0 of 1 samples scored" in text and "user: Name a fruit." in text
    assert 'data-output="model">…<' in text and "Win rate" not in text  # no summary yet

    other, _ = services.create_workspace(name="other")
    stranger = signed_in(member_of(other, "stranger@other.test"))
    assert stranger.get(f"/evaluations/{evaluation['id']}/").status_code == 404
    assert evaluation["id"] not in stranger.get("/evaluations/").content.decode()


def test_the_form_starts_an_evaluation_and_names_a_bad_field(browser, api_client, served):  # noqa: F811
    dataset = upload_dataset(api_client, [CHAT])
    form = {
        "model": served["model"],
        "baseline": served["baseline"],
        "file": dataset["id"],
        "grader": json.dumps({**EXACT, "operation": "sounds_like"}),
        "max_tokens": "16",
    }
    refused = browser.post("/evaluations/", form)
    assert refused.status_code == 200 and not Evaluation.objects.exists()
    assert "grader.operation must be one of" in html.unescape(refused.content.decode())

    neither = browser.post("/evaluations/", {**form, "grader": ""})
    assert neither.status_code == 200 and not Evaluation.objects.exists()
    assert "Give a grader (an OpenAI-style grader object) or a reward_source (one of them)." in (
        html.unescape(neither.content.decode())
    )

    started = browser.post("/evaluations/", {**form, "grader": json.dumps(EXACT)})
    evaluation = Evaluation.objects.get()
    assert started["Location"] == f"/evaluations/{evaluation.public_id}/"
    assert (evaluation.model, evaluation.max_tokens, evaluation.grader) == (BASE, 16, EXACT)
    assert evaluation.dataset.public_id == dataset["id"]
