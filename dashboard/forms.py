"""The dashboard's forms. Validation of what a job may be stays in the services: a form only
shapes the input, and the service's errors are shown next to the field they name."""

from django import forms

from providers import catalog
from providers.services import default_provider, usable_providers
from training.specs import METHODS
from webhooks.services import EVENT_TYPES


class NewJobForm(forms.Form):
    method = forms.ChoiceField(
        choices=[("grpo", "GRPO (with a reward function)"), ("sft_text", "SFT"), ("dpo", "DPO")]
    )
    base_model = forms.CharField(
        max_length=1100, help_text="volume://<volume>/<folder>, or a Hugging Face id"
    )
    dataset = forms.ChoiceField(required=False, help_text="one of this workspace's datasets")
    dataset_file = forms.FileField(required=False, help_text="or upload a .jsonl")
    reward_file = forms.FileField(required=False, help_text="GRPO: a .py defining reward(...)")
    gpu = forms.ChoiceField(label="GPU")
    region = forms.ChoiceField(required=False)
    max_steps = forms.IntegerField(required=False, min_value=1)
    learning_rate = forms.FloatField(required=False)
    max_cost_usd = forms.DecimalField(
        required=False, min_value=0.01, decimal_places=2, label="Budget cap (USD)"
    )
    output_name = forms.CharField(required=False, max_length=200)

    def __init__(self, *args, datasets, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["dataset"].choices = [("", "—")] + [
            (d.public_id, f"{d.name or d.public_id} ({d.public_id})") for d in datasets
        ]
        default = default_provider()
        self.fields["gpu"].choices = [
            (
                f"{spec.name}:{gpu.name}",
                f"{gpu.name} on {spec.title} ({gpu.price_per_gpu_hour} USD/hour)",
            )
            for spec in usable_providers()
            for gpu in spec.gpus
        ]
        self.fields["gpu"].initial = f"{default}:{catalog.get_provider(default).gpus[0].name}"
        self.fields["region"].choices = [("", "automatic")] + [
            (code, code) for code in catalog.available_region_codes()
        ]

    def clean(self):
        data = super().clean()
        if data.get("method") not in METHODS:
            return data
        if not data.get("dataset") and not data.get("dataset_file"):
            self.add_error("dataset", "Pick a dataset or upload a .jsonl.")
        if data.get("method") == "grpo" and not data.get("reward_file"):
            self.add_error("reward_file", "GRPO needs a reward file.")
        return data

    def submission_fields(self) -> dict:
        """The submit call's fields (the dataset is resolved by the view)."""
        data = self.cleaned_data
        provider, _, gpu_type = data["gpu"].partition(":")
        hyperparameters = {
            name: data[name] for name in ("max_steps", "learning_rate") if data.get(name)
        }
        fields = {
            "base_model": data["base_model"],
            "method": data["method"],
            "provider": provider,
            "gpu_type": gpu_type,
            "region": data.get("region") or None,
            "hyperparameters": hyperparameters,
            "output_name": data.get("output_name") or "",
            "max_cost_usd": data.get("max_cost_usd"),
        }
        if data.get("reward_file"):
            fields["reward_source"] = data["reward_file"].read().decode("utf-8", "replace")
        return fields


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
    "max_cost_usd": "max_cost_usd",
    "output_name": "output_name",
    "method": "method",
    "file": "dataset_file",
}


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
