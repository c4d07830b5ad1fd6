"""tinker-cookbook's two minimal loops, `recipes/sl_loop.py` and `recipes/rl_loop.py`, run as
published (`python -m tinker_cookbook.recipes.…`, only their command-line options) against a
live Veri: the embedded default (API server, task cluster, local provider), a Tinker key.

No network: the base model they name (`meta-llama/Llama-3.2-1B`, the cookbook's renderer for it
is the generic `role_colon`) is the tiny model in a Hugging Face cache, as are the tokenizer the
cookbook loads for Llama 3 and small stand-ins of the data sets they load (No Robots, GSM8K) with
the real ones' columns, in the cache `datasets` reads offline."""

import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
import tinker
import torch
from datasets.arrow_writer import ArrowWriter
from tinker_cookbook.renderers import get_renderer
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.conftest import REPO
from tests.e2e.test_tinker import connect, stop_models, tinker_key  # noqa: F401 - fixtures
from tests.e2e.test_training import platform  # noqa: F401 - a fixture
from tinker_api.models import OpKind, OpStatus, TinkerOperation

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

BASE = "meta-llama/Llama-3.2-1B"
# The cookbook loads Llama 3's tokenizer from here (tokenizer_utils: no gated repo).
LLAMA_TOKENIZER = "thinkingmachineslabinc/meta-llama-3-instruct-tokenizer"
REVISION = "0" * 40


def _hub_repo(cache: Path, repo_id: str, files: dict[str, bytes]) -> None:
    """A model repo as the hub's cache holds it: a snapshot and `refs/main` naming it."""
    root = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = root / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    for name, data in files.items():
        (snapshot / name).write_bytes(data)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(REVISION)


def _cached_dataset(cache: Path, repo_id: str, config: str, rows: list[dict]) -> None:
    """`rows` as both splits of `repo_id`'s `config`, where `load_dataset(repo_id, config)` finds
    a data set it prepared before when it cannot reach the hub (`datasets`' own cache layout:
    `<namespace>___<name>/<config>/<version>/<hash>/`, one Arrow file per split)."""
    namespace, name = repo_id.split("/")
    folder = cache / f"{namespace}___{name}" / config / "0.0.0" / "stand-in"
    folder.mkdir(parents=True)
    table = datasets.Dataset.from_list(rows)
    splits = datasets.SplitDict(dataset_name=name)
    for split in ("train", "test"):
        with ArrowWriter(features=table.features, path=str(folder / f"{name}-{split}.arrow")) as w:
            w.write_table(table.data.table)
            count, size = w.finalize()
        splits.add(
            datasets.SplitInfo(name=split, num_bytes=size, num_examples=count, dataset_name=name)
        )
    info = datasets.DatasetInfo(
        features=table.features, config_name=config, dataset_name=name, splits=splits
    )
    info.write_to_directory(str(folder))


def no_robots_rows(count: int) -> list[dict]:
    """No Robots' columns; short chats the tiny model's tokenizer covers."""
    return [
        {
            "prompt": f"What is {n} plus 1?",
            "prompt_id": f"stand-in-{n}",
            "messages": [
                {"role": "user", "content": f"What is {n} plus 1?"},
                {"role": "assistant", "content": f"The answer is {n + 1}."},
            ],
            "category": "Open QA",
        }
        for n in range(count)
    ]


def gsm8k_rows(count: int) -> list[dict]:
    """GSM8K's columns: the worked answer ends with `#### <number>`."""
    return [
        {"question": f"What is {n} plus 1?", "answer": f"{n} + 1 = {n + 1}\n#### {n + 1}"}
        for n in range(count)
    ]


# The prompt rl_loop (0.6.1) builds for a question: its worked example, then the question.
QUESTION_SUFFIX = " Provide a numerical answer without units, written inside \\boxed{}."
WORKED_EXAMPLE = [
    {"role": "user", "content": "How many r's are in strawberry?" + QUESTION_SUFFIX},
    {
        "role": "assistant",
        "content": "Let's spell the word out and number all the letters: 1) s 2) t 3) r 4) a "
        "5) w 6) b 7) e 8) r 9) r 10) y. We have r's at positions 3, 8, and 9. \\boxed{3}",
    },
]


def answering_model(tiny_model: Path, out: Path) -> Path:
    """The tiny model taught to answer rl_loop's prompt with `\\boxed{1}` or `\\boxed{2}`, about
    as often: of a group of samples for the questions whose answers are 1 and 2 some are right
    and some wrong, so their advantages are not all 0 and the loop trains on them."""
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    convo = [*WORKED_EXAMPLE, {"role": "user", "content": "What is 0 plus 1?" + QUESTION_SUFFIX}]
    prompt = get_renderer("role_colon", tokenizer).build_generation_prompt(convo).to_ints()
    answers = [tokenizer.encode(f" \\boxed{{{n}}}\n\nUser:") for n in (1, 2)]
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(30):
        for answer in answers:
            labels = [-100] * len(prompt) + answer  # the answer's tokens only
            model(
                input_ids=torch.tensor([prompt + answer]), labels=torch.tensor([labels])
            ).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture
def hf_caches(tmp_path, hub_cache, settings, monkeypatch):
    """`make(model)`: the Hugging Face caches the loops, the server and its workers read, offline,
    with `model` as BASE: their environment."""

    def make(model: Path) -> dict[str, str]:
        hub, data = tmp_path / "hf" / "hub", tmp_path / "hf" / "datasets"
        files = {p.name: p.read_bytes() for p in model.iterdir() if p.is_file()}
        _hub_repo(hub, BASE, files)
        _hub_repo(hub, LLAMA_TOKENIZER, files)
        _cached_dataset(data, "HuggingFaceH4/no_robots", "default", no_robots_rows(8))
        _cached_dataset(data, "openai/gsm8k", "main", gsm8k_rows(4))
        env = {"HF_HUB_CACHE": str(hub), "HF_DATASETS_CACHE": str(data), "HF_HUB_OFFLINE": "1"}
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        settings.VERI_LOCAL_HF_CACHE = str(hub)  # the server's check that workers can load BASE
        return env

    return make


def run_recipe(
    recipe: str, env: dict, *options: str, ok: bool = True
) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-m", f"tinker_cookbook.recipes.{recipe}", *options],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert (result.returncode == 0) == ok, result.stdout[-5000:] + result.stderr[-10000:]
    return result


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_the_cookbook_sl_loop_trains_saves_and_resumes(
    platform,  # noqa: F811
    live_server,
    tinker_key,  # noqa: F811
    connect,  # noqa: F811
    hf_caches,
    tiny_model,
    stop_models,  # noqa: F811
    tmp_path,
):
    caches = hf_caches(tiny_model)
    platform(HF_HUB_CACHE=caches["HF_HUB_CACHE"])
    env = caches | {"TINKER_API_KEY": tinker_key}
    log = tmp_path / "sl-loop"
    options = [
        f"base_url={live_server.url}",
        f"model_name={BASE}",
        f"log_path={log}",
        "batch_size=2",
        "lora_rank=8",
        "learning_rate=0.01",
        "save_every=2",
    ]
    run_recipe("sl_loop", env, *options, "max_steps=3")
    metrics = jsonl(log / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2]
    assert all(m["num_sequences"] == 2 and m["train_mean_nll"] > 0 for m in metrics), metrics
    saved = jsonl(log / "checkpoints.jsonl")
    assert [(c["name"], c["batch"]) for c in saved] == [("000002", 2), ("final", 4)]
    final = saved[-1]
    assert final["state_path"].startswith("tinker://")
    assert final["sampler_path"].startswith("tinker://")

    # The saved paths are Veri's: a new client is made from the state, another samples.
    service = connect()
    other = service.create_training_client_from_state(final["state_path"]).result()
    assert (other.get_info().model_name, other.get_info().lora_rank) == (BASE, 8)
    sampler = service.create_sampling_client(model_path=final["sampler_path"]).result()
    prompt = tinker.types.ModelInput.from_ints([1, 2, 3])
    params = tinker.types.SamplingParams(max_tokens=2)
    assert len(sampler.sample(prompt, 1, params).result().sequences[0].tokens) == 2

    # A run cut short after its step-2 save, started again: it resumes from that state (weights
    # and optimizer) and trains the steps left, saving at step 2 again.
    (log / "checkpoints.jsonl").write_text(json.dumps(saved[0]) + "\n")
    result = run_recipe("sl_loop", env, *options)
    assert "Resuming from batch 2" in result.stdout + result.stderr
    assert [m["step"] for m in jsonl(log / "metrics.jsonl")] == [0, 1, 2, 2, 3]
    assert [c["name"] for c in jsonl(log / "checkpoints.jsonl")] == ["000002", "000002", "final"]


def test_the_cookbook_rl_loop_samples_trains_and_saves(
    platform,  # noqa: F811
    live_server,
    tinker_key,  # noqa: F811
    hf_caches,
    tiny_model,
    stop_models,  # noqa: F811
    tmp_path,
):
    caches = hf_caches(answering_model(tiny_model, tmp_path / "answering"))
    platform(HF_HUB_CACHE=caches["HF_HUB_CACHE"])
    env = caches | {"TINKER_API_KEY": tinker_key}
    options = [
        f"base_url={live_server.url}",
        f"model_name={BASE}",
        "batch_size=2",
        # Both questions' groups of 8 all right or all wrong (no step to train): under 1 in 1000.
        "group_size=8",
        "max_tokens=16",
        "lora_rank=8",
        "save_every=0",
    ]
    # Its defaults: StableReinforce, sampling with record_stability_info and training data
    # that names the sampled sequences behind its tokens.
    log = tmp_path / "rl-loop"
    run_recipe("rl_loop", env, *options, f"log_path={log}")
    first, second = jsonl(log / "metrics.jsonl")
    assert (first["step"], second["step"]) == (0, 1)
    # Questions 0 and 1 (answers 1 and 2): right and wrong samples, a training step on them.
    assert 0 < first["reward/total"] < 1, first
    assert first["grad_norm:mean"] > 0, first  # stable_reinforce gave the LoRA gradients
    [final] = jsonl(log / "checkpoints.jsonl")
    assert (final["name"], final["batch"]) == ("final", 2)
    assert final["state_path"].startswith("tinker://")
    # It sampled with record_stability_info and trained with stable_reinforce on the records.
    recorded = TinkerOperation.objects.filter(kind=OpKind.SAMPLE, recorded_until__isnull=False)
    assert recorded.count() == 4  # 2 steps x 2 questions, each a request of 8 samples
    trained = TinkerOperation.objects.filter(kind=OpKind.FORWARD_BACKWARD, status=OpStatus.DONE)
    assert trained.filter(payload__loss_fn="stable_reinforce").exists()
