import pytest

from tests.sdk.conftest import cli  # noqa: F401 - the live-server CLI, for the clients' quotes
from tests.sdk.test_training_cli import account  # noqa: F401 - its workspace, with money
from tests.stripe_fake import FakeStripe
from tests.training.conftest import dataset, submit  # noqa: F401 - the training fixtures, shared


@pytest.fixture
def stripe_api(stripe_api):
    """The project's fake Stripe, with every object it held before forgotten."""
    FakeStripe.reset()
    return stripe_api
