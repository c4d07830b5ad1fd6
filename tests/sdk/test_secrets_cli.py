"""`veri secrets` and `client.secrets` against a live control plane: a value goes in from a
hidden prompt or stdin (never the command line) and is never printed or listed back."""

import io
import json

import pytest

from veri import selectors
from veri_sdk import Client, NotFoundError
from veri_sdk.cli import main

pytestmark = pytest.mark.django_db(transaction=True)

VALUE = "wandb-cli-canary-0123456789"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_set_from_stdin_or_a_hidden_prompt_list_and_delete(cli, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(VALUE + "\n"))
    code, out, _ = cli("secrets", "set", "WANDB_API_KEY", capsys=capsys)
    assert code == 0 and "WANDB_API_KEY set" in out and VALUE not in out
    assert selectors.secret_value(workspace=cli.workspace, name="WANDB_API_KEY") == VALUE

    prompts = []
    monkeypatch.setattr("sys.stdin", Terminal())
    monkeypatch.setattr("getpass.getpass", lambda prompt: prompts.append(prompt) or VALUE + "2")
    assert cli("secrets", "set", "OTHER_KEY", capsys=capsys)[0] == 0
    assert prompts == ["Value of OTHER_KEY (not shown): "]
    assert selectors.secret_value(workspace=cli.workspace, name="OTHER_KEY") == VALUE + "2"

    code, out, _ = cli("secrets", "list", capsys=capsys)
    assert code == 0 and "WANDB_API_KEY" in out and "OTHER_KEY" in out and VALUE not in out
    code, out, _ = cli("secrets", "list", "--json", capsys=capsys)
    assert [s["name"] for s in json.loads(out)] == ["OTHER_KEY", "WANDB_API_KEY"]

    assert cli("secrets", "delete", "OTHER_KEY", capsys=capsys)[:2] == (0, "OTHER_KEY deleted\n")
    code, _, err = cli("secrets", "delete", "OTHER_KEY", capsys=capsys)
    assert code == 1 and "No secret 'OTHER_KEY'" in err


def test_a_value_on_the_command_line_or_an_empty_one_is_refused(cli, capsys, monkeypatch):
    with pytest.raises(SystemExit) as usage:
        main(["secrets", "set", "WANDB_API_KEY", VALUE])
    assert usage.value.code == 2
    monkeypatch.setattr("sys.stdin", io.StringIO("\n"))
    code, _, err = cli("secrets", "set", "WANDB_API_KEY", capsys=capsys)
    assert code == 2 and "no value given" in err
    assert cli("secrets", "list", capsys=capsys)[1].count("WANDB_API_KEY") == 0


def test_the_sdk_sets_lists_and_deletes(cli):
    client = Client(api_key=cli.key, base_url=cli.url)
    secret = client.secrets.set("WANDB_API_KEY", VALUE)
    assert secret.name == "WANDB_API_KEY" and secret.created_at
    assert [s.name for s in client.secrets.list()] == ["WANDB_API_KEY"]
    client.secrets.delete("WANDB_API_KEY")
    assert client.secrets.list() == []
    with pytest.raises(NotFoundError):
        client.secrets.delete("WANDB_API_KEY")
