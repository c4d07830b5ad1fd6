"""`POST /v1/chat/completions` and `POST /v1/completions`: OpenAI's inference routes, answered
by a replica of the workspace's deployment serving `model` (serving's router), streamed through
as it answers. The serving process validates the rest of the request, in OpenAI's shape.
Each request passes the workspace's rate limits first; every answer carries OpenAI's
`x-ratelimit-*` headers."""

import json

from django.http import HttpResponse
from rest_framework.request import Request

from openai_api.api import SCHEMA, OpenAIView
from serving.services import inference, limits
from veri.errors import VeriError


class InferenceView(OpenAIView):
    path = ""  # the serving process's route
    rate: dict[str, str] = {}  # the rate limits' headers, once admitted

    def post(self, request: Request) -> HttpResponse:
        body = request.data
        if not isinstance(body, dict):
            raise VeriError("The body is a JSON object.")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise VeriError("model is required: a deployed model's name.", field="model")
        self.rate = limits.admit(workspace=self.workspace, tokens=limits.estimate_tokens(body))
        held = inference.route(workspace=self.workspace, model=model)
        return inference.forward(held=held, path=self.path, body=json.dumps(body).encode())

    def finalize_response(self, request, response, *args, **kwargs):
        # The limits' headers on every admitted request's answer, an error's too (as OpenAI's).
        for name, value in self.rate.items():
            response[name] = value
        return super().finalize_response(request, response, *args, **kwargs)


@SCHEMA
class ChatCompletionsView(InferenceView):
    path = "/v1/chat/completions"


@SCHEMA
class CompletionsView(InferenceView):
    path = "/v1/completions"
