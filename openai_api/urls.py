from django.urls import path

from openai_api import api, inference

urlpatterns = [
    path("files", api.FilesView.as_view()),
    path("files/<str:file_id>", api.FileView.as_view()),
    path("files/<str:file_id>/content", api.FileContentView.as_view()),
    path("fine_tuning/jobs", api.JobsView.as_view()),
    path("fine_tuning/jobs/<str:job_id>", api.JobView.as_view()),
    path("fine_tuning/jobs/<str:job_id>/cancel", api.CancelView.as_view()),
    path("fine_tuning/jobs/<str:job_id>/pause", api.PauseView.as_view()),
    path("fine_tuning/jobs/<str:job_id>/resume", api.ResumeView.as_view()),
    path("fine_tuning/jobs/<str:job_id>/events", api.EventsView.as_view()),
    path("fine_tuning/jobs/<str:job_id>/checkpoints", api.CheckpointsView.as_view()),
    path("fine_tuning/alpha/graders/validate", api.GraderValidateView.as_view()),
    path("fine_tuning/alpha/graders/run", api.GraderRunView.as_view()),
    path("chat/completions", inference.ChatCompletionsView.as_view()),
    path("completions", inference.CompletionsView.as_view()),
    path("models", api.ModelsView.as_view()),
    path("models/<path:model>", api.ModelView.as_view()),
]
