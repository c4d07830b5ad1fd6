"""OpenAI's error shape for the answers Veri gives on the OpenAI routes before (or after) their
views: a body over the limit (413), a NUL in the URL, an unknown route, a server error. Their
views' own errors are reshaped by `errors.exception_handler`."""

import json

from django.http import HttpRequest

from openai_api import errors

# The routes of openai_api/urls.py, under /v1.
PREFIXES = ("/v1/files", "/v1/fine_tuning/", "/v1/models", "/v1/chat/", "/v1/completions")


class OpenAIErrorsMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest):
        response = self.get_response(request)
        if (
            request.path.startswith(PREFIXES)
            and response.status_code >= 400
            and response.get("Content-Type", "").startswith("application/json")
            and not response.streaming
        ):
            try:
                body = json.loads(response.content)
            except ValueError:
                return response
            if isinstance(body, dict) and "field" in (body.get("error") or {}):  # Veri's shape
                response.content = json.dumps(errors.as_openai(body, response.status_code))
        return response
