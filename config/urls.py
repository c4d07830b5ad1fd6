from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import JsonResponse
from django.urls import include, path, re_path
from django.views.defaults import bad_request, page_not_found
from django.views.defaults import server_error as html_server_error

from config.favicon import favicon
from config.health import healthz
from config.schema import SchemaView
from providers.api import GpusView, RegionsView
from veri import errors

v1 = [
    path("schema", SchemaView.as_view(), name="schema"),
    path("", include("volumes.urls")),
    path("", include("training.urls")),
    path("", include("billing.urls")),
    path("", include("openai_api.urls")),
    path("", include("tinker_api.urls")),
    path("", include("serving.urls")),
    path("", include("veri.urls")),
    path("", include("webhooks.urls")),
    path("regions", RegionsView.as_view()),
    path("gpus", GpusView.as_view()),
    re_path(r"^.*$", errors.not_found),  # unknown /v1 routes answer in the API's error format
]

urlpatterns = [
    path("admin/", admin.site.urls),
    # Sign-in, sign-out and password change; no emailed password reset (operators reset one).
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path(
        "accounts/password_change/",
        auth_views.PasswordChangeView.as_view(),
        name="password_change",
    ),
    path(
        "accounts/password_change/done/",
        auth_views.PasswordChangeDoneView.as_view(),
        name="password_change_done",
    ),
    path("healthz", healthz, name="healthz"),
    path("favicon.ico", favicon, name="favicon"),
    path("v1/", include(v1)),
    path("api/v1/", include("tinker_api.tinker_urls")),  # the Tinker SDK's routes
    path("", include("dashboard.urls")),
]


def handler400(request, exception):
    if request.path.startswith("/v1/"):
        body = errors.VeriError(f"The request was refused: {exception}").as_body()
        return JsonResponse(body, status=400)
    return bad_request(request, exception)


def handler404(request, exception):
    if request.path.startswith("/v1/"):
        return errors.not_found(request, exception)
    return page_not_found(request, exception)


def handler500(request):
    if request.path.startswith(("/v1/", "/api/v1/")):
        return errors.server_error(request)
    return html_server_error(request)
