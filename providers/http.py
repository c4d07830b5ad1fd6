"""One small typed HTTP client for providers whose official client is their REST API (Vast.ai,
DigitalOcean): a bearer token, timeouts, and retries with backoff on connection errors, 429 and
5xx (honouring Retry-After). A create is not idempotent on these APIs: its retries look the
machine up first (`adopt`), so an answer lost after the provider accepted rents one machine."""

from collections.abc import Callable
from dataclasses import dataclass

import httpx
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    retry_if_result,
    stop_after_attempt,
)

from providers.base import ProviderError, ProviderUnavailable
from veri.tls import tls_context

RETRIED_STATUSES = {429, 500, 502, 503, 504}


class ProviderApiError(ProviderError):
    def __init__(self, provider: str, status: int, body: dict | str):
        self.status, self.body = status, body
        super().__init__(f"{provider} answered HTTP {status}: {str(body)[:300]}")


@dataclass
class RestClient:
    provider: str
    base_url: str
    token: str
    timeout: float = 30.0
    attempts: int = 4
    backoff: float = 0.5

    def request(
        self,
        method: str,
        path: str,
        *,
        json=None,
        params=None,
        adopt: Callable[[], dict | None] | None = None,
    ) -> dict:
        """The answer's JSON ({} for an empty body); ProviderApiError for any other status.

        `adopt` makes a create safe to retry: after a transport error or a server error the
        provider may have created the machine and lost only its answer, so before sending the
        create again (and before giving up) `adopt()` looks the machine up by what the create
        tagged it with; what it finds stands as the create's answer. A 429 was refused before
        any work, so it is simply sent again."""
        url = f"{self.base_url.rstrip('/')}/{path.lstrip('/')}"
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}

        def send() -> httpx.Response | dict:
            try:
                response = httpx.request(
                    method,
                    url,
                    json=json,
                    params=params,
                    headers=headers,
                    timeout=self.timeout,
                    verify=tls_context(),
                )
            except httpx.TransportError:
                if adopt is not None and (found := adopt()) is not None:
                    return found
                raise
            if response.status_code >= 500 and adopt is not None and (found := adopt()) is not None:
                return found
            return response

        try:
            response = Retrying(
                stop=stop_after_attempt(self.attempts),
                wait=self._wait,
                retry=retry_if_exception_type(httpx.TransportError)
                | retry_if_result(
                    lambda answer: (
                        isinstance(answer, httpx.Response)
                        and answer.status_code in RETRIED_STATUSES
                    )
                ),
                retry_error_callback=lambda state: state.outcome.result(),
            )(send)
        except httpx.TransportError as exc:
            raise ProviderUnavailable(
                f"{self.provider} could not be reached ({type(exc).__name__})"
            ) from exc
        if isinstance(response, dict):
            return response  # adopted
        try:
            body = response.json() if response.content else {}
        except ValueError:
            body = response.text
        if response.is_success:
            return body if isinstance(body, dict) else {"data": body}
        raise ProviderApiError(self.provider, response.status_code, body)

    def delete(self, path: str) -> None:
        """Delete a resource; one already gone (404) is fine. A provider still failing with its
        own server errors after the retries is unavailable (a cancel answers 503, not 500)."""
        try:
            self.request("DELETE", path)
        except ProviderApiError as exc:
            if exc.status >= 500:
                raise ProviderUnavailable(
                    f"{self.provider} kept failing (HTTP {exc.status})"
                ) from exc
            if exc.status != 404:
                raise

    def _wait(self, state: RetryCallState) -> float:
        """Retry-After (at most 30 seconds) when the answer gave one, else exponential."""
        exponential = self.backoff * 2 ** (state.attempt_number - 1)
        if state.outcome.failed:
            return exponential
        try:
            return min(float(state.outcome.result().headers.get("Retry-After", "")), 30.0)
        except ValueError:
            return exponential
