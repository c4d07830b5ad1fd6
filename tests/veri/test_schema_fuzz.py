"""A property-based fuzzer over every `/v1` operation, customer and worker, driven by the schema
the API serves: with real ids (so requests get past 404), with generated ones, and with bodies
that break the schema. No answer may be a 5xx, and every answer must match the schema."""

import contextlib
import json

import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections, transaction
from django.test import override_settings
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hypothesis_settings
from hypothesis.errors import Unsatisfiable
from rest_framework.test import APIClient
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from serving.models import Evaluation
from serving.services import replicas as serving_replicas
from serving.services.deployments import Shape, create_deployment
from serving.services.evaluations import create_evaluation
from tests.conftest import fill_volume
from tests.training.conftest import GRPO_ROWS, REWARD, drive
from tinker_api.models import TinkerOperation
from tinker_api.services import keys as tinker_keys
from tinker_api.services import sessions as tinker_sessions
from training.api import EXAMPLE_DATASET_ID
from training.models import Checkpoint, Dataset, TrainingJob
from training.services import jobs
from training.services.worker import mint_job_token
from veri import services as veri_services
from volumes import services as volume_services
from volumes.models import Upload
from webhooks import services as webhook_services

pytestmark = pytest.mark.django_db
EXAMPLES = 20  # per operation and mode: ~2,000 requests in all, in-process


@pytest.fixture(scope="module")
def served_schema(django_db_setup, django_db_blocker):
    """What `/v1/schema` serves, as the fuzzer reads it: made once for the module's operations
    (drf-spectacular takes half a second of CPU to build it, and no test changes it)."""
    with django_db_blocker.unblock():
        served = APIClient().get("/v1/schema", {"format": "json"})
    return schemathesis.openapi.from_dict(json.loads(served.content))


def operations() -> list[str]:
    from drf_spectacular.generators import SchemaGenerator

    paths = SchemaGenerator().get_schema(request=None, public=True)["paths"]
    return [f"{method.upper()} {path}" for path, item in paths.items() for method in item]


@pytest.fixture
def wsgi_app(served_schema):
    """Django's own WSGI handler, in this test's transaction: the hooks that would close the
    connection mid-transaction are off while the fuzzer runs (as in Django's test client)."""
    for signal in (request_started, request_finished):
        signal.disconnect(close_old_connections)
    yield WSGIHandler()
    for signal in (request_started, request_finished):
        signal.connect(close_old_connections)


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker, tmp_path_factory):
    """The world, made once per module (0.2 s each, and ~85 operations): in a transaction
    rolled back at the module's end, each test's own transaction a savepoint within it."""
    store = tmp_path_factory.mktemp("fuzz") / "store"
    with (
        django_db_blocker.unblock(),
        override_settings(
            VERI_STORE=f"file://{store}",
            VERI_PROVIDER_ADAPTERS={
                "local": "providers.local.LocalProvider",
                "aws": "tests.training.fakes.FakeCloud",
            },
            VERI_DEFAULT_PROVIDER="local",  # what the schema's submit example runs on
            # A Tinker worker's poll for work is held this long when there is none, looking
            # every hundredth of a second: every fuzzed call of it would wait the default 20 s.
            VERI_TINKER_WAIT_SECONDS=0.02,
            VERI_TINKER_POLL_INTERVAL_SECONDS=0.01,
        ),
        transaction.atomic(),
    ):
        yield World()
        transaction.set_rollback(True)


class World:
    """Real objects for the fuzzer's requests: a volume with a file and a pending upload, a
    dataset, a job with a checkpoint, and for worker calls a live job, replica and Tinker model
    with their tokens. Made once: what each request changes (a `complete` or a `failed` report
    ends a job, replica or model) is rolled back after it (`rolled_back`)."""

    def __init__(self):
        self.workspace, self.api_key = veri_services.create_workspace(name="fuzz")
        from billing.services import open_billing_account

        open_billing_account(workspace=self.workspace, credit_micros=100_000_000)
        self.volume = fill_volume(
            self.workspace, "corpus", {"train.jsonl": _jsonl(), "models/m/config.json": b"{}"}
        )
        volume_services.start_uploads(
            volume=self.volume, files=[volume_services.FileToUpload(path="new.txt", size=3)]
        )
        self.upload_id = Upload.objects.get(volume=self.volume, status="pending").public_id
        self.dataset = _dataset(self.workspace)
        self.job = self._job_with_checkpoint()
        self.deployment = create_deployment(
            workspace=self.workspace,
            base_model="volume://corpus/models/m",
            adapters=[],
            shape=Shape(),
        )
        self.evaluation = _evaluation(self.workspace, self.deployment.base_model)
        self.endpoint = webhook_services.create_endpoint(
            workspace=self.workspace, url="https://example.com/hook"
        )[0]
        self.tinker_key = tinker_keys.create_key(workspace=self.workspace)[0]
        self.worker_job = drive(self.new_job(), "provisioning", "configuring")
        self.worker_job_token = mint_job_token(job=self.worker_job)
        self.replica = serving_replicas.start_replica(deployment=self.deployment)
        self.replica_token = serving_replicas.mint_token(replica=self.replica)
        self.tinker_creation = self.new_tinker_model()
        self.tinker_token = tinker_sessions.mint_token(model=self.tinker_creation.model)

    @contextlib.contextmanager
    def rolled_back(self):
        """A request's changes, undone after it: the next request finds the world as it was
        made, its volume, upload, jobs, replica and model still there."""
        with transaction.atomic():
            yield
            transaction.set_rollback(True)

    def new_tinker_model(self):
        """A live Tinker model (a `failed` report ends it) with its creation running."""
        session = tinker_sessions.create_session(
            workspace=self.workspace, sdk_version="", tags=[], user_metadata={}
        )
        creation = tinker_sessions.create_model(
            session=session,
            model_seq_id=0,
            base_model="volume://corpus/models/m",
            lora={"rank": 4},
            user_metadata={},
        )
        TinkerOperation.objects.filter(pk=creation.pk).update(status="running")
        return creation

    def _job_with_checkpoint(self) -> TrainingJob:
        job = self.new_job()
        Checkpoint.objects.create(
            workspace=self.workspace, job=job, step=1, files=[{"path": "a.bin", "size": 1}]
        )
        return job

    def new_job(self) -> TrainingJob:
        submission = jobs.Submission(
            base_model="volume://corpus/models/m",
            dataset_id=self.dataset.public_id,
            method="grpo",
            reward_source=REWARD,
            provider="aws",
            gpu_type="L4-24GB",
        )
        return jobs.submit_job(workspace=self.workspace, submission=submission)

    def path_parameters(self) -> dict:
        return {
            "volume_id": self.volume.name,
            "upload_id": self.upload_id,
            "dataset_id": self.dataset.public_id,
            "job_id": self.job.public_id,
            "name": "WANDB_API_KEY",  # a secret's
            "endpoint_id": self.endpoint.public_id,
            "deployment_id": self.deployment.public_id,
            "evaluation_id": self.evaluation.public_id,
            "replica_id": "",  # the live replica's, set by `authorize`
            "key_id": self.tinker_key.public_id,
            "model_id": "",  # the live Tinker model's, set by `authorize`
            "request_id": "",
        }

    def authorize(self, case) -> None:
        """The right credential for the operation (and the world's dataset in place of the one
        the schema's submit example names)."""
        if isinstance(case.body, dict) and case.body.get("dataset_id") == EXAMPLE_DATASET_ID:
            case.body = dict(case.body, dataset_id=self.dataset.public_id)
        ids, token = {}, self.api_key
        if case.path.startswith("/v1/worker/replicas/"):
            ids, token = {"replica_id": self.replica.public_id}, self.replica_token
        elif case.path.startswith("/v1/worker/tinker_models/"):
            model, request_id = self.tinker_creation.model, self.tinker_creation.request_id
            ids, token = {"model_id": model.model_id, "request_id": request_id}, self.tinker_token
        elif case.path.startswith("/v1/worker/"):
            ids, token = {"job_id": self.worker_job.public_id}, self.worker_job_token
        if ids:
            case.path_parameters = dict(case.path_parameters or {}, **ids)
        case.headers = dict(case.headers or {}, Authorization=f"Bearer {token}")


def _jsonl() -> bytes:
    return "".join(json.dumps(row) + "\n" for row in GRPO_ROWS).encode()


def _evaluation(workspace, model: str) -> Evaluation:
    """Of the served model against itself, on an uploaded file (queued: nothing commits)."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    from training.services.datasets import create_uploaded_dataset

    upload = SimpleUploadedFile("held_out.jsonl", _jsonl())
    dataset, _ = create_uploaded_dataset(workspace=workspace, file=upload)
    grader = {"type": "string_check", "name": "g", "input": "{{ sample.output_text }}"}
    grader |= {"reference": "{{ item.answer }}", "operation": "like"}
    return create_evaluation(
        workspace=workspace,
        model=model,
        baseline=model,
        file=dataset.public_id,
        grader=grader,
        max_tokens=16,
    )


def _dataset(workspace) -> Dataset:
    from training.services.datasets import create_volume_dataset

    return create_volume_dataset(workspace=workspace, volume="corpus", path="train.jsonl")


@pytest.mark.parametrize("operation", operations())
def test_no_operation_answers_5xx_or_off_schema(operation, served_schema, wsgi_app, world):
    method, path = operation.split(" ", 1)
    api_operation = served_schema[path][method]
    path_names = {p.name for p in api_operation.path_parameters}

    def fuzz(strategy, *, examples: int, real_ids: bool) -> None:
        @hypothesis_settings(
            max_examples=examples,
            deadline=None,
            database=None,
            derandomize=True,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=strategy)
        def check(case):
            if real_ids:
                known = world.path_parameters()
                case.path_parameters = {k: known[k] for k in path_names}
            with world.rolled_back():
                world.authorize(case)
                response = case.call(app=wsgi_app)
            case.validate_response(
                response, checks=[not_a_server_error, response_schema_conformance]
            )

        check()

    for strategy in api_operation.get_strategies_from_examples():  # the schema's own examples
        fuzz(strategy, examples=1, real_ids=True)
    for mode, real_ids in [
        (GenerationMode.POSITIVE, True),
        (GenerationMode.NEGATIVE, True),
        (GenerationMode.POSITIVE, False),  # generated ids: 404s, never 5xx
    ]:
        try:
            fuzz(
                api_operation.as_strategy(generation_mode=mode),
                examples=EXAMPLES,
                real_ids=real_ids,
            )
        except Unsatisfiable:
            # Only an operation that takes any body (Stripe's webhook) has no invalid one.
            assert mode == GenerationMode.NEGATIVE, operation
