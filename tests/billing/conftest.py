from tests.training.conftest import dataset, submit  # noqa: F401 - the training fixtures, shared
