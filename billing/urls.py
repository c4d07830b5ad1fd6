from django.urls import path

from billing import api

urlpatterns = [
    path("billing", api.BillingView.as_view()),
    path("billing/ledger", api.LedgerView.as_view()),
    path("billing/top_ups", api.TopUpsView.as_view()),
    path("billing/stripe/webhook", api.StripeWebhookView.as_view()),
]
