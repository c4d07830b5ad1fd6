"""The Tinker face's routes, under /api/v1/ (config/urls.py)."""

from django.urls import path, re_path

from tinker_api import api

# The client's checkpoint id: `weights/<name>` or `sampler_weights/<name>`.
CK = r"(?P<checkpoint_id>(?:sampler_)?weights/[^/]+)"

urlpatterns = [
    path("healthz", api.HealthView.as_view()),
    path("client/config", api.ClientConfigView.as_view()),
    path("client/dynamic_config", api.DynamicConfigView.as_view()),
    path("telemetry", api.TelemetryView.as_view()),
    path("get_server_capabilities", api.CapabilitiesView.as_view()),
    path("create_session", api.CreateSessionView.as_view()),
    path("session_heartbeat", api.SessionHeartbeatView.as_view()),
    path("create_model", api.CreateModelView.as_view()),
    path("get_info", api.GetInfoView.as_view()),
    path("forward_backward", api.ForwardBackwardView.as_view()),
    path("optim_step", api.OptimStepView.as_view()),
    path("save_weights", api.SaveWeightsView.as_view()),
    path("load_weights", api.LoadWeightsView.as_view()),
    path("save_weights_for_sampler", api.SaveWeightsForSamplerView.as_view()),
    path("create_sampling_session", api.CreateSamplingSessionView.as_view()),
    path("samplers/<str:sampler_id>", api.SamplerView.as_view()),
    path("asample", api.AsampleView.as_view()),
    path("retrieve_future", api.RetrieveFutureView.as_view()),
    path("training_runs", api.TrainingRunsView.as_view()),
    path("training_runs/<str:model_id>", api.TrainingRunView.as_view()),
    path("training_runs/<str:model_id>/checkpoints", api.RunCheckpointsView.as_view()),
    re_path(rf"^training_runs/(?P<model_id>[^/]+)/checkpoints/{CK}$", api.CheckpointView.as_view()),
    re_path(
        rf"^training_runs/(?P<model_id>[^/]+)/checkpoints/{CK}/archive$",
        api.CheckpointArchiveView.as_view(),
    ),
    path("checkpoints", api.UserCheckpointsView.as_view()),
    path("weights_info", api.WeightsInfoView.as_view()),
    path("sessions", api.SessionsView.as_view()),
    path("sessions/<str:session_id>", api.SessionView.as_view()),
    path("sessions/<str:session_id>/finish", api.SessionFinishView.as_view()),
    re_path(r"^(?P<path>.*)$", api.unsupported),
]
