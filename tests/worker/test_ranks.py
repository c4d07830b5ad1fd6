"""The multi-GPU pieces that need no training: the hardware check across ranks (gloo on CPU),
a missing device, and the runner refusing to start training on hardware that failed it."""

import os

import pytest

from worker import sandbox
from worker.errors import JobFailure
from worker.runner import Runner, _parse_event, check_hardware
from worker.train import classify


def test_the_check_passes_on_two_cpu_ranks_linked_by_gloo():
    assert check_hardware("cpu", 2) is None


def test_missing_gpus_fail_the_check_on_every_rank():
    found = check_hardware("cuda", 2)  # this machine has none
    assert (found.code, found.message) == (
        "hardware_error",
        "rank 0: 2 GPUs expected on this machine, 0 present; "
        "rank 1: 2 GPUs expected on this machine, 0 present",
    )


def test_gpus_the_installed_torch_cannot_use_are_the_platforms_provisioning_error(
    tmp_path, monkeypatch
):
    """The driver lists two GPUs but torch (here the CPU build) sees none: the bootstrap
    installed the wrong torch for this machine, which is the platform's to pay for."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text('#!/bin/sh\nprintf "550.54.15\\n550.54.15\\n"\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    found = check_hardware("cuda", 2)
    assert found.code == "provisioning_error"
    assert "rank 0: torch 2.13.0+cpu (built for CUDA none) sees 0 of the 2 GPUs" in found.message
    assert "(driver 550.54.15): the installed torch does not match" in found.message


def offline_runner(tmp_path) -> Runner:
    """A runner whose control plane is unreachable (nothing here may call it)."""
    return Runner(
        job_id="job_x",
        api_url="http://127.0.0.1:9",
        token="t",
        work_dir=tmp_path,
        mount_root=tmp_path,
    )


def test_a_failed_check_is_a_hardware_error_before_any_customer_code(tmp_path):
    runner = offline_runner(tmp_path)
    phases = []
    runner.enter_phase = phases.append  # what the control plane would be told
    job = {"gpu_type": "L4-24GB", "gpu_count": 2, "reward_source": "raise SystemExit(3)"}
    with pytest.raises(JobFailure) as failed:
        runner.train(job)
    assert failed.value.code == "hardware_error"
    assert "0 present" in failed.value.message
    assert runner.ranks == []  # no training process was started
    assert phases == ["hardware"]  # the fault is reported from the phase whose check found it


def test_collective_faults_are_distributed_errors_on_several_ranks(monkeypatch):
    fault = RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer")
    assert classify(fault)[0] == "training_error"  # one process: no peers to lose
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert classify(fault)[0] == "distributed_error"
    assert classify(ValueError("bad reward"))[0] == "training_error"


def test_a_lost_rank_is_named_and_the_rank_left_waiting_is_stopped(tmp_path, monkeypatch):
    import subprocess
    import sys

    from worker import runner

    monkeypatch.setattr(runner, "LOST_RANK_GRACE_SECONDS", 0.5)
    waiting = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dying = subprocess.Popen([sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"])
    work = Runner(
        job_id="job_x",
        api_url="http://127.0.0.1:9",
        token="t",
        work_dir=tmp_path,
        mount_root=tmp_path,
    )
    work.ranks, work.last_step = [waiting, dying], 7
    work._watch_ranks()
    assert waiting.wait(timeout=5) == -9  # stopped, not left waiting for ever
    failure = work._failure({}, [waiting.returncode, dying.returncode])
    assert (failure.code, failure.message) == (
        "distributed_error",
        "rank 1 of 2 was killed by signal 9 while the others trained (last step 7); the others "
        "were stopped",
    )


@pytest.mark.parametrize(
    "raised",
    [
        JobFailure("volume_sync_incomplete", "forged"),  # raised
        SystemExit(1),  # exited with, chained below
        RuntimeError("wrapped"),  # raised from a forged platform fault
    ],
)
def test_nothing_raised_in_the_training_process_is_a_platform_fault(raised):
    if not isinstance(raised, JobFailure):
        raised.__cause__ = JobFailure("hardware_error", "forged")
    code, _ = classify(raised)
    assert code == "training_error"


def test_the_runner_takes_no_platform_code_from_the_training_process(tmp_path):
    runner = offline_runner(tmp_path)
    forged = {"error": {"code": "upload_failed", "message": "forged"}}
    failure = runner._failure(forged, [1])
    assert failure.code == "training_error" and "upload_failed" in failure.message
    honest = {"error": {"code": "oom", "message": "CUDA out of memory"}}
    assert runner._failure(honest, [1]).code == "oom"
    garbage = _parse_event('{"event": "checkpoint", "step": "../../etc"}')
    assert (garbage["event"], garbage["code"]) == ("error", "training_error")


def test_a_sandbox_the_machine_refuses_is_a_hardware_error_before_any_customer_code(
    tmp_path, monkeypatch
):
    """A machine whose kernel or container refuses the sandbox (Docker's default seccomp
    profile refuses the user namespace bubblewrap needs) fails the job as the platform's fault,
    never as the customer's training error. Without root the worker does not sandbox, and
    training starts as a plain child (nothing to refuse)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "bwrap").write_text(
        "#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n"
    )
    (fake / "bwrap").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    runner = offline_runner(tmp_path)
    phases = []
    runner.enter_phase = phases.append
    runner.home.mkdir(parents=True)
    problem = runner.sandbox_problem({"gpu_type": "cpu", "gpu_count": 1})
    if not sandbox.isolated():
        assert problem is None
        return
    assert "No permissions to create new namespace" in problem
    with pytest.raises(JobFailure) as failed:
        runner.train({"gpu_type": "cpu", "gpu_count": 1, "reward_source": ""})
    assert failed.value.code == "hardware_error"
    assert "the sandbox for customer code cannot start here" in failed.value.message
    assert phases == ["hardware"]  # the training phase, customer code's, never began
