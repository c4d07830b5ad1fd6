from django.apps import AppConfig


class OpenAIApiConfig(AppConfig):
    name = "openai_api"
    verbose_name = "OpenAI-compatible fine-tuning"

    def ready(self) -> None:
        # Training tells the faces above it that a job ended through this hook, never by
        # importing them: the face publishes `fine_tuning.job.*` for the jobs it started.
        from openai_api.services import jobs
        from training.hooks import register_job_ended

        register_job_ended(jobs.job_ended)
