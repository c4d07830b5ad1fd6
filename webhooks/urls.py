from django.urls import path

from webhooks import api

urlpatterns = [
    path("webhook_endpoints", api.WebhookEndpointsView.as_view()),
    path("webhook_endpoints/<str:endpoint_id>", api.WebhookEndpointView.as_view()),
    path("webhook_endpoints/<str:endpoint_id>/rotate_secret", api.RotateSecretView.as_view()),
    path("webhook_endpoints/<str:endpoint_id>/test", api.TestEventView.as_view()),
    path("webhook_endpoints/<str:endpoint_id>/deliveries", api.DeliveriesView.as_view()),
]
