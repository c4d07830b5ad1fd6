"""A job's page through Django's test client: the Samples table's JSON read (grouped by step and
prompt, paged, filtered by step and reward range, sorted by reward) fed by the worker's API, the
configuration table with its defaults marked, and the timeline with each event's step."""

import html

import pytest

from tests.training.test_restarts import running
from tests.training.test_worker_and_jobs_api import upload_checkpoint, w
from training import specs

pytestmark = pytest.mark.django_db

STEPS, PROMPTS, ROLLOUTS = (2, 4, 6), 4, 4


def reward(step: int, prompt: int, rollout: int) -> float:
    """Every rollout's reward different, rising with the step."""
    return (step * 10 + prompt * 4 + rollout) / 100


def sampled_job(submit):
    """A running GRPO job whose worker sent 3 steps × 4 prompts × 4 rollouts through its API."""
    job, worker = running(submit)
    for step in STEPS:
        samples = [
            {
                "step": step,
                "index": prompt * ROLLOUTS + rollout,
                "prompt": f"Prompt {prompt}: write about the letter a",
                "completion": f"completion {step}/{prompt}/{rollout}",
                "reward": reward(step, prompt, rollout),
                "rewards": {"exact": reward(step, prompt, rollout), "short": 0.5},
            }
            for prompt in range(PROMPTS)
            for rollout in range(ROLLOUTS)
        ]
        answer = worker.post(w(job, "samples"), {"samples": samples}, format="json")
        assert answer.status_code == 200, answer.json()
    return job, worker


def test_samples_are_grouped_by_prompt_paged_filtered_and_sorted(browser, submit):
    job, _ = sampled_job(submit)
    read = lambda query="": browser.get(f"/jobs/{job.public_id}/samples.json?{query}").json()  # noqa: E731

    first = read()
    assert (first["total_groups"], first["total_rollouts"], first["pages"]) == (12, 48, 2)
    assert first["steps"] == [2, 4, 6]
    assert len(first["groups"]) == 10
    assert [g["step"] for g in first["groups"]][:5] == [6, 6, 6, 6, 4]  # newest step first
    group = first["groups"][0]
    assert len(group["rollouts"]) == ROLLOUTS  # one prompt's four rollouts are one group
    assert {r["completion"].rsplit("/", 1)[0] for r in group["rollouts"]} == {"completion 6/0"}
    assert [r["reward"] for r in group["rollouts"]] == sorted(
        (r["reward"] for r in group["rollouts"]), reverse=True
    )
    assert group["rollouts"][0]["rewards"] == {
        "exact": group["rollouts"][0]["reward"],
        "short": 0.5,
    }
    second = read("page=2")
    assert (second["page"], len(second["groups"])) == (2, 2)
    assert {g["step"] for g in second["groups"]} == {2}

    by_step = read("step=4")
    assert {g["step"] for g in by_step["groups"]} == {4}
    assert (by_step["total_groups"], by_step["pages"]) == (4, 1)

    ranged = read("min_reward=0.5&max_reward=0.6")
    rewards = [r["reward"] for g in ranged["groups"] for r in g["rollouts"]]
    assert rewards and all(0.5 <= r <= 0.6 for r in rewards)
    assert ranged["total_rollouts"] == len(rewards) == 7  # 0.50 to 0.55 at step 4, 0.60 at 6

    best = read("sort=-reward")["groups"]
    assert [g["mean_reward"] for g in best] == sorted(
        (g["mean_reward"] for g in best), reverse=True
    )
    assert best[0]["step"] == 6 and best[0]["prompt"].startswith("Prompt 3")
    worst = read("sort=reward")["groups"]
    assert worst[0]["step"] == 2 and worst[0]["prompt"].startswith("Prompt 0")

    nothing = read("min_reward=5")
    assert (nothing["groups"], nothing["total_groups"], nothing["pages"]) == ([], 0, 1)
    assert read("min_reward=junk&step=x")["total_groups"] == 12  # a bad filter is no filter


def test_the_page_marks_defaults_and_gives_each_event_its_step(browser, submit):
    job, worker = running(
        submit, hyperparameters={"max_steps": 20, "learning_rate": 0.01}, lora={"r": 8}
    )
    for step in (10, 20):
        upload_checkpoint(worker, job, step)
    page = html.unescape(browser.get(f"/jobs/{job.public_id}/").content.decode())

    config = page[page.index("data-hyperparameters") : page.index("data-lora")]
    default_rate = specs.DEFAULTS["grpo"]["learning_rate"]
    assert (
        f'<td><code>learning_rate</code></td><td>0.01</td><td><span class="sub">{default_rate}'
        in config
    )
    assert '<td><code>seed</code></td><td>42</td><td><span class="badge">default</span>' in config
    lora = page[page.index("data-lora") :]
    assert '<td><code>r</code></td><td>8</td><td><span class="sub">16</span>' in lora
    assert '<td><code>alpha</code></td><td>32</td><td><span class="badge">default</span>' in lora
    assert f'href="/jobs/new/?clone={job.public_id}"' in page
    for name in ("TOML", "CLI", "SDK"):
        assert f'data-copy="{name}"' in page

    timeline = page[page.index("data-timeline") :]
    assert (
        '<strong>checkpoint_saved</strong> <span class="event-step">at step 10</span>' in timeline
    )
    assert (
        '<strong>checkpoint_saved</strong> <span class="event-step">at step 20</span>' in timeline
    )
