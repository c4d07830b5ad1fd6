"""Workspace secrets: set, listed by name, deleted; a value goes in and never comes out of the
API, is sealed in its database column, and opens only for its own workspace and name."""

from django.db import connection

from tests.conftest import assert_error
from veri import selectors
from veri.models import WorkspaceSecret

VALUE = "wandb-key-0123456789abcdef-canary"


def test_a_secret_is_set_listed_by_name_and_its_value_never_comes_back(api_client, workspace):
    created = api_client.put("/v1/secrets/WANDB_API_KEY", {"value": VALUE}, format="json")
    assert created.status_code == 201, created.json()
    assert set(created.json()) == {"name", "created_at", "updated_at"}
    replaced = api_client.put("/v1/secrets/WANDB_API_KEY", {"value": VALUE + "2"}, format="json")
    assert replaced.status_code == 200
    listed = api_client.get("/v1/secrets")
    assert [s["name"] for s in listed.json()["data"]] == ["WANDB_API_KEY"]
    for response in (created, replaced, listed):
        assert VALUE not in response.content.decode()
    assert selectors.secret_value(workspace=workspace, name="WANDB_API_KEY") == VALUE + "2"

    assert api_client.delete("/v1/secrets/WANDB_API_KEY").status_code == 204
    assert api_client.get("/v1/secrets").json()["data"] == []
    assert_error(api_client.delete("/v1/secrets/WANDB_API_KEY"), 404, "not_found")


def test_the_value_is_sealed_in_its_column_and_bound_to_its_workspace(
    api_client, other_api_client, workspace
):
    api_client.put("/v1/secrets/WANDB_API_KEY", {"value": VALUE}, format="json")
    with connection.cursor() as cursor:
        cursor.execute("SELECT sealed_value FROM veri_workspacesecret")
        [(stored,)] = cursor.fetchall()
    assert VALUE.encode() not in bytes(stored)
    # The same sealed bytes under another workspace do not open.
    other_api_client.put("/v1/secrets/WANDB_API_KEY", {"value": "theirs"}, format="json")
    theirs = WorkspaceSecret.objects.exclude(workspace=workspace).get()
    WorkspaceSecret.objects.filter(pk=theirs.pk).update(sealed_value=bytes(stored))
    try:
        selectors.secret_value(workspace=theirs.workspace, name="WANDB_API_KEY")
    except ValueError:
        pass
    else:
        raise AssertionError("a sealed value opened for another workspace")


def test_another_workspaces_secrets_are_neither_listed_nor_deletable(api_client, other_api_client):
    api_client.put("/v1/secrets/WANDB_API_KEY", {"value": VALUE}, format="json")
    assert other_api_client.get("/v1/secrets").json()["data"] == []
    assert_error(other_api_client.delete("/v1/secrets/WANDB_API_KEY"), 404, "not_found")
    assert [s["name"] for s in api_client.get("/v1/secrets").json()["data"]] == ["WANDB_API_KEY"]


def test_names_and_values_are_checked(api_client):
    for name in ("wandb_key", "1KEY", "A" * 65, "KEY-1"):
        response = api_client.put(f"/v1/secrets/{name}", {"value": VALUE}, format="json")
        assert_error(response, 400, "invalid_secret_name", "name")
    assert_error(
        api_client.put("/v1/secrets/KEY", {"value": ""}, format="json"), 400, "invalid_request"
    )
    assert_error(api_client.put("/v1/secrets/KEY", {}, format="json"), 400, "invalid_request")
    assert api_client.get("/v1/secrets").json()["data"] == []


def test_secrets_need_an_api_key(client, db):
    assert client.get("/v1/secrets").status_code == 401
