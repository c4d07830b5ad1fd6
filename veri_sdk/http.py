"""HTTP with retries: connection errors, 5xx and 429 are retried with backoff; POSTs carry an
Idempotency-Key that stays the same across the retries of one call."""

import hashlib
import os
import random
import ssl
import uuid
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

import httpx
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    retry_if_result,
    stop_after_attempt,
)

from veri_sdk.errors import AuthenticationError, ConnectionFailed, error_from_body

RETRY_STATUSES = {429, 500, 502, 503, 504}
LOGIN_HINT = "run `veri login` (it saves the API URL and key) or set VERI_API_KEY and VERI_API_URL"


def backoff(attempt: int, retry_after: str | None = None) -> float:
    if retry_after:
        try:
            return min(float(retry_after), 30.0)
        except ValueError:
            pass
    return min(0.25 * 2**attempt, 8.0) * (0.5 + random.random() / 2)


def _retryable(response: httpx.Response) -> bool:
    """5xx and 429; and 409 `idempotency_in_progress`: the first request with this call's key is
    still working, and asking again later returns its answer."""
    if response.status_code == 409:
        return b'"idempotency_in_progress"' in response.content
    return response.status_code in RETRY_STATUSES


def _wait(state: RetryCallState) -> float:
    """`backoff` for the attempt that just failed, honouring the answer's Retry-After."""
    outcome = state.outcome
    retry_after = None if outcome.failed else outcome.result().headers.get("Retry-After")
    return backoff(state.attempt_number - 1, retry_after)


def retrying(*, max_retries: int, retry_on: Callable[[httpx.Response], bool]) -> Retrying:
    """The one retry policy: transport errors and answers that `retry_on` accepts are tried
    again, `max_retries` times, with `backoff`. When the retries run out the last answer is
    returned (or the last transport error raised) for the caller to judge."""
    return Retrying(
        stop=stop_after_attempt(max_retries + 1),
        wait=_wait,
        retry=retry_if_exception_type(httpx.TransportError) | retry_if_result(retry_on),
        retry_error_callback=lambda state: state.outcome.result(),
    )


def send_with_retries(
    send: Callable[[], httpx.Response], *, max_retries: int, what: str, hint: str = ""
) -> httpx.Response:
    try:
        return retrying(max_retries=max_retries, retry_on=_retryable)(send)
    except httpx.TransportError as exc:
        raise ConnectionFailed(
            0, "connection_failed", f"Could not reach {what} ({exc}){hint}"
        ) from exc


@cache
def tls_context() -> ssl.SSLContext:
    """One TLS context for every client this process opens (httpx's default: certifi's CAs, or
    SSL_CERT_FILE / SSL_CERT_DIR): each new one loads the CA bundle again, ~20 ms of CPU."""
    return httpx.create_ssl_context()


class ApiTransport:
    """The `/v1` API: JSON in and out, errors raised as typed `VeriAPIError`s."""

    def __init__(self, *, base_url: str, api_key: str | None, timeout: float, max_retries: int):
        headers = {"User-Agent": "veri-sdk/0.1"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self.base_url, self.max_retries, self.api_key = base_url, max_retries, api_key
        self.http = httpx.Client(
            base_url=f"{base_url}/v1",
            headers=headers,
            timeout=timeout,
            limits=httpx.Limits(max_connections=32, max_keepalive_connections=32),
            verify=tls_context(),
        )

    def request(self, method: str, path: str, *, json=None, params=None, files=None, data=None):
        return self.request_with_status(
            method, path, json=json, params=params, files=files, data=data
        )[0]

    def request_with_status(
        self, method: str, path: str, *, json=None, params=None, files=None, data=None
    ) -> tuple:
        """The answer's body and HTTP status (201 created, 200 an existing object returned)."""
        if not self.api_key:
            raise AuthenticationError(0, "missing_api_key", f"No API key: {LOGIN_HINT}.")
        headers = {"Idempotency-Key": str(uuid.uuid4())} if method == "POST" else {}
        response = send_with_retries(
            lambda: self.http.request(
                method, path, json=json, params=params, files=files, data=data, headers=headers
            ),
            max_retries=self.max_retries,
            what=self.base_url,
            hint=f". Is the API server running there? If it is elsewhere, {LOGIN_HINT}.",
        )
        if response.status_code >= 400:
            try:
                body = response.json()
            except ValueError:
                body = None
            raise error_from_body(response.status_code, body)
        if not response.content:
            return None, response.status_code
        if response.headers.get("content-type", "").startswith("application/json"):
            return response.json(), response.status_code
        return response.text, response.status_code

    def paginate(self, path: str, params: dict | None = None) -> Iterator[dict]:
        params = dict(params or {}, limit=200)
        while True:
            page = self.request("GET", path, params=params)
            yield from page["data"]
            if not page.get("next_cursor"):
                return
            params["cursor"] = page["next_cursor"]


class StorageTransport:
    """Presigned object-store URLs: no API key is ever sent to the store."""

    def __init__(self, *, timeout: float, max_retries: int):
        self.max_retries = max_retries
        self.http = httpx.Client(
            timeout=timeout,
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
            verify=tls_context(),
        )

    def put(
        self,
        url: str,
        *,
        length: int,
        body: Callable[[], Iterator[bytes]],
        headers: dict[str, str] | None = None,
    ) -> str:
        """PUT `length` bytes from `body()` (called again on each retry); returns the ETag."""
        headers = {
            **(headers or {}),
            "Content-Length": str(length),
            "Content-Type": "application/octet-stream",
        }
        response = send_with_retries(
            lambda: self.http.put(url, content=body(), headers=headers),
            max_retries=self.max_retries,
            what="the object store",
        )
        if response.status_code == 412 and headers.get("If-None-Match") == "*":
            # A create-only URL whose object is already there: an earlier attempt of this PUT
            # arrived but its answer was lost. The store held those bytes to the upload's signed
            # sha256, and completing the upload checks the size.
            return response.headers.get("ETag", "").strip('"')
        if response.status_code >= 300:
            try:
                reason = response.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                reason = " ".join(response.text.split())[:200]
            raise ConnectionFailed(
                response.status_code,
                "storage_error",
                f"the object store refused the upload (HTTP {response.status_code}): {reason}",
            )
        return response.headers.get("ETag", "").strip('"')

    def download(self, url: str, target: Path) -> tuple[int, str]:
        """Stream `url` into `target` (replaced whole, never left half-written); returns the
        size and sha256 of what arrived. Retried like every call."""
        partial = target.with_name(f".{target.name}.part")

        def once() -> httpx.Response | tuple[int, str]:
            """The refusing answer, or what arrived (size, sha256) once it is in `partial`."""
            digest, size = hashlib.sha256(), 0
            with self.http.stream("GET", url) as response:
                if response.status_code >= 300:
                    return response
                with partial.open("wb") as out:
                    for chunk in response.iter_bytes(1024 * 1024):
                        out.write(chunk)
                        digest.update(chunk)
                        size += len(chunk)
            return size, digest.hexdigest()

        def refused(answer: httpx.Response | tuple[int, str]) -> bool:
            return isinstance(answer, httpx.Response) and answer.status_code in RETRY_STATUSES

        try:
            answer = retrying(max_retries=self.max_retries, retry_on=refused)(once)
        except httpx.TransportError as exc:
            raise ConnectionFailed(
                0, "connection_failed", f"Could not reach the object store: {exc}"
            ) from exc
        if isinstance(answer, httpx.Response):
            raise ConnectionFailed(
                answer.status_code,
                "storage_error",
                f"the object store refused the download (HTTP {answer.status_code})",
            )
        os.replace(partial, target)
        return answer

    def get(self, url: str) -> bytes:
        response = send_with_retries(
            lambda: self.http.get(url), max_retries=self.max_retries, what="the object store"
        )
        if response.status_code >= 300:
            raise ConnectionFailed(
                response.status_code,
                "storage_error",
                f"the object store refused the download (HTTP {response.status_code})",
            )
        return response.content
