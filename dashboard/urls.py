from django.urls import path

from dashboard import account, deployments, evaluations, jobs, runs, storage, webhooks

app_name = "dashboard"

urlpatterns = [
    path("", account.home, name="home"),
    path("jobs/", jobs.job_list, name="jobs"),
    path("jobs/new/", jobs.job_new, name="job_new"),
    path("jobs/compare/", runs.compare, name="compare"),
    path("jobs/new/quote.json", jobs.job_quote, name="job_quote"),
    path("jobs/<str:job_id>/", jobs.job_detail, name="job"),
    path("jobs/<str:job_id>/status.json", jobs.job_status, name="job_status"),
    path("jobs/<str:job_id>/logs.json", jobs.job_logs, name="job_logs"),
    path("jobs/<str:job_id>/log.txt", jobs.job_full_log, name="job_full_log"),
    path("jobs/<str:job_id>/metrics.json", jobs.job_metrics, name="job_metrics"),
    path("jobs/<str:job_id>/samples.json", jobs.job_samples, name="job_samples"),
    path(
        "jobs/<str:job_id>/checkpoints/<str:checkpoint_id>/<path:path>",
        jobs.checkpoint_file,
        name="checkpoint_file",
    ),
    path("jobs/<str:job_id>/cancel/", jobs.job_cancel, name="job_cancel"),
    path("jobs/<str:job_id>/resume/", jobs.job_resume, name="job_resume"),
    path("jobs/<str:job_id>/deploy/", deployments.job_deploy, name="job_deploy"),
    path("deployments/", deployments.deployment_list, name="deployments"),
    path("deployments/<str:deployment_id>/", deployments.deployment_detail, name="deployment"),
    path(
        "deployments/<str:deployment_id>/status.json",
        deployments.deployment_status,
        name="deployment_status",
    ),
    path(
        "deployments/<str:deployment_id>/settings/",
        deployments.deployment_settings,
        name="deployment_settings",
    ),
    path(
        "deployments/<str:deployment_id>/delete/",
        deployments.deployment_delete,
        name="deployment_delete",
    ),
    path("playground/", deployments.playground, name="playground"),
    path("playground/chat/", deployments.playground_chat, name="playground_chat"),
    path("volumes/", storage.volume_list, name="volumes"),
    path("volumes/<str:volume_id>/", storage.volume_detail, name="volume"),
    path("volumes/<str:volume_id>/delete/", storage.volume_delete, name="volume_delete"),
    path("datasets/", storage.dataset_list, name="datasets"),
    path("datasets/<str:dataset_id>/", storage.dataset_detail, name="dataset"),
    path("datasets/<str:dataset_id>/delete/", storage.dataset_delete, name="dataset_delete"),
    path("billing/", account.billing_page, name="billing"),
    path("keys/", account.api_keys, name="keys"),
    path("keys/<str:prefix>/revoke/", account.api_key_revoke, name="key_revoke"),
    path("secrets/", account.secrets_page, name="secrets"),
    path("secrets/<str:name>/delete/", account.secret_delete, name="secret_delete"),
    path("webhooks/", webhooks.webhook_list, name="webhooks"),
    path("webhooks/<str:endpoint_id>/", webhooks.webhook_detail, name="webhook"),
    path("webhooks/<str:endpoint_id>/test/", webhooks.webhook_test, name="webhook_test"),
    path("webhooks/<str:endpoint_id>/delete/", webhooks.webhook_delete, name="webhook_delete"),
    path("workspace/", account.switch_workspace, name="switch"),
    path("evaluations/", evaluations.evaluation_list, name="evaluations"),
    path("evaluations/<str:evaluation_id>/", evaluations.evaluation_detail, name="evaluation"),
]
