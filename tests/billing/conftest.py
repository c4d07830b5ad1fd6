from tests.sdk.conftest import cli  # noqa: F401 - the live-server CLI, for the clients' quotes
from tests.sdk.test_training_cli import account  # noqa: F401 - its workspace, with money
from tests.training.conftest import dataset, submit  # noqa: F401 - the training fixtures, shared
