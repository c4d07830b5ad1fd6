"""AES-GCM sealing with keys derived from SECRET_KEY, one key per purpose: what is sealed for
one purpose (a list cursor, a workspace secret) cannot be opened as another."""

import hashlib
import secrets

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.conf import settings

NONCE_BYTES = 12
TAG_BYTES = 16


def _cipher(purpose: str) -> AESGCM:
    return AESGCM(
        hashlib.sha256(f"veri-{purpose}-aead".encode() + settings.SECRET_KEY.encode()).digest()
    )


def seal(plain: bytes, *, purpose: str, context: bytes | None = None) -> bytes:
    """`plain` encrypted and authenticated, with a fresh nonce in front. `context` is bound to
    it without being stored: opening needs the same one (a row's owner, say)."""
    nonce = secrets.token_bytes(NONCE_BYTES)
    return nonce + _cipher(purpose).encrypt(nonce, plain, context)


def unseal(sealed: bytes, *, purpose: str, context: bytes | None = None) -> bytes:
    """What `seal` sealed for this purpose and context; ValueError for anything else."""
    if len(sealed) <= NONCE_BYTES + TAG_BYTES:  # a nonce, at least one byte, the tag
        raise ValueError("not sealed by us")
    try:
        return _cipher(purpose).decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], context)
    except InvalidTag:
        raise ValueError("not sealed by us") from None
