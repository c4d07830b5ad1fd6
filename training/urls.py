from django.urls import path

from training import api, worker_api

urlpatterns = [
    path("datasets", api.DatasetsView.as_view()),
    path("datasets/<str:dataset_id>", api.DatasetView.as_view()),
    path("datasets/<str:dataset_id>/preview", api.DatasetPreviewView.as_view()),
    path("training_jobs", api.TrainingJobsView.as_view()),
    path("training_jobs/quote", api.QuoteView.as_view()),
    path("training_jobs/<str:job_id>", api.TrainingJobView.as_view()),
    path("training_jobs/<str:job_id>/cancel", api.CancelView.as_view()),
    path("training_jobs/<str:job_id>/resume", api.ResumeView.as_view()),
    path("training_jobs/<str:job_id>/logs", api.LogsView.as_view()),
    path("training_jobs/<str:job_id>/logs/full", api.FullLogView.as_view()),
    path("training_jobs/<str:job_id>/events", api.EventsView.as_view()),
    path("training_jobs/<str:job_id>/metrics", api.MetricsView.as_view()),
    path("training_jobs/<str:job_id>/checkpoints", api.CheckpointsView.as_view()),
    path("training_jobs/<str:job_id>/samples", api.SamplesView.as_view()),
    path("worker/jobs/<str:job_id>/bootstrap", worker_api.WorkerBootstrapView.as_view()),
    path("worker/jobs/<str:job_id>/register", worker_api.WorkerRegisterView.as_view()),
    path("worker/jobs/<str:job_id>/spec", worker_api.WorkerSpecView.as_view()),
    path("worker/jobs/<str:job_id>/status", worker_api.WorkerStatusView.as_view()),
    path("worker/jobs/<str:job_id>/heartbeat", worker_api.WorkerHeartbeatView.as_view()),
    path("worker/jobs/<str:job_id>/phase", worker_api.WorkerPhaseView.as_view()),
    path("worker/jobs/<str:job_id>/timings", worker_api.WorkerTimingsView.as_view()),
    path("worker/jobs/<str:job_id>/notice", worker_api.WorkerNoticeView.as_view()),
    path("worker/jobs/<str:job_id>/token", worker_api.WorkerTokenView.as_view()),
    path("worker/jobs/<str:job_id>/logs", worker_api.WorkerLogsView.as_view()),
    path("worker/jobs/<str:job_id>/metrics", worker_api.WorkerMetricsView.as_view()),
    path("worker/jobs/<str:job_id>/samples", worker_api.WorkerSamplesView.as_view()),
    path(
        "worker/jobs/<str:job_id>/volume-credentials",
        worker_api.WorkerVolumeCredentialsView.as_view(),
    ),
    path(
        "worker/jobs/<str:job_id>/output-credentials",
        worker_api.WorkerOutputCredentialsView.as_view(),
    ),
    path("worker/jobs/<str:job_id>/checkpoints", worker_api.WorkerCheckpointsView.as_view()),
    path("worker/jobs/<str:job_id>/complete", worker_api.WorkerCompleteView.as_view()),
    path("worker/jobs/<str:job_id>/release", worker_api.WorkerReleaseView.as_view()),
]
