"""The dashboard's secrets page: set, list and delete; a value is never rendered back, not even
in a form that failed; another workspace's secret cannot be deleted."""

import pytest

from veri import selectors, services
from veri.models import Workspace

pytestmark = pytest.mark.django_db

VALUE = "wandb-dashboard-canary-0123456789"


def test_a_secret_is_set_listed_without_its_value_and_deleted(browser, workspace):
    response = browser.post("/secrets/", {"name": "WANDB_API_KEY", "value": VALUE}, follow=True)
    assert response.redirect_chain == [("/secrets/", 302)]
    page = response.content.decode()
    assert "<code>WANDB_API_KEY</code></td>" in page and VALUE not in page
    assert selectors.secret_value(workspace=workspace, name="WANDB_API_KEY") == VALUE

    refused = browser.post("/secrets/", {"name": "wandb key", "value": VALUE}).content.decode()
    assert "upper-case letters" in refused and VALUE not in refused

    browser.post("/secrets/WANDB_API_KEY/delete/")
    assert not selectors.list_secrets(workspace=workspace).exists()
    assert "No secrets yet." in browser.get("/secrets/").content.decode()


def test_another_workspaces_secret_is_not_listed_nor_deletable(browser, other_api_client):
    other = Workspace.objects.get(name="other")
    services.set_secret(workspace=other, name="WANDB_API_KEY", value=VALUE)
    assert "<code>WANDB_API_KEY</code></td>" not in browser.get("/secrets/").content.decode()
    assert browser.post("/secrets/WANDB_API_KEY/delete/").status_code == 404
    assert selectors.list_secrets(workspace=other).count() == 1
