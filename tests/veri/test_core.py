"""Tenancy core: the error format, idempotency, the schema, and the operator commands."""

import json
import re

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tests.conftest import REPO, assert_error, run_python
from veri import services
from veri.models import ApiKey, Workspace

pytestmark = pytest.mark.django_db


def test_unknown_routes_answer_json_404_for_every_method(api_client):
    for method in ("post", "put", "patch", "delete"):
        answer = getattr(Client(enforce_csrf_checks=True), method)("/v1/nope")
        assert (answer.status_code, answer["Content-Type"]) == (404, "application/json")
    answer = Client(enforce_csrf_checks=True).post("/v1/billing/stripe/webhook/")  # a stray "/"
    assert answer.json()["error"]["code"] == "not_found"


def test_unknown_routes_answer_json_404(api_client):
    for url in ["/v1/nope", "/v1/volumes/x/y/z/w", "/v1/"]:
        assert_error(api_client.get(url), 404, "not_found")


def test_wrong_method_and_bad_json_use_the_error_format(api_client):
    assert_error(api_client.put("/v1/volumes", {}, format="json"), 405, "method_not_allowed")
    response = api_client.post("/v1/volumes", "{not json", content_type="application/json")
    assert_error(response, 400, "parse_error")
    response = api_client.post("/v1/volumes", {"region": "us-east-1"}, format="json")
    assert_error(response, 400, "invalid_request", field="name")


def test_idempotency_key_replays_the_first_answer(api_client):
    headers = {"Idempotency-Key": "create-data-1"}
    first = api_client.post("/v1/volumes", {"name": "data"}, format="json", headers=headers)
    # The volume is deleted meanwhile: a retry still gets the first answer, not a new volume.
    api_client.delete(f"/v1/volumes/{first.json()['id']}?force=true")
    retry = api_client.post("/v1/volumes", {"name": "data"}, format="json", headers=headers)
    assert (first.status_code, retry.status_code) == (201, 201)
    assert retry.json() == first.json()
    assert api_client.get("/v1/volumes").json()["data"] == []

    reused = api_client.post("/v1/volumes", {"name": "other"}, format="json", headers=headers)
    assert_error(reused, 409, "idempotency_key_reused")


def test_idempotency_keys_are_per_workspace(api_client, other_api_client):
    headers = {"Idempotency-Key": "same-key"}
    mine = api_client.post("/v1/volumes", {"name": "data"}, format="json", headers=headers)
    theirs = other_api_client.post("/v1/volumes", {"name": "data"}, format="json", headers=headers)
    assert mine.json()["id"] != theirs.json()["id"]


def test_schema_describes_every_endpoint_without_warnings(tmp_path):
    from django.core.management import call_command
    from django.urls import get_resolver

    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(tmp_path / "s.yaml"))
    response = Client().get("/v1/schema", headers={"Accept": "application/json"})
    assert response.status_code == 200
    text = response.content.decode()
    v1 = next(p for p in get_resolver().url_patterns if str(p.pattern) == "v1/")
    leaves = [
        ("/v1/" + str(leaf.pattern).replace("<str:", "{").replace(">", "}"), leaf)
        for pattern in v1.url_patterns
        for leaf in getattr(pattern, "url_patterns", [pattern])
    ]
    # Not API operations: the schema itself, the local store's signed URLs, the 404 catch-all;
    # nor the OpenAI-compatible routes, whose contract is OpenAI's reference (and their client).
    documented = [
        route
        for route, leaf in leaves
        if route not in {"/v1/schema", "/v1/store/{token}", "/v1/^.*$"}
        and not leaf.callback.__module__.startswith("openai_api.")
    ]
    assert len(documented) > 30
    for route in documented:
        assert f"{route}:" in text or f'"{route}"' in text, route


def test_the_api_page_lists_exactly_the_schemas_operations():
    """docs/api.md is the contract people read: it stays in step with /v1/schema."""
    schema = json.loads(Client().get("/v1/schema", {"format": "json"}).content)
    served = {
        f"{method.upper()} {path}" for path, item in schema["paths"].items() for method in item
    }
    page = (REPO / "docs" / "api.md").read_text()
    documented = {
        f"{method} {path}"
        for method, path in re.findall(r"`(GET|POST|PUT|PATCH|DELETE) (/v1/[^\s`?]+)", page)
    }
    assert documented == served, {
        "in the schema, not on the page": sorted(served - documented),
        "on the page, not in the schema": sorted(documented - served),
    }


def _body_fields(body: str) -> set[str]:
    """The top-level names of a body written like `{files:[{path, size}], final?}`."""
    names, depth, current = [], 0, ""
    for char in body + ",":
        depth += char in "[{"
        depth -= char in "]}"
        if depth == 0 and char == ",":
            names.append(current.split(":")[0].strip().rstrip("?"))
            current = ""
        elif depth == 0:
            current += char
    return {name for name in names if name}


def test_the_api_page_names_the_fields_each_body_takes():
    """Each JSON body written on docs/api.md (`{name, region?}`) names only fields the schema's
    request takes, and every field the request requires."""
    schema = json.loads(Client().get("/v1/schema", {"format": "json"}).content)
    components = schema["components"]["schemas"]
    problems = []
    for line in (REPO / "docs" / "api.md").read_text().splitlines():
        first_cell = re.split(r"(?<!\\)\|", line)[1:2]
        found = re.match(
            r"\s*`(GET|POST|PUT|PATCH|DELETE) (/v1/\S+?)`(.*)", first_cell[0] if first_cell else ""
        )
        bodies = re.findall(r"`\{(.*)\}`", found.group(3)) if found else []
        if not bodies:
            continue
        method, path = found.group(1).lower(), found.group(2)
        request = schema["paths"][path][method]["requestBody"]["content"]["application/json"]
        reference = request["schema"]["$ref"].rsplit("/", 1)[-1]
        takes = components[reference]
        written = set().union(*(_body_fields(body) for body in bodies))
        if unknown := written - set(takes["properties"]):
            problems.append(f"{method} {path}: not in the schema: {sorted(unknown)}")
        if missing := set(takes.get("required", [])) - written:
            problems.append(f"{method} {path}: required, not written: {sorted(missing)}")
    assert not problems, problems


def test_home_page_leads_to_sign_in_and_admin_login_renders():
    client = Client()
    response = client.get("/", follow=True)
    assert response.redirect_chain[-1][0] == "/accounts/login/?next=/"
    assert b"Sign in to Veri" in response.content and b"/v1/schema" in response.content
    assert client.get("/admin/login/").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_create_workspace_prints_a_working_key_on_its_last_line():
    result = run_python(
        "manage.py",
        "create_workspace",
        "Acme Labs",
        "--credit",
        "25",
        env={"DATABASE_URL": _database_url()},
    )
    assert result.returncode == 0, result.stderr
    key = result.stdout.strip().splitlines()[-1]
    assert key.startswith("veri_sk_") and " " not in key
    workspace = Workspace.objects.get(name="Acme Labs")
    assert services.authenticate_api_key(raw_key=key).workspace == workspace
    assert ApiKey.objects.get(workspace=workspace).secret_hash not in key  # only the hash is kept
    again = run_python(
        "manage.py", "create_workspace", "Acme Labs", env={"DATABASE_URL": _database_url()}
    )
    assert again.returncode != 0 and "already exists" in again.stderr
    shouted = run_python(
        "manage.py", "create_workspace", "ACME LABS", env={"DATABASE_URL": _database_url()}
    )
    assert shouted.returncode != 0 and "already exists" in shouted.stderr
    assert Workspace.objects.filter(name__iexact="Acme Labs").count() == 1


def _database_url() -> str:
    from django.db import connection

    settings = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{settings['NAME']}"
    return (
        f"postgres://{settings['USER']}:{settings['PASSWORD']}@{settings['HOST']}:"
        f"{settings['PORT']}/{settings['NAME']}"
    )


def test_admin_shows_a_new_api_key_once_and_never_stores_it(workspace):
    User.objects.create_superuser("op", "op@example.com", "pw")
    client = Client()
    client.login(username="op", password="pw")
    response = client.post(
        "/admin/veri/apikey/add/", {"workspace": workspace.pk, "name": "ci"}, follow=True
    )
    assert response.status_code == 200
    shown = [str(m) for m in response.context["messages"]]
    key = next(word for m in shown for word in m.split() if word.startswith("veri_sk_"))
    api_key = services.authenticate_api_key(raw_key=key)
    assert api_key.name == "ci" and api_key.workspace == workspace
    page = client.get(f"/admin/veri/apikey/{api_key.pk}/change/").content.decode()
    assert key not in page and key.split("_")[-1] not in page


def test_admin_lists_workspaces_and_volumes(workspace, api_client):
    api_client.post("/v1/volumes", {"name": "corpus"}, format="json")
    User.objects.create_superuser("op", "op@example.com", "pw")
    client = Client()
    client.login(username="op", password="pw")
    assert "acme" in client.get("/admin/veri/workspace/?q=acme").content.decode()
    volumes = client.get("/admin/volumes/volume/?q=corpus").content.decode()
    assert "corpus" in volumes


def test_admin_css_is_served_with_debug_off(settings):
    assert settings.DEBUG is False
    response = Client().get("/static/admin/css/base.css")
    assert response.status_code == 200
