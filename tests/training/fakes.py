"""A provider we do not own, faked at its adapter boundary: each zone's launch outcome, instance
states and terminations are set and recorded by the test."""

import threading
import time

from providers.base import InstanceState, LaunchSpec, ProviderAdapter


class FakeCloud(ProviderAdapter):
    name = "aws"

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.outcomes: dict[str, Exception] = {}  # zone -> what launch raises there
        self.launch_delay = 0.0
        self.on_launch = None  # called as a launch starts, e.g. to run a watchdog meanwhile
        self.after_launch = None  # called once the machine exists, e.g. to kill the task there
        self.tags: dict[str, str] = {}  # instance id -> the job id it was tagged with
        self.states_error: Exception | None = None  # what a failing status poll raises
        self.launched: list[LaunchSpec] = []
        self.terminated: list[str] = []
        self.states_by_id: dict[str, InstanceState] = {}
        self.state_calls = 0
        self.lock = threading.Lock()

    def is_configured(self) -> bool:
        return True

    def launch(self, spec: LaunchSpec) -> str:
        if spec.zone in self.outcomes:
            raise self.outcomes[spec.zone]
        if self.on_launch:
            self.on_launch()
        time.sleep(self.launch_delay)
        with self.lock:
            self.launched.append(spec)
            instance_id = f"i-{len(self.launched):04d}"
        self.states_by_id[instance_id] = InstanceState(alive=True)
        self.tags[instance_id] = spec.job_id
        if self.after_launch:
            self.after_launch()
        return instance_id

    def tagged_instances(self) -> dict[str, str]:
        return {i: job for i, job in self.tags.items() if self.states_by_id[i].alive}

    def states(self, instance_ids: list[str]) -> dict[str, InstanceState]:
        self.state_calls += 1
        if self.states_error:
            raise self.states_error
        return {i: self.states_by_id.get(i, InstanceState(alive=False)) for i in instance_ids}

    def terminate(self, instance_id: str) -> None:
        self.terminated.append(instance_id)
        self.states_by_id[instance_id] = InstanceState(alive=False)


class OtherFakeCloud(FakeCloud):
    """A second provider we do not own, for jobs that move between providers."""

    name = "vast"
