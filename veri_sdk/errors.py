"""Typed errors: each carries the API's `code`, `message`, `field` and HTTP status."""


class VeriAPIError(Exception):
    def __init__(self, status: int, code: str, message: str, field: str | None = None, **extra):
        super().__init__(message)
        self.status, self.code, self.message, self.field, self.extra = (
            status,
            code,
            message,
            field,
            extra,
        )

    def __str__(self) -> str:
        return f"{self.message} ({self.code})"


class BadRequestError(VeriAPIError):
    pass


class AuthenticationError(VeriAPIError):
    pass


class PaymentRequiredError(VeriAPIError):
    pass


class NotFoundError(VeriAPIError):
    pass


class ConflictError(VeriAPIError):
    pass


class TooLargeError(VeriAPIError):
    pass


class RateLimitError(VeriAPIError):
    pass


class ServerError(VeriAPIError):
    pass


class ConnectionFailed(VeriAPIError):
    """The API could not be reached, even after retries."""


class BillingAccountRequiredError(PaymentRequiredError):
    pass


class InsufficientBalanceError(PaymentRequiredError):
    pass


class InvalidPathError(BadRequestError):
    pass


class InvalidRewardError(BadRequestError):
    pass


class BaseModelUnavailableError(BadRequestError):
    pass


class ProviderNotConfiguredError(BadRequestError):
    pass


class MethodUnavailableError(BadRequestError):
    pass


class NothingToResumeError(BadRequestError):
    pass


class JobFinishedError(ConflictError):
    pass


class IdempotencyKeyReusedError(ConflictError):
    pass


class PaymentsDisabledError(ConflictError):
    pass


# The codes a caller most often handles get a class of their own; every other error is the class
# of its HTTP status, with the code in `.code`.
BY_CODE = {
    "billing_account_required": BillingAccountRequiredError,
    "insufficient_balance": InsufficientBalanceError,
    "invalid_path": InvalidPathError,
    "invalid_reward": InvalidRewardError,
    "base_model_unavailable": BaseModelUnavailableError,
    "provider_not_configured": ProviderNotConfiguredError,
    "method_unavailable": MethodUnavailableError,
    "nothing_to_resume": NothingToResumeError,
    "job_finished": JobFinishedError,
    "idempotency_key_reused": IdempotencyKeyReusedError,
    "payments_disabled": PaymentsDisabledError,
}

BY_STATUS = {
    400: BadRequestError,
    401: AuthenticationError,
    402: PaymentRequiredError,
    404: NotFoundError,
    409: ConflictError,
    413: TooLargeError,
    429: RateLimitError,
}


def error_from_body(status: int, body: dict | None) -> VeriAPIError:
    error = (body or {}).get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        error = {"code": "http_error", "message": f"The API answered HTTP {status}."}
    error = dict(error)
    code, message = error.pop("code", "http_error"), error.pop("message", "")
    cls = BY_CODE.get(code) or BY_STATUS.get(status, ServerError if status >= 500 else VeriAPIError)
    return cls(status, code, message, error.pop("field", None), **error)
