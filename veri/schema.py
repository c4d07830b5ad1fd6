"""How the OpenAPI schema (`/v1/schema`) describes our two credentials."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ApiKeyScheme(OpenApiAuthenticationExtension):
    target_class = "veri.auth.ApiKeyAuthentication"
    name = "ApiKey"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "A workspace API key, veri_sk_…"}


class JobTokenScheme(OpenApiAuthenticationExtension):
    target_class = "training.api.JobTokenAuthentication"
    name = "JobToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "The worker's job token (vjt_…), good for its own job only",
        }
