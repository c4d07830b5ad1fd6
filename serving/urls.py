from django.urls import path

from serving import api, evaluations_api, worker_api

urlpatterns = [
    path("deployments", api.DeploymentsView.as_view()),
    path("deployments/<str:deployment_id>", api.DeploymentView.as_view()),
    path("deployments/<str:deployment_id>/events", api.EventsView.as_view()),
    path("evaluations", evaluations_api.EvaluationsView.as_view()),
    path("evaluations/<str:evaluation_id>", evaluations_api.EvaluationView.as_view()),
    path("worker/replicas/<str:replica_id>/bootstrap", worker_api.BootstrapView.as_view()),
    path("worker/replicas/<str:replica_id>/register", worker_api.RegisterView.as_view()),
    path("worker/replicas/<str:replica_id>/ready", worker_api.ReadyView.as_view()),
    path("worker/replicas/<str:replica_id>/heartbeat", worker_api.HeartbeatView.as_view()),
    path("worker/replicas/<str:replica_id>/failed", worker_api.FailedView.as_view()),
]
