"""The dashboard's forms. Validation of what a job may be stays in the services: a form only
shapes the input, and the service's errors are shown next to the field they name."""

import dataclasses
import json
from functools import cache

from django import forms

from providers import catalog
from providers.services import default_provider, usable_providers
from training import specs
from training.services.jobs import Submission
from webhooks.services import EVENT_TYPES

# The hyperparameters the form has a field of their own; the others go in its JSON box.
NAMED_HYPERPARAMETERS = ("max_steps", "learning_rate", "batch_size")
SUBMISSION_DEFAULTS = {
    f.name: f.default
    for f in dataclasses.fields(Submission)
    if f.default is not dataclasses.MISSING
}


def _json_object(value: str, label: str) -> dict:
    if not value.strip():
        return {}
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise forms.ValidationError(f"{label} is not JSON: {exc}.") from None
    if not isinstance(parsed, dict):
        raise forms.ValidationError(f'{label} is a JSON object: {{"name": value, ...}}.')
    return parsed


class NewJobForm(forms.Form):
    """A job's submit fields. Defaults shown as placeholders come from `training.specs` (the
    method's hyperparameters, LoRA) and `Submission` (the rest): the same values submit uses.

    Files cannot be given back to a browser after an error, so the view keeps them: an uploaded
    dataset is made a dataset and selected, a reward file's text rides in `reward_source`."""

    method = forms.ChoiceField(
        choices=[("grpo", "GRPO (with a reward function)"), ("sft_text", "SFT"), ("dpo", "DPO")]
    )
    base_model = forms.CharField(
        max_length=1100, help_text="volume://<volume>/<folder>, or a Hugging Face id"
    )
    dataset = forms.ChoiceField(required=False, help_text="one of this workspace's datasets")
    dataset_file = forms.FileField(required=False, help_text="or upload a .jsonl")
    reward_file = forms.FileField(required=False, help_text="GRPO: a .py defining reward(...)")
    reward_source = forms.CharField(required=False, widget=forms.HiddenInput, strip=False)
    reward_name = forms.CharField(required=False, widget=forms.HiddenInput)
    gpu = forms.ChoiceField(label="GPU")
    gpu_count = forms.IntegerField(required=False, min_value=1, label="GPU count")
    region = forms.ChoiceField(required=False)
    max_steps = forms.IntegerField(required=False, min_value=1)
    learning_rate = forms.FloatField(required=False)
    batch_size = forms.IntegerField(required=False, min_value=1)
    hyperparameters = forms.CharField(
        required=False,
        label="Other hyperparameters (JSON)",
        widget=forms.Textarea(attrs={"rows": 3}),
    )
    lora = forms.CharField(
        required=False, label="LoRA (JSON)", widget=forms.Textarea(attrs={"rows": 2})
    )
    checkpoint_every = forms.IntegerField(
        required=False, min_value=1, help_text="steps; a job without checkpoints cannot resume"
    )
    max_cost_usd = forms.DecimalField(
        required=False, min_value=0.01, decimal_places=2, label="Budget cap (USD)"
    )
    output_name = forms.CharField(required=False, max_length=200)

    def __init__(self, *args, datasets, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["dataset"].choices = [("", "—")] + [
            (d.public_id, f"{d.name or d.public_id} ({d.public_id})") for d in datasets
        ]
        # Grouped under the provider's catalog name, each GPU as the catalog names it.
        self.fields["gpu"].choices = [
            (
                spec.name,
                [
                    (
                        f"{spec.name}:{gpu.name}",
                        f"{spec.name} · {gpu.name} · {gpu.price_per_gpu_hour} USD per GPU-hour · "
                        f"up to {gpu.max_count} per job",
                    )
                    for gpu in spec.gpus
                ],
            )
            for spec in usable_providers()
        ]
        default = default_provider()
        self.fields["gpu"].initial = f"{default}:{catalog.get_provider(default).gpus[0].name}"
        self.fields["region"].choices = [
            ("", f"automatic (default: {catalog.default_region()})")
        ] + [(code, code) for code in catalog.available_region_codes()]
        self._show_defaults(self["method"].value() or "grpo")

    def _show_defaults(self, method: str) -> None:
        """Placeholders and hints with the method's defaults (the page's script updates them
        when the method changes, from `method_defaults()`)."""
        defaults = method_defaults().get(method, method_defaults()["grpo"])
        for name in NAMED_HYPERPARAMETERS:
            self.fields[name].widget.attrs["placeholder"] = defaults["named"][name]
            self.fields[name].widget.attrs["data-default"] = name
        self.fields["hyperparameters"].widget.attrs["placeholder"] = defaults["other"]
        self.fields["hyperparameters"].widget.attrs["data-default"] = "other"
        self.fields["lora"].widget.attrs["placeholder"] = json.dumps(specs.LORA_DEFAULTS)
        self.fields["gpu_count"].widget.attrs["placeholder"] = SUBMISSION_DEFAULTS["gpu_count"]
        self.fields["checkpoint_every"].widget.attrs["placeholder"] = "none"
        self.fields["max_cost_usd"].widget.attrs["placeholder"] = "none"

    def clean_reward_source(self) -> str:
        # A browser sends a kept value's line breaks back as CRLF: the file had them as LF.
        return (self.cleaned_data.get("reward_source") or "").replace("\r\n", "\n")

    def clean_hyperparameters(self) -> dict:
        return _json_object(self.cleaned_data.get("hyperparameters") or "", "Hyperparameters")

    def clean_lora(self) -> dict | None:
        return _json_object(self.cleaned_data.get("lora") or "", "LoRA") or None

    def clean(self):
        data = super().clean()
        if data.get("method") not in specs.METHODS:
            return data
        if not data.get("dataset"):
            self.add_error("dataset", "Pick a dataset or upload a .jsonl.")
        if data.get("method") == "grpo" and not data.get("reward_source"):
            self.add_error("reward_file", "GRPO needs a reward file.")
        return data

    def submission_fields(self) -> dict:
        """The submit call's fields."""
        data = self.cleaned_data
        provider, _, gpu_type = data["gpu"].partition(":")
        hyperparameters = dict(data.get("hyperparameters") or {})
        hyperparameters |= {
            name: data[name] for name in NAMED_HYPERPARAMETERS if data.get(name) is not None
        }
        return {
            "base_model": data["base_model"],
            "dataset_id": data.get("dataset") or "",
            "method": data["method"],
            "reward_source": data.get("reward_source") or "",
            "provider": provider,
            "gpu_type": gpu_type,
            "gpu_count": data.get("gpu_count") or SUBMISSION_DEFAULTS["gpu_count"],
            "region": data.get("region") or None,
            "hyperparameters": hyperparameters,
            "lora": data.get("lora"),
            "checkpoint_every": data.get("checkpoint_every"),
            "output_name": data.get("output_name") or "",
            "max_cost_usd": data.get("max_cost_usd"),
        }

    @staticmethod
    def initial_from(submission: Submission) -> dict:
        """The form's values for a job submitted as `submission` (Clone)."""
        named = {k: v for k, v in submission.hyperparameters.items() if k in NAMED_HYPERPARAMETERS}
        other = {k: v for k, v in submission.hyperparameters.items() if k not in named}
        return named | {
            "method": submission.method,
            "base_model": submission.base_model,
            "dataset": submission.dataset_id,
            "reward_source": submission.reward_source,
            "gpu": f"{submission.provider}:{submission.gpu_type}",
            "gpu_count": submission.gpu_count,
            "region": submission.region or "",
            "hyperparameters": json.dumps(other) if other else "",
            "lora": json.dumps(submission.lora) if submission.lora else "",
            "checkpoint_every": submission.checkpoint_every,
            "max_cost_usd": submission.max_cost_usd,
            "output_name": submission.output_name,
        }


@cache
def method_defaults() -> dict:
    """Per method: each named hyperparameter's default as a placeholder, and the others' as a
    JSON object (the page's script swaps them when the method changes)."""
    shown = {}
    for method, defaults in specs.DEFAULTS.items():
        named = {name: str(defaults.get(name, "")) for name in NAMED_HYPERPARAMETERS}
        if "max_steps" not in defaults and "epochs" in defaults:
            named["max_steps"] = f"none: {defaults['epochs']} epoch(s)"
        other = {k: v for k, v in defaults.items() if k not in NAMED_HYPERPARAMETERS}
        shown[method] = {"named": named, "other": json.dumps(other)}
    return shown


# Where a service's error about a submit field is shown on the form.
SUBMIT_FIELDS = {
    "base_model": "base_model",
    "dataset_id": "dataset",
    "reward_source": "reward_file",
    "gpu_type": "gpu",
    "gpu_count": "gpu",
    "provider": "gpu",
    "region": "region",
    "hyperparameters.max_steps": "max_steps",
    "hyperparameters.learning_rate": "learning_rate",
    "hyperparameters.batch_size": "batch_size",
    "hyperparameters": "hyperparameters",
    "lora": "lora",
    "checkpoint_every": "checkpoint_every",
    "max_cost_usd": "max_cost_usd",
    "output_name": "output_name",
    "method": "method",
    "file": "dataset_file",
}


def form_field_for(error_field: str | None) -> str | None:
    """The form field a service's error is shown next to (None: above the form)."""
    name = error_field or ""
    if name in SUBMIT_FIELDS:
        return SUBMIT_FIELDS[name]
    prefix = name.partition(".")[0]
    return prefix if prefix in ("hyperparameters", "lora") else None


class ConfirmNameForm(forms.Form):
    confirm = forms.CharField(label="Type the volume's name to delete it")


class ApiKeyForm(forms.Form):
    name = forms.CharField(max_length=100, required=False)


class SecretForm(forms.Form):
    name = forms.CharField(max_length=64, help_text="e.g. WANDB_API_KEY")
    # Never rendered back with its value: a failed form shows an empty field.
    value = forms.CharField(widget=forms.PasswordInput(render_value=False), strip=False)


class TopUpForm(forms.Form):
    amount_usd = forms.DecimalField(min_value=5, max_value=10_000, decimal_places=2)


class WebhookEndpointForm(forms.Form):
    url = forms.CharField(label="URL", max_length=2000, help_text="https://… that accepts a POST")
    event_types = forms.MultipleChoiceField(
        required=False,
        label="Event types",
        choices=[(t, t) for t in EVENT_TYPES],
        widget=forms.CheckboxSelectMultiple,
        help_text="none ticked: every event",
    )
    description = forms.CharField(required=False, max_length=500)

    def cleaned_event_types(self) -> list[str]:
        return self.cleaned_data["event_types"]
