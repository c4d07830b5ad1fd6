"""OpenAI's JSONL formats: the row rules (one table, for upload and worker), the supervised loss
mask on the tokenized rows and in real TRL training on the tiny model, and a validation dataset
whose eval_loss reaches the job's metrics."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from training.specs import scan_jsonl
from veri.errors import VeriError
from worker.formats import preference_row, reinforcement_row, supervised_example
from worker.rows import row_problem
from worker.train import Events, build_trainer

pytestmark = pytest.mark.slow


def chat(*weights, **extra) -> dict:
    """A supervised chat row: one user turn then an assistant answer per weight (None: unset)."""
    messages = [{"role": "system", "content": "You answer sums."}]
    for index, weight in enumerate(weights):
        messages.append({"role": "user", "content": f"What is {index} plus {index}?"})
        answer = {"role": "assistant", "content": f"The answer is {2 * index}."}
        if weight is not None:
            answer["weight"] = weight
        messages.append(answer)
    return {"messages": messages, **extra}


TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}


def test_openai_supervised_rows_and_their_problems():
    assert row_problem("sft_text", chat(0, 1, None)) is None
    with_tools = {
        "messages": [
            {"role": "developer", "content": [{"type": "text", "text": "Use tools."}]},
            {"role": "user", "content": "1 plus 1?"},
            {"role": "assistant", "content": None, "tool_calls": [CALL], "weight": 0},
            {"role": "tool", "tool_call_id": "c1", "content": "2"},
            {"role": "assistant", "content": "2."},
        ],
        "tools": TOOLS,
        "parallel_tool_calls": False,
    }
    assert row_problem("sft_text", with_tools) is None
    bad = {
        "has messages[1] with role 'bot'; roles are system, developer, user, assistant, tool": {
            "messages": [{"role": "user", "content": "x"}, {"role": "bot", "content": "y"}]
        },
        "has messages[2] with weight 2; use 0 (not trained on) or 1": chat(2),
        "has messages[1] with a weight on a user message; only assistant messages have one": {
            "messages": [
                {"role": "system", "content": "s"},
                {"role": "user", "content": "u", "weight": 1},
                {"role": "assistant", "content": "a"},
            ]
        },
        "has no assistant message to train on (none, or every one has weight 0)": chat(0, 0),
        "has messages[2] with weight True; use 0 (not trained on) or 1": chat(True),
        "has messages[1] with no content (only an assistant message with tool_calls may leave "
        "it null)": {"messages": [{"role": "user", "content": "u"}, {"role": "assistant"}]},
        "has messages[3] with no tool_call_id (a tool message answers the call with that id)": {
            **with_tools,
            "messages": [
                *with_tools["messages"][:3],
                {"role": "tool", "content": "2"},
                with_tools["messages"][4],
            ],
        },
        "has parallel_tool_calls that is not true or false": chat(1, parallel_tool_calls="yes"),
        'has tools that is not a list of {"type": "function", "function"}': chat(1, tools={}),
    }
    for problem, row in bad.items():
        assert row_problem("sft_text", row) == problem


def test_openai_preference_and_reinforcement_rows():
    preference = {
        "input": {
            "messages": [{"role": "user", "content": "Hi"}],
            "tools": [],
            "parallel_tool_calls": True,
        },
        "preferred_output": [{"role": "assistant", "content": "Hello!"}],
        "non_preferred_output": [{"role": "assistant", "content": "Go away."}],
    }
    assert row_problem("dpo", preference) is None
    assert preference_row(preference) == {
        "prompt": [{"role": "user", "content": "Hi"}],
        "chosen": [{"role": "assistant", "content": "Hello!"}],
        "rejected": [{"role": "assistant", "content": "Go away."}],
    }
    assert (
        row_problem(
            "dpo", {**preference, "non_preferred_output": [{"role": "user", "content": "x"}]}
        )
        == "has non_preferred_output with a message that is not from the assistant"
    )
    assert row_problem("dpo", {**preference, "preferred_output": []}) == (
        'needs "preferred_output" to be a non-empty list of {role, content} messages'
    )
    assert row_problem("sft_text", preference) == (
        'needs "text" (a string) or "messages" (a list of {role, content})'
    )

    rft = {"messages": [{"role": "user", "content": "Say 4"}], "answer": "4", "tags": ["sum"]}
    assert row_problem("grpo", rft) is None
    # The reward gets every other field, and the conversation as `messages`.
    assert reinforcement_row(rft) == {**rft, "prompt": rft["messages"]}
    ends_with_answer = {"messages": [*rft["messages"], {"role": "assistant", "content": "4"}]}
    assert row_problem("grpo", ends_with_answer) == (
        "has messages ending with role 'assistant'; a reinforcement row ends with a user or "
        "developer message, which the model answers"
    )
    # A supervised chat row is no reinforcement row, and the reverse.
    assert row_problem("grpo", chat(1)).startswith("has messages ending with role 'assistant'")
    assert row_problem("sft_text", rft).startswith("has no assistant message to train on")


def test_upload_check_names_the_line_and_the_problem():
    lines = [json.dumps(chat(1)), json.dumps(chat(0))]
    count, first_bad = scan_jsonl(io.StringIO("\n".join(lines)))
    assert count == 2
    assert first_bad["sft_text"] == {
        "line": 2,
        "problem": "has no assistant message to train on (none, or every one has weight 0)",
    }
    with pytest.raises(VeriError, match="line 1 is not valid JSON"):
        scan_jsonl(io.StringIO('{"messages": [\n'))


def test_the_labels_cover_exactly_the_weighted_assistant_tokens(tiny_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    row = chat(0, 1, 0)
    example = supervised_example(row, tokenizer, max_length=512)
    whole = tokenizer.apply_chat_template(row["messages"], tokenize=True, return_dict=True)
    assert example["input_ids"] == whole["input_ids"]
    trained = [
        t for t, label in zip(example["input_ids"], example["labels"], strict=True) if label != -100
    ]
    assert tokenizer.decode(trained) == "The answer is 2.<|im_end|>\n"
    assert all(
        label in (-100, token)
        for token, label in zip(example["input_ids"], example["labels"], strict=True)
    )
    # Cut to max_seq_length, the tokens and their labels alike.
    short = supervised_example(row, tokenizer, max_length=10)
    assert len(short["input_ids"]) == len(short["labels"]) == 10


def spec_for(tmp_path: Path, tiny_model: Path, method: str, **hyperparameters) -> dict:
    return {
        "job_id": "job_formats",
        "method": method,
        "base_model": "tiny",
        "model_path": str(tiny_model),
        "reward_source": "",
        "hyperparameters": {
            "learning_rate": 5e-3,
            "max_steps": 4,
            "batch_size": 4,
            "max_seq_length": 128,
            "seed": 42,
            **hyperparameters,
        },
        "lora": {
            "r": 8,
            "alpha": 16,
            "dropout": 0.0,
            "target_modules": ["q_proj", "v_proj"],
            "quantization": None,
            "unsloth": False,
        },
        "gpu_type": "cpu",
        "gpu_count": 1,
        "checkpoint_every": None,
        "checkpoint_keep": 1,
        "output_dir": str(tmp_path / "output"),
        "final_dir": str(tmp_path / "final"),
    }


def first_loss(spec: dict, rows: list[dict]) -> float:
    trainer, _ = build_trainer(
        spec | {"hyperparameters": spec["hyperparameters"] | {"max_steps": 1}}, rows, Events()
    )
    trainer.train()
    return next(entry["loss"] for entry in trainer.state.log_history if "loss" in entry)


def test_the_weight_of_an_assistant_message_changes_the_loss(tiny_model, tmp_path):
    spec = spec_for(tmp_path, tiny_model, "sft_text")
    both = [chat(1, 1)] * 4
    last_only = [chat(0, 1)] * 4  # the same rows, the first answer not trained on
    assert first_loss(spec, both) != pytest.approx(first_loss(spec, last_only), rel=1e-3)
    assert first_loss(spec, last_only) == pytest.approx(first_loss(spec, last_only))


def test_a_resumed_run_says_how_many_steps_it_trained_itself(tiny_model, tmp_path, capsys):
    spec = spec_for(tmp_path, tiny_model, "sft_text", max_steps=6) | {"checkpoint_every": 2}
    rows = [chat(1, 1)] * 8
    build_trainer(spec, rows, Events())[0].train()
    assert "[veri] trained 6 steps in" in capsys.readouterr().out
    resumed, _ = build_trainer(spec, rows, Events())
    resumed.train(resume_from_checkpoint=str(tmp_path / "output" / "checkpoint-4"))
    out = capsys.readouterr().out
    assert "[veri] trained 2 steps in" in out and "(resumed at step 4)" in out


def run_training(spec: dict) -> list[dict]:
    """worker.train in its own process, as the runner starts it; its events."""
    job_file = Path(spec["output_dir"]).parent / "job.json"
    job_file.write_text(json.dumps(spec))
    read_fd, write_fd = os.pipe()
    child = subprocess.Popen(
        [sys.executable, "-m", "worker.train", str(job_file)],
        cwd=REPO,
        env={**os.environ, "VERI_EVENTS_FD": str(write_fd), "HF_HUB_OFFLINE": "1"},
        pass_fds=(write_fd,),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    os.close(write_fd)
    with os.fdopen(read_fd) as stream:
        events = [json.loads(line) for line in stream]
    output = child.communicate(timeout=600)[0].decode()
    assert child.returncode == 0, output
    return events


def test_a_validation_dataset_reports_eval_loss_every_eval_interval(tiny_model, tmp_path):
    def write(name: str, rows: list[dict]) -> dict:
        path = tmp_path / name
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return {"id": name, "source": "upload", "local_path": str(path)}

    spec = spec_for(tmp_path, tiny_model, "sft_text", eval_interval=2, eval_samples=3)
    spec |= {
        "dataset": write("train.jsonl", [chat(0, 1)] * 8),
        "validation_dataset": write("valid.jsonl", [chat(1)] * 5),
    }
    events = run_training(spec)
    points: dict[int, dict] = {}
    for event in events:  # the control plane keeps a step's first point
        if event["event"] == "metrics":
            points.setdefault(event["step"], event["values"])
    evaluated = sorted(step for step, values in points.items() if "eval_loss" in values)
    assert evaluated == [2, 4]
    for step in evaluated:  # one point per step: the training values are in it too
        assert "loss" in points[step] and points[step]["eval_loss"] > 0
    assert "eval_loss" not in points[1] and "loss" in points[1]
    assert events[-1]["event"] == "finished"


def logged(trainer, key: str) -> list[float]:
    return [entry[key] for entry in trainer.state.log_history if key in entry]


def test_openai_preference_rows_train_dpo_and_evaluate(tiny_model, tmp_path):
    def row(a: int) -> dict:
        return {
            "input": {"messages": [{"role": "user", "content": f"What is {a} plus {a}?"}]},
            "preferred_output": [{"role": "assistant", "content": f"{2 * a}."}],
            "non_preferred_output": [{"role": "assistant", "content": "I do not know."}],
        }

    spec = spec_for(tmp_path, tiny_model, "dpo", max_steps=2, beta=0.1, eval_interval=1)
    trainer, _ = build_trainer(spec, [row(a) for a in range(8)], Events(), [row(9), row(11)])
    trainer.train()
    assert len(logged(trainer, "eval_loss")) == 2
    assert len(logged(trainer, "rewards/margins")) >= 2


def test_openai_reinforcement_rows_give_the_reward_their_fields(tiny_model, tmp_path):
    seen = tmp_path / "seen.jsonl"
    spec = spec_for(
        tmp_path,
        tiny_model,
        "grpo",
        max_steps=1,
        rollouts_per_prompt=4,
        max_response_length=8,
        temperature=1.0,
        kl_coef=0.0,
    )
    spec["reward_source"] = (
        "import json\n"
        "def reward(prompts, completions, answer, messages, **kwargs):\n"
        f"    with open({str(seen)!r}, 'a') as f:\n"
        "        call = {'answer': answer, 'messages': messages, 'prompts': prompts}\n"
        "        f.write(json.dumps(call) + '\\n')\n"
        "    return [float(a in c) for a, c in zip(answer, completions)]\n"
    )
    asked = [{"role": "developer", "content": [{"type": "text", "text": "Say 4"}]}]
    trainer, _ = build_trainer(spec, [{"messages": asked, "answer": "4"}] * 4, Events())
    trainer.train()
    call = json.loads(seen.read_text().splitlines()[0])
    as_text = [{"role": "developer", "content": "Say 4"}]
    assert call["answer"] == ["4"] * 4
    assert call["messages"] == [as_text] * 4 and call["prompts"] == [as_text] * 4


def test_a_chat_template_that_refuses_a_row_or_none_at_all_is_said_plainly(tiny_model):
    from transformers import AutoTokenizer

    from worker.errors import JobFailure
    from worker.train import trainer_dataset

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'system' and not loop.first %}"
        "{{ raise_exception('the system message comes first') }}{% endif %}"
        "{{ m['content'] }}{% endfor %}"
    )
    late_system = {
        "messages": [
            {"role": "user", "content": "u"},
            {"role": "system", "content": "s"},
            {"role": "assistant", "content": "a"},
        ]
    }
    with pytest.raises(JobFailure) as refused:
        trainer_dataset("sft_text", [chat(1), late_system], tokenizer, 64)
    assert (refused.value.code, refused.value.message) == (
        "invalid_dataset",
        "row 2: the model's chat template refuses it: the system message comes first",
    )
    tokenizer.chat_template = None
    with pytest.raises(JobFailure) as refused:
        trainer_dataset("sft_text", [chat(1)], tokenizer, 64)
    assert refused.value.code == "config_error" and "chat template" in refused.value.message
    assert len(trainer_dataset("sft_text", [{"text": "plain"}], tokenizer, 64)) == 1


def test_tools_and_tool_calls_reach_the_chat_template(tiny_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.chat_template = (
        "{% if tools %}<|im_start|>system\ntools: {% for t in tools %}{{ t.function.name }}"
        "{% endfor %}<|im_end|>\n{% endif %}"
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
        "{% for c in m.tool_calls or [] %}call {{ c.function.name }} "
        "{{ c.function.arguments | tojson }}{% endfor %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    row = {
        "messages": [
            {"role": "user", "content": "1 plus 1?"},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "c1", "content": "2"},
            {"role": "assistant", "content": "2.", "weight": 0},
        ],
        "tools": TOOLS,
    }
    example = supervised_example(row, tokenizer, max_length=512)
    assert tokenizer.decode(example["input_ids"]).startswith("<|im_start|>system\ntools: add")
    trained = [
        t for t, label in zip(example["input_ids"], example["labels"], strict=True) if label != -100
    ]
    assert tokenizer.decode(trained) == 'call add {"a": 1}<|im_end|>\n'  # an object, not text


def test_a_reference_field_of_two_types_is_an_invalid_dataset():
    from worker.errors import JobFailure
    from worker.train import trainer_dataset

    asked = [{"role": "user", "content": "Say 4"}]
    rows = [{"messages": asked, "answer": 4}, {"messages": asked, "answer": {"value": 4}}]
    with pytest.raises(JobFailure) as refused:
        trainer_dataset("grpo", rows, None, None)
    assert refused.value.code == "invalid_dataset"
    assert refused.value.message.startswith("the rows' fields must have one type each")
