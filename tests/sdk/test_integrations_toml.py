"""A TOML job asks for a W&B integration as the API does: `[[integrations]]`."""

from veri_sdk.cli.train import load_toml

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
