from django.contrib.auth.backends import ModelBackend
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from veri import services
from veri.models import ApiKey


class ApiKeyAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer veri_sk_…`; `request.auth` is the ApiKey, `request.user` is None."""

    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[None, ApiKey] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, raw_key = header.partition(" ")
        if scheme != self.keyword or not raw_key.strip():
            raise exceptions.AuthenticationFailed(
                "Send the API key as `Authorization: Bearer <key>`."
            )
        api_key = services.authenticate_api_key(raw_key=raw_key.strip())
        if api_key is None:
            raise exceptions.AuthenticationFailed("This API key is not valid or was revoked.")
        return None, api_key

    def authenticate_header(self, request: Request) -> str:
        return self.keyword  # makes DRF answer 401 (not 403) when no key is sent


class EmailBackend(ModelBackend):
    """Dashboard accounts are named by their email, stored lower-case: `Ada@Example.com` signs in
    as `ada@example.com`. A username that matches exactly (an operator's) still comes first."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is None and username and username != username.strip().lower():
            user = super().authenticate(
                request, username=username.strip().lower(), password=password, **kwargs
            )
        return user
