import pytest
from django.test import Client

from tests.training.conftest import dataset, submit  # noqa: F401 - the training fixtures, shared
from veri import services

PASSWORD = "a long enough password 1"


def member_of(workspace, email: str):
    user, _ = services.add_owner(workspace=workspace, email=email, password=PASSWORD)
    return user


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def owner(billed):
    return member_of(billed, "owner@acme.test")


@pytest.fixture
def browser(owner) -> Client:
    """The owner of `acme`, signed in to the dashboard."""
    return signed_in(owner)
