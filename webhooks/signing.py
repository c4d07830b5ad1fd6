"""Signing secrets in Standard Webhooks' form (`whsec_` + base64 of 24 random bytes), sealed at
rest, and the three headers a delivery is signed with, as OpenAI signs its own webhooks (so the
`openai` client's `webhooks.unwrap` and the `standardwebhooks` library both verify them)."""

import base64
import hashlib
import secrets
from datetime import datetime

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.conf import settings
from standardwebhooks.webhooks import Webhook

SECRET_BYTES = 24
NONCE_BYTES = 12


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def hint(secret: str) -> str:
    """What lists show of a secret: enough to tell two apart, too little to sign with."""
    return f"whsec_…{secret[-4:]}"


def _cipher() -> AESGCM:
    # Derived from SECRET_KEY: rotating SECRET_KEY means rotating every endpoint's secret.
    return AESGCM(hashlib.sha256(b"veri-webhook-secret" + settings.SECRET_KEY.encode()).digest())


def seal(secret: str) -> str:
    nonce = secrets.token_bytes(NONCE_BYTES)
    sealed = nonce + _cipher().encrypt(nonce, secret.encode(), b"webhook-secret")
    return base64.b64encode(sealed).decode()


def unseal(sealed: str) -> str:
    raw = base64.b64decode(sealed)
    try:
        return _cipher().decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], b"webhook-secret").decode()
    except InvalidTag:
        raise ValueError("This secret was sealed under another SECRET_KEY.") from None


def signed_headers(*, message_id: str, body: str, at: datetime, secrets_: list[str]) -> dict:
    """`webhook-id`, `webhook-timestamp` and `webhook-signature` (one `v1,…` per secret, space
    separated: a receiver still on the previous secret verifies too)."""
    signatures = " ".join(Webhook(s).sign(message_id, at, body) for s in secrets_)
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": signatures,
    }
