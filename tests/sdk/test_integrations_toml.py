"""A TOML job asks for what the API takes: a W&B integration (`[[integrations]]`), `auto_resume`
and `max_restarts`."""

import pytest

from veri_sdk.cli.train import BadConfig, load_toml

JOB = """
kind = "train"
base_model = "volume://models/tiny"
dataset = "ds_0123456789abcdef"
method = "sft_text"

[[integrations]]
type = "wandb"

[integrations.wandb]
project = "my-project"
tags = ["sft"]
"""


def test_a_toml_job_carries_its_wandb_integration(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text(JOB)
    assert load_toml(path)["fields"]["integrations"] == [
        {"type": "wandb", "wandb": {"project": "my-project", "tags": ["sft"]}}
    ]


def test_a_toml_job_sets_auto_resume_and_max_restarts_as_the_api_takes_them(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text(JOB.split("[[integrations]]")[0] + "auto_resume = false\nmax_restarts = 5\n")
    fields = load_toml(path)["fields"]
    assert (fields["auto_resume"], fields["max_restarts"]) == (False, 5)


@pytest.mark.parametrize(
    ("line", "named"),
    [
        ("auto_resume = 1", "'auto_resume' must be true or false"),
        ("max_restarts = true", "'max_restarts' must be a whole number"),
    ],
)
def test_auto_resume_and_max_restarts_of_the_wrong_type_are_refused(tmp_path, line, named):
    path = tmp_path / "job.toml"
    path.write_text(JOB.split("[[integrations]]")[0] + line + "\n")
    with pytest.raises(BadConfig, match=named):
        load_toml(path)
