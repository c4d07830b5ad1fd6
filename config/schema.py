"""How `/v1/schema` describes our credentials, and the error answers every operation shares."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.views import SpectacularAPIView
from rest_framework.renderers import JSONRenderer


class ApiKeyScheme(OpenApiAuthenticationExtension):
    target_class = "veri.auth.ApiKeyAuthentication"
    name = "ApiKey"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "A workspace API key, veri_sk_…"}


class JobTokenScheme(OpenApiAuthenticationExtension):
    target_class = "training.worker_api.JobTokenAuthentication"
    name = "JobToken"
    description = "The worker's job token (vjt_…), good for its own job only"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": self.description}


class ReleaseTokenScheme(JobTokenScheme):
    target_class = "training.worker_api.ReleaseTokenAuthentication"
    name = "ReleaseToken"
    description = "The job token of the machine's run, also after its job ended"


class ReplicaTokenScheme(JobTokenScheme):
    target_class = "serving.worker_api.ReplicaTokenAuthentication"
    name = "ReplicaToken"
    description = "A deployment replica's token (veri_rt_…), good for its own replica only"


class TinkerModelTokenScheme(JobTokenScheme):
    target_class = "tinker_api.worker_api.ModelTokenAuthentication"
    name = "TinkerModelToken"
    description = "A Tinker model's worker token (veri_tt_…), good for its own model only"


ERROR_SCHEMA = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "code": {"type": "string"},
                "message": {"type": "string"},
                "field": {"type": "string", "nullable": True},
            },
            "required": ["code", "message", "field"],
        }
    },
    "required": ["error"],
}
ERROR_STATUSES = {
    "400": "Invalid request: `error.field` names what to fix.",
    "401": "No API key (or job token), or one that is not valid.",
    "402": "The workspace has no billing account, or not enough balance.",
    "404": "Not found in this workspace (another workspace's objects answer 404 too).",
    "409": "Conflict with the object's state, or an Idempotency-Key in use.",
    "413": "Too large: the body, a file, or a batch.",
    "429": "Too many requests; retry after the Retry-After header.",
}


def add_error_responses(result, generator, request, public):
    """Every operation answers errors as `{"error": {code, message, field, ...}}`."""
    result.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    ref = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    for path_item in result.get("paths", {}).values():
        for operation in path_item.values():
            responses = operation.setdefault("responses", {})
            for status, description in ERROR_STATUSES.items():
                responses.setdefault(status, {"description": description, "content": ref})
    return result


class SchemaView(SpectacularAPIView):
    """`/v1/schema` (YAML, or JSON with `?format=json`); its errors in the API's JSON format."""

    def finalize_response(self, request, response, *args, **kwargs):
        if response.status_code >= 400:
            request.accepted_renderer = response.accepted_renderer = JSONRenderer()
            request.accepted_media_type = response.accepted_media_type = "application/json"
        return super().finalize_response(request, response, *args, **kwargs)
