"""`veri tinker key` gives a key the official `tinker` client accepts against a live control
plane; once revoked (`veri tinker revoke`), the client raises its authentication error."""

import json
import re

import pytest
import tinker

from tinker_api.models import TinkerSession

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_key_from_the_cli_opens_a_session_until_revoked(cli, capsys, monkeypatch):
    code, out, _ = cli("tinker", "key", "--name", "laptop", capsys=capsys)
    assert code == 0, out
    key = re.search(r"export TINKER_API_KEY=(tml-\S+)", out).group(1)
    assert f"export TINKER_BASE_URL={cli.url}" in out

    service = tinker.ServiceClient(base_url=cli.url, api_key=key)
    with pytest.raises(tinker.NotFoundError, match="No volume 'nope'"):
        service.create_lora_training_client(base_model="volume://nope/model", rank=4).result()
    assert TinkerSession.objects.filter(workspace=cli.workspace).count() == 1
    service.close("success").result()  # its heartbeat stops with the test
    assert TinkerSession.objects.get(workspace=cli.workspace).ended_at is not None
    capabilities = tinker.RestClient(base_url=cli.url, api_key=key).get_server_capabilities()
    assert capabilities.result().supported_models == []  # no model folder in its volumes

    code, out, _ = cli("tinker", "keys", "--json", capsys=capsys)
    [listed] = json.loads(out)
    assert (listed["name"], listed["revoked_at"]) == ("laptop", None)
    assert key.startswith(listed["prefix"]) and key not in out and listed["last_used_at"]

    code, out, _ = cli("tinker", "revoke", listed["id"], capsys=capsys)
    assert code == 0 and f"{listed['id']} revoked" in out
    with pytest.raises(tinker.AuthenticationError, match="not valid or was revoked"):
        tinker.RestClient(base_url=cli.url, api_key=key).get_server_capabilities().result()
    with pytest.raises(tinker.AuthenticationError):
        tinker.ServiceClient(
            base_url=cli.url, api_key="tml-unknown_00"
        ).create_lora_training_client(base_model="volume://nope/model").result()
