"""A Tinker training client's model on a cloud provider: its machine is rented through the
provider (against each provider's fake, as jobs' and replicas' are) at the catalog's GPU type and
price, and booted with the worker's bootstrap, which starts `python -m worker tinker` with the
model's token and no other secret; run as a bare machine's first boot it installs the worker
from the control plane, which then registers and answers the model's creation (or, when nothing
can be installed, ends the model as the platform's provisioning_error, its machine terminated);
the sweeper terminates a Tinker machine no live model owns."""

import concurrent.futures
import json
import shlex
import subprocess
import time
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from billing.models import LedgerEntry
from providers import catalog
from tests.conftest import REPO, fill_volume
from tests.providers.conftest import instances
from tests.providers.test_bootstrap import boot, wheel
from tests.providers.test_serving_bootstrap import aws_script, digitalocean_script
from tests.tinker_api.test_api import new_model, optim, tinker_client, worker
from tests.tinker_api.test_sampling import asample
from tinker_api import tasks
from tinker_api.models import ModelStatus, TinkerModel, TinkerOperation
from tinker_api.services import sessions
from training.services import provisioning

pytestmark = pytest.mark.django_db
TOKENS = ("VERI_JOB_TOKEN", "VERI_REPLICA_TOKEN", "VERI_SERVING_KEY")  # other kinds' secrets


def cloud_model(
    workspace, settings, provider: str, gpu_type: str, files=None, *, train_unembed=False
) -> TinkerModel:
    """A model created by a Tinker client while models run on `provider`'s `gpu_type`, its base
    model the volume folder `models/tiny` of `files` (a stand-in's by default); its LoRA leaves
    the LM head alone unless `train_unembed` (vLLM samples it only then)."""
    settings.VERI_TINKER_PROVIDER = provider
    settings.VERI_TINKER_GPU_TYPE = gpu_type
    settings.VERI_TINKER_WAIT_SECONDS = 0
    files = files or {"tiny/config.json": b"{}", "tiny/model.bin": b"x"}
    fill_volume(workspace, "models", files)
    return new_model(tinker_client(workspace), train_unembed=train_unembed)


def vast_script(fake, request) -> str:
    [body] = fake.calls("PUT", r"/api/v0/asks/\d+/")
    return body["onstart"]


@pytest.mark.parametrize(
    ("provider", "fixture", "gpu_type", "script_of"),
    [
        ("aws", "ec2", "L4-24GB", aws_script),
        ("digitalocean", "digitalocean", "H100-80GB", digitalocean_script),
        ("vast", "vast", "RTX4090-24GB", vast_script),
    ],
)
def test_a_model_on_a_cloud_provider_boots_the_tinker_worker_with_its_token_alone(
    request, billed, settings, provider, fixture, gpu_type, script_of
):
    fake = request.getfixturevalue(fixture)
    if provider == "vast":
        fake.add_offer("RTX 4090", 1, "Virginia, US", 0.3)
    model = cloud_model(billed, settings, provider, gpu_type)
    price = catalog.get_provider(provider).gpu(gpu_type).price_per_gpu_hour_micros
    assert (model.provider, model.gpu_type, model.price_per_hour_micros) == (
        provider,
        gpu_type,
        price,
    )

    assert sessions.launch_model(model_pk=model.pk) == "launched"

    model.refresh_from_db()
    assert model.external_id and model.launched_at is not None  # its uptime bills from here
    script = script_of(fake, request)
    api = settings.VERI_PUBLIC_URL
    worker = shlex.join(
        ["-m", "worker", "tinker", "--model", model.model_id, "--api", api, "--sampler", "vllm"]
    )
    assert f'"$root/venv/bin/python" {worker} ||' in script
    assert f"\njob={shlex.quote(model.model_id)}\n" in script
    assert 'routes="$api/v1/worker/tinker_models/$job"' in script
    # The pinned vLLM, in its own virtualenv, its `vllm` on the worker's PATH: it samples there.
    assert f"engine={settings.VERI_VLLM_REQUIREMENT}\n" in script
    assert 'export PATH="$root/engine/bin:$PATH"' in script
    # The worker's environment: the control plane's URL and the model's token, nothing else.
    env = script.split("<<'VERI_ENV'\n", 1)[1].split("VERI_ENV\n", 1)[0].splitlines()
    names = [line.partition("=")[0] for line in env]
    assert names == ["VERI_API_URL", "VERI_TINKER_TOKEN"], env
    token = env[1].partition("=")[2]
    assert sessions.token_hash(token) == model.token_hash  # the model's own, live token
    assert not any(name in script for name in TOKENS)
    assert 'worker_token="$VERI_TINKER_TOKEN"' in script
    assert subprocess.run(["bash", "-n"], input=script.encode()).returncode == 0


def test_a_model_whose_lora_covers_the_lm_head_samples_with_transformers_on_its_gpu(
    request, ec2, billed, settings
):
    """vLLM cannot load a LoRA of lm_head (Tinker's default `train_unembed=True`): the machine
    gets no vLLM and its worker samples with transformers."""
    model = cloud_model(billed, settings, "aws", "L4-24GB", train_unembed=True)
    assert sessions.launch_model(model_pk=model.pk) == "launched"
    script = aws_script(ec2, request)
    api = settings.VERI_PUBLIC_URL
    worker = shlex.join(["-m", "worker", "tinker", "--model", model.model_id, "--api", api])
    assert f'"$root/venv/bin/python" {worker} ||' in script
    assert "engine=" not in script  # no vLLM installed


def test_a_zone_without_capacity_moves_the_model_to_the_next_and_none_fails_it(
    ec2, ec2_endpoint, billed, settings
):
    ec2.refusals["us-east-1a"] = "InsufficientInstanceCapacity"
    model = cloud_model(billed, settings, "aws", "L4-24GB")
    assert sessions.launch_model(model_pk=model.pk) == "launched"
    [instance] = instances(ec2_endpoint)
    assert instance["Placement"]["AvailabilityZone"] == "us-east-1b"

    # No zone of the region has one: the model fails, the platform's fault, billed nothing.
    for zone in ("us-east-1b", "us-east-1c", "us-east-1d", "us-east-1f"):
        ec2.refusals[zone] = "InsufficientInstanceCapacity"
    model = cloud_model(billed, settings, "aws", "L4-24GB")
    assert sessions.launch_model(model_pk=model.pk) == "provisioning_error"
    model.refresh_from_db()
    assert (model.status, model.error_code) == (ModelStatus.FAILED, "provisioning_error")
    assert "g6.xlarge in us-east-1f" in model.error_message
    assert model.launched_at is None and model.charged_micros == 0
    assert len(instances(ec2_endpoint)) == 1


def test_a_machine_whose_worker_never_starts_ends_its_model_credited(
    ec2, ec2_endpoint, billed, settings
):
    """A bootstrap stuck (or a worker that cannot call back) past VERI_PROVISIONING_TIMEOUT_SECONDS:
    the model ends as the platform's provisioning_timeout, its uptime credited back, its machine
    terminated; a model whose worker asked for its spec in time is left starting."""
    stuck, loading = (cloud_model(billed, settings, "aws", "L4-24GB") for _ in range(2))
    for model in (stuck, loading):
        assert sessions.launch_model(model_pk=model.pk) == "launched"
    launched = timezone.now() - timedelta(seconds=settings.VERI_PROVISIONING_TIMEOUT_SECONDS + 60)
    TinkerModel.objects.update(launched_at=launched)
    loader = worker(loading)  # its worker, with a fresh token of its model
    registered = loader.post(f"{loader.base}/register")
    assert registered.status_code == 200, registered.json()

    tasks.sweep_models()

    stuck.refresh_from_db()
    assert (stuck.status, stuck.error_code) == (ModelStatus.FAILED, "provisioning_timeout")
    assert stuck.charged_micros > 0
    credited = LedgerEntry.objects.filter(
        workspace=billed, kind="refund_credit", idempotency_key__contains=stuck.model_id
    )
    assert credited.get().amount_micros == stuck.charged_micros  # the whole uptime, back
    assert TinkerModel.objects.get(pk=loading.pk).status == ModelStatus.STARTING
    tasks.stop_machine(model_pk=stuck.pk)  # queued by the model's end
    states = {i["InstanceId"]: i["State"]["Name"] for i in instances(ec2_endpoint)}
    assert states[stuck.external_id.split("/")[1]] == "terminated"


def test_the_sweeper_terminates_tinker_machines_no_live_model_owns(
    ec2, ec2_endpoint, billed, settings
):
    """A model that ended before its machine was stopped, and a machine whose model's row is
    gone: both terminated; a live model's machine is left running."""
    live, ended, gone = (cloud_model(billed, settings, "aws", "L4-24GB") for _ in range(3))
    for model in (live, ended, gone):
        assert sessions.launch_model(model_pk=model.pk) == "launched"
        model.refresh_from_db()
    tags = {
        i["InstanceId"]: {t["Key"]: t["Value"] for t in i["Tags"]}["veri:job"]
        for i in instances(ec2_endpoint)
    }
    assert sorted(tags.values()) == sorted(sessions.machine_tag(m.pk) for m in (live, ended, gone))
    TinkerModel.objects.filter(pk=ended.pk).update(status=ModelStatus.ENDED)
    TinkerModel.objects.filter(pk=gone.pk).delete()

    swept = provisioning.sweep_orphans()

    assert sorted(swept) == sorted([ended.external_id, gone.external_id])
    states = {i["InstanceId"]: i["State"]["Name"] for i in instances(ec2_endpoint)}
    assert states[live.external_id.split("/")[1]] == "running"
    assert states[ended.external_id.split("/")[1]] == "terminated"
    assert provisioning.sweep_orphans() == []


def stand_in_worker(folder) -> None:
    """A PEP 503 index holding `veri-stand-in`, whose `python -m worker tinker …` does what the
    Tinker worker does first, with the token it was given: registers, pulls the model's creation
    and answers it, then writes down its arguments, its VERI_ environment, what it got and the
    `vllm` on its PATH."""
    main = """
import json, os, shutil, sys, urllib.request
args = sys.argv[1:]
model, api = args[args.index("--model") + 1], args[args.index("--api") + 1]
token = os.environ["VERI_TINKER_TOKEN"]
def call(path, body):
    request = urllib.request.Request(
        f"{api}/v1/worker/tinker_models/{model}{path}", data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    return json.load(urllib.request.urlopen(request, timeout=60))
spec = call("/register", {})
operation = call("/next", {"after": -1, "wait": 0})["operation"]
call(f"/operations/{operation['request_id']}", {"ok": True, "result": {}})
env = {k: v for k, v in os.environ.items() if k.startswith("VERI_")}
out = os.path.join(os.environ["VERI_WORK_DIR"], "ran.json")
found = {"argv": args, "env": env, "spec": spec, "operation": operation}
json.dump(found | {"vllm": shutil.which("vllm")}, open(out, "w"))
"""
    wheel(folder, "veri-stand-in", {"worker/__init__.py": "", "worker/__main__.py": main})


def vllm_stand_in(folder) -> None:
    """A PEP 503 index holding `vllm-stand-in`, whose `vllm` is tests/serving/vllm_standin.py
    (this machine plays the GPU machine)."""
    stand_in = REPO / "tests" / "serving" / "vllm_standin.py"
    code = (
        f"import runpy\n\ndef main():\n    runpy.run_path({str(stand_in)!r}, run_name='__main__')\n"
    )
    entry = "[console_scripts]\nvllm = vllm_stand_in:main\n"
    wheel(folder, "vllm-stand-in", {"vllm_stand_in.py": code}, entry_points=entry)


@pytest.fixture
def booting(ec2, billed, live_server, settings, local_store_url):
    """A live control plane that a machine on EC2 (moto) calls back; its vLLM is the stand-in
    (an index holding it is the test's to name)."""
    settings.VERI_STORE = local_store_url
    settings.VERI_PUBLIC_URL = live_server.url
    settings.VERI_WORKER_INDEX_URL = ""
    settings.VERI_WORKER_PACKAGE = ""
    settings.VERI_VLLM_REQUIREMENT = "vllm-stand-in==1.0"
    return live_server.url


@pytest.mark.django_db(transaction=True)
def test_a_model_machine_runs_the_worker_from_its_user_data_which_pulls_the_creation(
    request, booting, billed, ec2, settings, tmp_path
):
    """The rendered bootstrap run as a bare machine's first boot, installing from a mirror that
    holds a stand-in worker and vLLM: it starts with the model's token and vLLM on its PATH,
    registers and answers the model's creation, so the model is ready."""
    mirror = tmp_path / "mirror"
    stand_in_worker(mirror)
    vllm_stand_in(mirror)
    settings.VERI_WORKER_INDEX_URL = f"file://{mirror}"
    settings.VERI_WORKER_PACKAGE = "veri-stand-in==1.0"
    model = cloud_model(billed, settings, "aws", "L4-24GB")
    assert sessions.launch_model(model_pk=model.pk) == "launched"

    status, log, root = boot(tmp_path, aws_script(ec2, request), timeout=300)

    assert status == 0, log
    model.refresh_from_db()
    ran = json.loads((root / "work" / "ran.json").read_text())
    assert ran["argv"] == [
        "tinker",
        "--model",
        model.model_id,
        "--api",
        booting,
        "--sampler",
        "vllm",
    ]
    assert ran["vllm"] == str(root / "engine" / "bin" / "vllm")  # in its own virtualenv
    assert ran["spec"]["model_id"] == model.model_id
    assert (ran["operation"]["seq_id"], ran["operation"]["kind"]) == (0, "create_model")
    assert sessions.token_hash(ran["env"]["VERI_TINKER_TOKEN"]) == model.token_hash
    assert not set(TOKENS) & set(ran["env"])
    assert "source=index" in ran["env"]["VERI_BOOTSTRAP"]
    assert model.status == ModelStatus.READY
    assert ran["env"]["VERI_TINKER_TOKEN"] not in log  # the token is never logged


@pytest.mark.django_db(transaction=True)
def test_a_model_machine_whose_bootstrap_fails_ends_as_provisioning_error_and_is_terminated(
    request, booting, billed, ec2, ec2_endpoint, tmp_path
):
    """No wheelhouse stored and no index named: the bootstrap fails at once, says so with the
    model's token, and the model ends as the platform's fault, its machine terminated."""
    model = cloud_model(billed, request.getfixturevalue("settings"), "aws", "L4-24GB")
    assert sessions.launch_model(model_pk=model.pk) == "launched"

    status, log, _ = boot(tmp_path, aws_script(ec2, request), timeout=120)

    assert status == 1, log
    model.refresh_from_db()
    assert (model.status, model.error_code) == (ModelStatus.FAILED, "provisioning_error"), log
    assert "no wheelhouse for this machine" in model.error_message
    tasks.stop_machine(model_pk=model.pk)  # queued by the model's end
    assert instances(ec2_endpoint)[0]["State"]["Name"] == "terminated"


def wait_for(what, deadline_seconds: float):
    """Poll `what()` until it answers something true, or fail after the deadline."""
    deadline = time.monotonic() + deadline_seconds
    while not (answer := what()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.5)
    return answer


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_model_machine_runs_the_real_tinker_worker_until_its_session_ends(
    request, booting, billed, ec2, ec2_endpoint, settings, tiny_model, tmp_path
):
    """The whole life of a model on a rented machine, the machine played by this one (no GPU,
    so the worker trains on the CPU): the bootstrap installs the real worker from the control
    plane's wheelhouse and vLLM (its stand-in) from the index, the worker loads the tiny model
    and answers its creation, an optimizer step and a sample, which vLLM answers; the session
    ends, the worker saves the model's state, exits when told, and the machine is terminated."""
    settings.VERI_TINKER_SESSION_TIMEOUT_SECONDS = 900  # this test sends no heartbeat
    vllm_stand_in(tmp_path / "mirror")
    settings.VERI_WORKER_INDEX_URL = f"file://{tmp_path / 'mirror'}"  # the wheelhouse comes first
    call_command("worker_wheelhouse", "--backend", "cpu", "--torch-index-url", "")
    files = {f"tiny/{p.name}": p.read_bytes() for p in tiny_model.iterdir()}
    model = cloud_model(billed, settings, "aws", "L4-24GB", files)
    settings.VERI_TINKER_WAIT_SECONDS = 1  # cloud_model's 0 would make the worker spin
    assert sessions.launch_model(model_pk=model.pk) == "launched"
    script = aws_script(ec2, request)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        booted = pool.submit(boot, tmp_path, script)
        ready = wait_for(
            lambda: booted.done() or TinkerModel.objects.filter(pk=model.pk, status="ready"), 600
        )
        assert ready is not True, booted.result()[1]  # the machine ended before the model was ready
        step = optim(tinker_client(billed), model, 1).json()["request_id"]
        done = wait_for(lambda: TinkerOperation.objects.filter(request_id=step, status="done"), 300)
        assert done[0].result["metrics"]["grad_norm:mean"] == 0.0  # no gradients yet
        client = tinker_client(billed)
        body = {"model_id": model.model_id, "seq_id": 2, "sampling_session_seq_id": 0}
        saved = client.post("/api/v1/save_weights_for_sampler", body, format="json")
        assert saved.status_code == 200, saved.json()
        sample = asample(client, f"{model.model_id}:sample:2").json()["request_id"]
        done = wait_for(
            lambda: TinkerOperation.objects.filter(request_id=sample, status="done"), 300
        )
        # The stand-in's answer to the prompt [5, 6] (tests/serving/vllm_standin.py, `answer`).
        assert done[0].result["sequences"] == [
            {
                "tokens": [7 + i, 8 + i, 9 + i],
                "logprobs": [-0.25 - i / 2, -0.5 - i / 2, -0.75 - i / 2],
                "stop_reason": "length",
            }
            for i in range(2)
        ]
        sessions.end_session(session=model.session, reason="The client closed its session.")
        status, log, _ = booted.result(timeout=300)

    assert status == 0, log
    model.refresh_from_db()
    assert (model.status, model.error_code) == (ModelStatus.ENDED, "session_ended"), log
    assert "Its state is saved as tinker://" in model.error_message, model.error_message
    assert f"[veri] tinker model {model.model_id} loaded" in log  # the real worker, not a stand-in
    assert "source=wheelhouse" in log and "[veri] worker exited with 0" in log
    tasks.stop_machine(model_pk=model.pk)  # queued by the model's end
    assert instances(ec2_endpoint)[0]["State"]["Name"] == "terminated"
