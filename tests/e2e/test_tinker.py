"""The official `tinker` SDK, unmodified, trains on Veri: its base URL pointed at a live server
with a task cluster and the local provider, a Tinker key the API issued, the tiny model in a
volume. A supervised loop of 20 forward_backward + optim_step steps lowers the loss; an RL loop
(sample, reward, importance_sampling) raises the reward; a request the model cannot run is an
error the client raises."""

import re
from datetime import timedelta

import pytest
import tinker
from tinker import types
from transformers import AutoTokenizer

from billing.models import LedgerEntry
from providers.local import LocalProvider
from tests.conftest import REPO, fill_volume, run_python, wait_for
from tests.e2e.test_training import TINY, platform  # noqa: F401 - a fixture
from tinker_api import tasks
from tinker_api.models import ModelStatus, TinkerModel, TinkerSession

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

LINES = ["the cat sat on the mat.", "a plum is a fruit.", "apples are red or green."]


@pytest.fixture
def tinker_key(api_client, billed) -> str:
    response = api_client.post("/v1/tinker/keys", {"name": "e2e"}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["key"]


@pytest.fixture
def connect(live_server, tinker_key):
    """New ServiceClients of the live server, each closed after the test: a client's heartbeat
    would outlive it, knocking with a key the next test's database no longer has."""
    made = []

    def connect(**kwargs) -> tinker.ServiceClient:
        made.append(tinker.ServiceClient(base_url=live_server.url, api_key=tinker_key, **kwargs))
        return made[-1]

    yield connect
    for service in made:
        service.close("success").result(timeout=60)


@pytest.fixture
def stop_models():
    yield
    for model in TinkerModel.objects.exclude(external_id=""):
        LocalProvider().terminate(model.external_id)


def supervised(tokenizer) -> list[types.Datum]:
    """Each line as next-token prediction, the first token's prediction weighted 0."""
    data = []
    for line in LINES:
        ids = tokenizer(line)["input_ids"] + [tokenizer.eos_token_id]
        weights = [0.0] + [1.0] * (len(ids) - 2)
        data.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(ids[:-1]),
                loss_fn_inputs={"target_tokens": ids[1:], "weights": weights},
            )
        )
    return data


def test_a_supervised_loop_lowers_the_loss(
    platform,  # noqa: F811
    connect,
    tiny_model,
    stop_models,
):
    platform()
    service = connect()
    training = service.create_lora_training_client(base_model=TINY, rank=8, seed=0).result()
    assert training.get_info().lora_rank == 8
    data = supervised(AutoTokenizer.from_pretrained(tiny_model))
    losses = []
    for _ in range(20):
        backward = training.forward_backward(data, "cross_entropy")
        step = training.optim_step(types.AdamParams(learning_rate=2e-2))
        result = backward.result()
        step.result()
        losses.append(result.metrics["loss:sum"])
        [first] = result.loss_fn_outputs[:1]
        assert len(first["logprobs"].tolist()) == len(data[0].model_input.to_ints())
    assert losses[-1] < 0.7 * losses[0], losses
    after = training.forward(data, "cross_entropy").result().metrics["loss:sum"]
    assert after < losses[-1], (after, losses)
    # Past the client's chunk (1,024 data a request) it sends several requests and adds their
    # losses up: 345 copies of the lines cost 345 times what they do.
    many = training.forward(data * 345, "cross_entropy").result()
    assert len(many.loss_fn_outputs) == 345 * len(data) > 1024
    assert many.metrics["loss:sum"] == pytest.approx(345 * after, rel=1e-4)

    # A custom loss, as the client runs one (`forward`, the loss and its gradient here, a linear
    # loss's backward there): the weighted cross-entropy by hand costs what Veri's does, and the
    # step it drives lowers it.
    def weighted_cross_entropy(batch, logprobs):
        pairs = zip(batch, logprobs, strict=True)
        return sum(-(lp * d.loss_fn_inputs["weights"].to_torch()).sum() for d, lp in pairs), {}

    custom = training.forward_backward_custom(data, weighted_cross_entropy)
    training.optim_step(types.AdamParams(learning_rate=2e-2)).result()
    metrics = custom.result().metrics
    assert metrics["loss:sum"] == pytest.approx(after, rel=1e-5)
    assert metrics["surrogate_loss:sum"] == pytest.approx(after, rel=1e-5)
    after = training.forward(data, "cross_entropy").result().metrics["loss:sum"]
    assert after < metrics["loss:sum"]

    # A request the model cannot run (a loss without its inputs) is an error the client
    # raises, not a hang or a 500, and the model goes on.
    with pytest.raises(tinker.RequestFailedError, match=r"dro needs loss_fn_inputs\['logprobs'\]"):
        training.forward_backward(data, "dro").result()
    model = TinkerModel.objects.get()
    assert (model.status, model.base_model) == (ModelStatus.READY, TINY)

    # Closing the client ends the session; the model saves its state first, as an idle one does.
    service.close("success").result()
    assert loaded_loss(connect, ended_saved(model.model_id), data) == pytest.approx(after, rel=1e-5)


def losses_of(training, data, steps: int, learning_rate: float = 2e-2) -> list[float]:
    """`steps` × (forward_backward + optim_step), then one more forward: each loss."""
    found = []
    for _ in range(steps):
        backward = training.forward_backward(data, "cross_entropy")
        training.optim_step(types.AdamParams(learning_rate=learning_rate)).result()
        found.append(backward.result().metrics["loss:sum"])
    found.append(training.forward(data, "cross_entropy").result().metrics["loss:sum"])
    return found


def test_a_saved_state_loads_into_a_new_client_and_training_goes_on_the_same(
    platform,  # noqa: F811
    connect,
    tiny_model,
    stop_models,
    settings,
):
    platform()
    service = connect()
    first = service.create_lora_training_client(base_model=TINY, rank=8, seed=0).result()
    data = supervised(AutoTokenizer.from_pretrained(tiny_model))
    losses_of(first, data, 3)
    saved = first.save_state("after-3").result()
    assert saved.path == f"tinker://{first.model_id}/weights/after-3"
    expected = losses_of(first, data, 2)  # what the first client computes next

    # A new client made from the state (weights and Adam's moments) goes on exactly the same.
    resumed = service.create_training_client_from_state_with_optimizer(saved.path).result()
    assert resumed.model_id != first.model_id
    assert losses_of(resumed, data, 2) == pytest.approx(expected, rel=1e-5)

    # load_state on a fresh client: the weights only, so the first loss is the same.
    other = service.create_lora_training_client(base_model=TINY, rank=8, seed=1).result()
    other.load_state(saved.path).result()
    assert other.forward(data, "cross_entropy").result().metrics["loss:sum"] == pytest.approx(
        expected[0], rel=1e-5
    )
    with pytest.raises(tinker.NotFoundError):
        other.load_state(f"tinker://{first.model_id}/weights/never-saved").result()

    # Its machine lost, a model ends: what waits for it fails with the catalog's code. (A held
    # poll looks at the machine when it ends: after a second here, not the default 20 s.)
    settings.VERI_TINKER_WAIT_SECONDS = 1
    lost = TinkerModel.objects.get(model_id=other.model_id)
    LocalProvider().terminate(lost.external_id)
    with pytest.raises(tinker.RequestFailedError, match="worker_lost"):
        other.forward(data, "cross_entropy").result()
    lost.refresh_from_db()
    assert (lost.status, lost.error_code) == (ModelStatus.FAILED, "worker_lost")
    assert TinkerModel.objects.get(model_id=first.model_id).status == ModelStatus.READY
    # It never saved: its whole uptime, charged, is credited back (the catalog credits it).
    credit = LedgerEntry.objects.get(idempotency_key=f"tinker_lost:{lost.model_id}")
    assert (credit.kind, credit.amount_micros) == ("refund_credit", lost.charged_micros)
    assert lost.charged_micros > 0


def loaded_loss(connect, path: str, data: list[types.Datum]) -> float:
    """The loss on `data` of a new session's client made from the state saved at `path`."""
    resumed = connect().create_training_client_from_state(path).result()
    return resumed.forward(data, "cross_entropy").result().metrics["loss:sum"]


def ended_saved(model_id: str) -> str:
    """The path of the state a model saved before it ended (its end's message names it)."""
    model = wait_for(
        lambda: TinkerModel.objects.filter(model_id=model_id, status=ModelStatus.ENDED).first(),
        timeout=300,
        what="the model to save and end",
    )
    assert "Its state is saved as tinker://" in model.error_message, model.error_message
    return model.error_message.split("Its state is saved as ")[1].rstrip(".")


def test_the_budget_cap_saves_and_ends_the_model_and_its_state_loads_in_a_new_client(
    platform,  # noqa: F811
    connect,
    tiny_model,
    stop_models,
    settings,
):
    platform()
    settings.VERI_TINKER_CHARGE_SECONDS = 0
    # 0.0003 USD: 10.8 s of the local provider's 0.10 USD an hour.
    capped = {"veri_max_cost_usd": "0.0003"}
    service = connect(user_metadata=capped)
    training = service.create_lora_training_client(base_model=TINY, rank=8, seed=0).result()
    data = supervised(AutoTokenizer.from_pretrained(tiny_model))
    expected = losses_of(training, data, 2)[-1]

    def capped_now():
        tasks.sweep_models()
        return TinkerModel.objects.get(model_id=training.model_id).status != ModelStatus.READY

    wait_for(capped_now, timeout=120, what="the session's budget cap")
    path = ended_saved(training.model_id)
    model = TinkerModel.objects.get(model_id=training.model_id)
    assert model.error_code == "budget_exhausted"
    charged = LedgerEntry.objects.filter(workspace=model.workspace, kind="tinker_charge")
    assert -sum(charged.values_list("amount_micros", flat=True)) == 300 == model.charged_micros
    with pytest.raises(tinker.BadRequestError, match="budget cap"):
        training.forward(data, "cross_entropy").result()
    with pytest.raises(tinker.BillingError, match="budget cap"):
        service.create_lora_training_client(base_model=TINY, rank=8).result()

    # A new session (its own budget) loads the saved state: the same loss.
    assert loaded_loss(connect, path, data) == pytest.approx(expected, rel=1e-5)


def test_an_idle_session_saves_each_models_state_before_it_ends(
    platform,  # noqa: F811
    connect,
    tiny_model,
    stop_models,
):
    platform()
    service = connect()
    training = service.create_lora_training_client(base_model=TINY, rank=8, seed=0).result()
    data = supervised(AutoTokenizer.from_pretrained(tiny_model))
    expected = losses_of(training, data, 2)[-1]

    # The client is gone (no heartbeat for an hour): the periodic sweep ends its session.
    session = TinkerModel.objects.get(model_id=training.model_id).session
    TinkerSession.objects.filter(pk=session.pk).update(
        last_heartbeat_at=session.last_heartbeat_at - timedelta(hours=1)
    )
    tasks.sweep_models()
    path = ended_saved(training.model_id)
    assert TinkerModel.objects.get(model_id=training.model_id).error_code == "session_ended"

    assert loaded_loss(connect, path, data) == pytest.approx(expected, rel=1e-5)


def test_the_rl_example_raises_the_mean_reward(
    platform,  # noqa: F811
    live_server,
    tinker_key,
    workspace,
    tiny_model,
    stop_models,
):
    """examples/tinker_rl.py as written (its base model in demo-data, as make demo leaves it):
    15 iterations of save_weights_and_get_sampling_client, 8 samples per prompt, a local reward,
    importance_sampling and optim_step; seeded, so the run repeats."""
    platform()
    files = {f"models/tiny-qwen2/{p.name}": p.read_bytes() for p in tiny_model.iterdir()}
    fill_volume(workspace, "demo-data", files)
    env = {"TINKER_BASE_URL": live_server.url, "TINKER_API_KEY": tinker_key}
    result = run_python(
        str(REPO / "examples" / "tinker_rl.py"), env=env | {"TOKENIZER": str(tiny_model)}
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rewards = [float(r) for r in re.findall(r"mean reward ([0-9.]+)", result.stdout)]
    assert len(rewards) == 15, result.stdout
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + 0.1, rewards
    # It saves its state and closes its session: the model ends now, not once idle.
    assert re.search(r"saved tinker://\S+/weights/final", result.stdout), result.stdout
    ended_saved(TinkerModel.objects.get().model_id)
    assert TinkerModel.objects.get().error_code == "session_ended"


def test_sampled_logprobs_are_a_forward_pass_s(
    platform,  # noqa: F811
    connect,
    tiny_model,
    stop_models,
):
    platform()
    service = connect()
    training = service.create_lora_training_client(base_model=TINY, rank=8, seed=0).result()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    training.forward_backward(supervised(tokenizer), "cross_entropy")
    training.optim_step(types.AdamParams(learning_rate=5e-2)).result()  # a LoRA that is not 0
    sampler = training.save_weights_and_get_sampling_client().result()
    prompt = tokenizer("the answer is")["input_ids"]
    params = types.SamplingParams(max_tokens=6, seed=7, stop=[])
    first = sampler.sample(types.ModelInput.from_ints(prompt), 3, params).result()
    assert [len(s.tokens) for s in first.sequences] == [6, 6, 6]
    assert len({tuple(s.tokens) for s in first.sequences}) > 1  # each sample its own draw

    # The sampler's logprob of each token is what a forward pass of the same weights gives it.
    data = [
        types.Datum(
            model_input=types.ModelInput.from_ints((prompt + s.tokens)[:-1]),
            loss_fn_inputs={"target_tokens": (prompt + s.tokens)[1:]},
        )
        for s in first.sequences
    ]
    forward = training.forward(data, "cross_entropy").result()
    for sequence, output in zip(first.sequences, forward.loss_fn_outputs, strict=True):
        scored = output["logprobs"].tolist()[len(prompt) - 1 :]
        assert sequence.logprobs == pytest.approx(scored, abs=1e-4)

    # The sampler keeps the weights it was saved with while training goes on; a seed repeats.
    training.forward_backward(supervised(tokenizer), "cross_entropy")
    training.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    again = sampler.sample(types.ModelInput.from_ints(prompt), 3, params).result()
    assert [s.tokens for s in again.sequences] == [s.tokens for s in first.sequences]
    for repeated, original in zip(again.sequences, first.sequences, strict=True):
        assert repeated.logprobs == pytest.approx(original.logprobs, abs=1e-5)

    # Named sampler weights: a path a new sampling client samples from; a stop token stops.
    saved = training.save_weights_for_sampler("after-2").result()
    assert saved.path == f"tinker://{training.model_id}/sampler_weights/after-2"
    named = service.create_sampling_client(model_path=saved.path).result()
    greedy = types.SamplingParams(max_tokens=6, temperature=0, stop=[])
    [free] = named.sample(types.ModelInput.from_ints(prompt), 1, greedy).result().sequences
    assert free.stop_reason == "length"
    stop = free.tokens[2]
    greedy = types.SamplingParams(max_tokens=6, temperature=0, stop=[stop])
    [stopped] = named.sample(types.ModelInput.from_ints(prompt), 1, greedy).result().sequences
    assert (stopped.stop_reason, stopped.tokens) == (
        "stop",
        free.tokens[: free.tokens.index(stop) + 1],
    )
    with pytest.raises(tinker.NotFoundError):
        service.create_sampling_client(
            model_path=f"tinker://{training.model_id}/sampler_weights/never"
        ).result()
    with pytest.raises(tinker.BadRequestError, match="not supported"):
        named.sample(types.ModelInput.from_ints(prompt), 1, greedy, topk_sample_logprobs=2).result()

    # A base model's sampler: the base model's own logprobs, as an untrained LoRA's forward.
    base = service.create_sampling_client(base_model=TINY).result()
    [drawn] = base.sample(types.ModelInput.from_ints(prompt), 1, params).result().sequences
    fresh = service.create_lora_training_client(base_model=TINY, rank=4).result()
    datum = types.Datum(
        model_input=types.ModelInput.from_ints((prompt + drawn.tokens)[:-1]),
        loss_fn_inputs={"target_tokens": (prompt + drawn.tokens)[1:]},
    )
    [output] = fresh.forward([datum], "cross_entropy").result().loss_fn_outputs
    assert drawn.logprobs == pytest.approx(output["logprobs"].tolist()[len(prompt) - 1 :], abs=1e-4)
