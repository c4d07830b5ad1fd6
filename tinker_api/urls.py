"""The Tinker face's routes under /v1 (Veri's API): keys, and the model workers' side."""

from django.urls import path

from tinker_api import keys_api, worker_api

W = "worker/tinker_models/<str:model_id>"

urlpatterns = [
    path("tinker/keys", keys_api.TinkerKeysView.as_view()),
    path("tinker/keys/<str:key_id>", keys_api.TinkerKeyView.as_view()),
    path(f"{W}/bootstrap", worker_api.BootstrapView.as_view()),
    path(f"{W}/register", worker_api.RegisterView.as_view()),
    path(f"{W}/next", worker_api.NextView.as_view()),
    path(f"{W}/operations/<str:request_id>", worker_api.ResultView.as_view()),
    path(f"{W}/operations/<str:request_id>/uploads", worker_api.UploadsView.as_view()),
    path(f"{W}/failed", worker_api.FailedView.as_view()),
]
