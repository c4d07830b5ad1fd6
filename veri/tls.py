"""The TLS context of the control plane's outbound HTTPS (GPU providers' APIs, webhook deliveries,
replicas): made once per process. httpx makes one for every client it opens unless given one, and
loading the CA bundle into it costs ~20 ms of CPU: per provider call, delivery or inference
request."""

import ssl
from functools import cache

import httpx


@cache
def tls_context(*, trust_env: bool = True) -> ssl.SSLContext:
    """httpx's own default context (certifi's CAs; SSL_CERT_FILE or SSL_CERT_DIR with
    `trust_env`), shared: a context is safe to use from many threads."""
    return httpx.create_ssl_context(trust_env=trust_env)
