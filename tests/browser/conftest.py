import pytest

from tests.training.conftest import dataset, submit  # noqa: F401 - the training fixtures, shared


@pytest.fixture(autouse=True)
def allow_database_beside_playwright(monkeypatch):
    """Playwright's sync API keeps an event loop in the test's thread, so Django would refuse
    the test's own database calls; the live server answers the browser from its own thread."""
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
