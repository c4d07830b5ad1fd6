"""The Veri Python SDK: `from veri_sdk import Client`."""

from veri_sdk.client import Client
from veri_sdk.errors import (
    AuthenticationError,
    BadRequestError,
    ConflictError,
    ConnectionFailed,
    NotFoundError,
    PaymentRequiredError,
    VeriAPIError,
)
from veri_sdk.rewards import reward_function
from veri_sdk.volumes import UploadFailed

__all__ = [
    "AuthenticationError",
    "BadRequestError",
    "Client",
    "ConflictError",
    "ConnectionFailed",
    "NotFoundError",
    "PaymentRequiredError",
    "UploadFailed",
    "VeriAPIError",
    "reward_function",
]
