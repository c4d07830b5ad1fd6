"""The progress a job's page and the jobs list show: the ETA from the recent step rate (a pure
estimate, robust to a restart's pause and a resume's jump), the total from max_steps or the
epochs, and money with one number of decimals."""

from datetime import UTC, datetime, timedelta

import pytest

from dashboard.progress import duration, eta_seconds, seconds_per_step, total_steps
from dashboard.templatetags.dashboard import money
from training.models import TrainingJob

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def steady(first: int, last: int, seconds: float, start: datetime = T0) -> list[tuple]:
    """Steps `first`..`last`, one every `seconds`, from `start`."""
    return [(s, start + timedelta(seconds=(s - first) * seconds)) for s in range(first, last + 1)]


def test_a_steady_run_finishes_at_its_step_rate():
    points = steady(1, 20, 2.0)
    assert seconds_per_step(points) == pytest.approx(2.0)
    now = points[-1][1]
    assert eta_seconds(points=points, total=100, now=now) == pytest.approx(80 * 2.0)
    # Time since the newest point is already spent; at the total there is nothing left.
    assert eta_seconds(points=points, total=100, now=now + timedelta(seconds=10)) == (
        pytest.approx(150.0)
    )
    assert eta_seconds(points=points, total=20, now=now) == 0


def test_the_estimate_follows_the_recent_rate_not_the_average_since_the_start():
    # Slow first steps (compiling, warming up) are outside the window the page reads.
    fast = steady(11, 30, 0.5, start=T0 + timedelta(seconds=60))
    assert seconds_per_step(fast) == pytest.approx(0.5)


def test_a_restart_pause_and_a_resume_jump_do_not_skew_the_rate():
    before = steady(1, 10, 1.0)
    # The machine was lost after step 10: ten minutes until the new one reports step 11.
    after = steady(11, 20, 1.0, start=before[-1][1] + timedelta(minutes=10))
    assert seconds_per_step(before + after) == pytest.approx(1.0)
    # A resumed run starts at its checkpoint's step: 40 steps "done" in one second.
    resumed = steady(50, 60, 1.0, start=after[-1][1] + timedelta(seconds=1))
    assert seconds_per_step(before + after + resumed) == pytest.approx(1.0)


def test_points_shipped_together_count_as_one_arrival():
    # The worker ships its points about every second: three steps a second, arriving together.
    points = [(s, T0 + timedelta(seconds=(s - 1) // 3)) for s in range(1, 31)]
    assert seconds_per_step(points) == pytest.approx(1 / 3)


def test_no_rate_without_two_arrivals_and_no_eta_without_a_total():
    assert seconds_per_step([]) is None
    assert seconds_per_step([(5, T0)]) is None
    assert seconds_per_step([(5, T0), (6, T0)]) is None
    assert eta_seconds(points=steady(1, 5, 1.0), total=None, now=T0) is None


def test_the_total_is_max_steps_or_estimated_from_the_epochs():
    job = TrainingJob(hyperparameters={"max_steps": 60})
    assert total_steps(job) == (60, False)
    # No max_steps: the trainer's epoch (0.25 at step 3 of one epoch) gives 12 steps.
    sft = TrainingJob(
        hyperparameters={"epochs": 1}, last_step=3, metrics_summary={"last": {"epoch": 0.25}}
    )
    assert total_steps(sft) == (12, True)
    assert total_steps(TrainingJob(hyperparameters={"epochs": 2})) == (None, False)


def test_durations_and_money_are_written_one_way():
    assert [duration(s) for s in (None, 4.6, 185, 7440)] == ["—", "5s", "3m 05s", "2h 04m"]
    # Four decimals everywhere on the dashboard: a fraction of a cent shows, columns line up.
    assert [money(m) for m in (None, 0, 1_234, 12_500_000, -50)] == [
        "—",
        "0.0000 USD",
        "0.0012 USD",
        "12.5000 USD",
        "-0.0001 USD",
    ]
