"""OpenAI's error shape on the OpenAI routes: `{"error": {"message", "type", "param", "code"}}`,
with the statuses the `openai` client maps to its exception classes. Veri's handler decides
the status and message; this only reshapes its body."""

from veri import errors

TYPES = {
    401: "invalid_request_error",
    402: "insufficient_quota",
    403: "permission_error",
    429: "rate_limit_error",
}


def as_openai(body: dict, status: int) -> dict:
    error = body.get("error") or {}
    code = error.get("code")
    if status == 401:
        code = "invalid_api_key"
    # A rate limit names the limit it hit (`requests`, `tokens`) as its type, as OpenAI does.
    kind = (error.get("type") if status == 429 else None) or TYPES.get(status)
    kind = kind or ("server_error" if status >= 500 else "invalid_request_error")
    return {
        "error": {
            "message": error.get("message", ""),
            "type": kind,
            "param": error.get("field"),
            "code": code,
        }
    }


def exception_handler(exc, context):
    response = errors.exception_handler(exc, context)
    if response is not None and isinstance(response.data, dict) and "error" in response.data:
        response.data = as_openai(response.data, response.status_code)
    return response
