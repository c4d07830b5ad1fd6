from django.apps import AppConfig


class OpenAIApiConfig(AppConfig):
    name = "openai_api"
    verbose_name = "OpenAI-compatible fine-tuning"

    def ready(self) -> None:
        # Training reaches the faces above it through hooks, never by importing them: the face
        # publishes `fine_tuning.job.*` for the jobs it started, and names its `ft:` models.
        from openai_api.services import jobs
        from training.hooks import (
            register_fine_tuned_names,
            register_job_ended,
            register_job_model_names,
        )

        register_job_ended(jobs.job_ended)
        register_fine_tuned_names(jobs.resolve_fine_tuned)
        register_job_model_names(jobs.job_model_name)
