from django.urls import path

from veri import views

urlpatterns = [
    path("secrets", views.SecretsView.as_view()),
    path("secrets/<str:name>", views.SecretView.as_view()),
]
