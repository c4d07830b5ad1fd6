"""A reinforcement-learning loop written for the official `tinker` SDK, run on Veri.

Each iteration publishes the current LoRA weights to a sampler, samples a group of completions
per prompt, scores each locally (the share of the letter "a" in its text), and trains on them
with the `importance_sampling` loss, advantages centred per group. The mean reward rises.

    source .venv/bin/activate
    python manage.py runserver & python manage.py qcluster &   # make demo stopped its own
    export TINKER_BASE_URL=http://127.0.0.1:8000
    export TINKER_API_KEY=tml-…   # veri tinker key --name rl (signed in as make demo printed)
    python examples/tinker_rl.py

It trains the tiny model `make demo` put in the volume demo-data; its tokenizer is read from
the model's local folder (TOKENIZER, `.veri/models/tiny-qwen2` after `make demo`). See
docs/user-guide/tinker.md ("Coming from Tinker")."""

import os
import time

import tinker
from tinker import types
from transformers import AutoTokenizer

BASE_MODEL = os.environ.get("BASE_MODEL", "volume://demo-data/models/tiny-qwen2")
TOKENIZER = os.environ.get("TOKENIZER", ".veri/models/tiny-qwen2")
PROMPTS = ["the answer is", "what is", "a plum is"]
ITERATIONS, GROUP, MAX_TOKENS = 15, 8, 8


def reward(text: str) -> float:
    letters = [c for c in text if c.isalpha()]
    return letters.count("a") / len(letters) if letters else 0.0


def main() -> None:
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    service = tinker.ServiceClient()  # TINKER_BASE_URL and TINKER_API_KEY
    training = service.create_lora_training_client(base_model=BASE_MODEL, rank=8, seed=0).result()
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS]
    for iteration in range(ITERATIONS):
        started = time.monotonic()
        sampler = training.save_weights_and_get_sampling_client().result()
        futures = []
        for index, prompt in enumerate(prompts):
            # stop=[]: every completion is MAX_TOKENS long; a seed makes the run repeat.
            seed = 1000 * iteration + index
            params = types.SamplingParams(max_tokens=MAX_TOKENS, stop=[], seed=seed)
            futures.append(sampler.sample(types.ModelInput.from_ints(prompt), GROUP, params))
        data, rewards = [], []
        for prompt, future in zip(prompts, futures, strict=True):
            sequences = future.result().sequences
            scores = [reward(tokenizer.decode(s.tokens)) for s in sequences]
            mean = sum(scores) / len(scores)
            rewards += scores
            for sequence, score in zip(sequences, scores, strict=True):
                tokens = prompt + sequence.tokens
                before = [0.0] * (len(prompt) - 1)
                data.append(
                    types.Datum(
                        model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={
                            "target_tokens": tokens[1:],
                            "logprobs": before + sequence.logprobs,
                            "advantages": before + [score - mean] * len(sequence.tokens),
                        },
                    )
                )
        training.forward_backward(data, "importance_sampling").result()
        training.optim_step(types.AdamParams(learning_rate=3e-2)).result()
        mean, took = sum(rewards) / len(rewards), time.monotonic() - started
        print(f"iteration {iteration:2d} mean reward {mean:.3f} ({took:.1f} s)", flush=True)
    print("saved", training.save_state("final").result().path)
    service.close("success").result()  # the session ends now: its model stops costing


if __name__ == "__main__":
    main()
