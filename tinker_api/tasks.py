"""django-q2 tasks of the Tinker face: take ids, safe to run twice."""

from tinker_api.services import sessions


def launch_model(*, model_pk: int) -> str:
    return sessions.launch_model(model_pk=model_pk)


def stop_machine(*, model_pk: int) -> None:
    sessions.stop_machine(model_pk=model_pk)


def sweep_models() -> None:
    """Every minute: charge running models, end spent, idle and abandoned ones."""
    sessions.sweep()
