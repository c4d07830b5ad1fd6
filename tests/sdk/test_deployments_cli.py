"""`veri deploy` and `veri deployments list|get|delete` against a live control plane (the
replica's launch is queued, not run: no task cluster here)."""

import json
import re
from pathlib import Path

import pytest

from billing.services import open_billing_account
from tests.tinker_api.test_listing import new_model, new_session, save_checkpoint
from veri.models import Workspace
from veri_sdk.cli import build_parser

pytestmark = pytest.mark.django_db(transaction=True)
BASE = "Qwen/Qwen2.5-0.5B"


@pytest.fixture(autouse=True)
def funded(cli):
    """Deployments run on the balance: the CLI's workspace has some."""
    open_billing_account(workspace=Workspace.objects.get(name="cli"), credit_micros=10_000_000)


def test_deploy_list_get_and_delete(cli, capsys):
    code, out, err = cli(
        "deploy", BASE, "--no-wait", "--idle-timeout", "60", "--json", capsys=capsys
    )
    assert code == 0, err
    deployment = json.loads(out)
    assert (deployment["base_model"], deployment["status"]) == (BASE, "starting")
    assert deployment["idle_timeout_seconds"] == 60 and deployment["provider"] == "local"

    code, out, _ = cli("deployments", "list", capsys=capsys)
    assert code == 0 and deployment["id"] in out and BASE in out and "starting" in out
    code, out, _ = cli("deployments", "get", deployment["id"], capsys=capsys)
    assert code == 0 and json.loads(out)["id"] == deployment["id"]

    code, out, _ = cli("deployments", "delete", deployment["id"], capsys=capsys)
    assert code == 0 and deployment["id"] in out
    code, _, err = cli("deployments", "get", deployment["id"], capsys=capsys)
    assert code == 1 and "No deployment" in err


def test_deploying_an_unknown_fine_tune_says_so(cli, capsys):
    code, _, err = cli("deploy", "ft:volume/models/tiny:cli::nope", "--no-wait", capsys=capsys)
    assert code == 1 and "not a fine-tuned model" in err


def test_deploying_a_tinker_save_serves_its_adapter_on_its_base(cli, capsys, tiny_model, tmp_path):
    model = new_model(new_session(Workspace.objects.get(name="cli")), BASE)
    save_checkpoint(model, tiny_model, tmp_path / "saved", name="plum")
    path = f"tinker://{model.model_id}/weights/plum"
    code, out, err = cli("deploy", path, "--no-wait", "--json", capsys=capsys)
    assert code == 0, err
    deployment = json.loads(out)
    assert deployment["base_model"] == BASE
    assert [a["name"] for a in deployment["adapters"]] == [path]


def test_deploying_a_deployed_model_again_uses_the_deployment_serving_it(cli, capsys):
    code, out, err = cli("deploy", BASE, "--no-wait", "--json", capsys=capsys)
    assert code == 0, err
    first = json.loads(out)["id"]
    code, out, err = cli("deploy", BASE, "--no-wait", "--json", capsys=capsys)
    assert code == 0, err
    assert f"{BASE} is already deployed as {first}" in err
    assert json.loads(out)["id"] == first
    code, out, _ = cli("deployments", "list", "--json", capsys=capsys)
    assert [d["id"] for d in json.loads(out)] == [first]  # no twin billing beside it


def test_the_reference_lists_every_flag_of_veri_deploy():
    commands = next(a for a in build_parser()._actions if a.dest == "command")
    flags = {f for a in commands.choices["deploy"]._actions for f in a.option_strings}
    reference = Path(__file__).parents[2] / "docs" / "user-guide" / "reference.md"
    [row] = [line for line in reference.read_text().splitlines() if "| `veri deploy MODEL" in line]
    listed = set(re.findall(r"--[a-z-]+", row.split("` |")[0]))
    assert flags - {"-h", "--help"} == listed
