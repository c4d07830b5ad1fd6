"""`POST /v1/chat/completions` and `POST /v1/completions`: OpenAI's inference routes, answered
by a replica of the workspace's deployment serving `model` (serving's router), streamed through
as it answers. The serving process validates the rest of the request, in OpenAI's shape."""

import json

from django.http import HttpResponse
from rest_framework.request import Request

from openai_api.api import SCHEMA, OpenAIView
from serving.services import inference
from veri.errors import VeriError


class InferenceView(OpenAIView):
    path = ""  # the serving process's route

    def post(self, request: Request) -> HttpResponse:
        body = request.data
        if not isinstance(body, dict):
            raise VeriError("The body is a JSON object.")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise VeriError("model is required: a deployed model's name.", field="model")
        replica = inference.route(workspace=self.workspace, model=model)
        return inference.forward(replica=replica, path=self.path, body=json.dumps(body).encode())


@SCHEMA
class ChatCompletionsView(InferenceView):
    path = "/v1/chat/completions"


@SCHEMA
class CompletionsView(InferenceView):
    path = "/v1/completions"
