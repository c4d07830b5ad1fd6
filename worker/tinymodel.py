"""Make a tiny causal LM with no network: `python -m worker.tinymodel OUT_DIR`.

A byte-level BPE tokenizer trained here (vocab ~800, ChatML template, pad and eos) and a randomly
initialised Qwen2 (hidden 64, 2 layers, ~125k parameters), both saved with `save_pretrained`.
`initializer_range=0.2` matters: with the default 0.02 the logits are near uniform and LoRA-GRPO
does not learn at all.
"""

import argparse
import random
from pathlib import Path

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]


def corpus(lines: int = 4000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = [
        "the",
        "a",
        "answer",
        "is",
        "what",
        "plus",
        "minus",
        "times",
        "equals",
        "yes",
        "no",
        "good",
        "bad",
        "model",
        "train",
        "data",
        "step",
        "reward",
        "hello",
        "world",
        "question",
    ]
    out = []
    for _ in range(lines):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        out.append(f"What is {a} plus {b}? The answer is {a + b}.")
        out.append(" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))))
        out.append("".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(24)))
    return out


def make_tiny_model(out_dir: str | Path, *, vocab_size: int = 800, seed: int = 0) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(corpus(seed=seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        bos_token=None,
        unk_token=None,
        additional_special_tokens=["<|im_start|>", "<|endoftext|>"],
    )
    fast.chat_template = CHATML
    fast.save_pretrained(out)

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(fast),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        initializer_range=0.2,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        bos_token_id=None,
    )
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = fast.eos_token_id
    model.generation_config.pad_token_id = fast.pad_token_id
    model.save_pretrained(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--vocab-size", type=int, default=800)
    args = parser.parse_args()
    path = make_tiny_model(args.out_dir, vocab_size=args.vocab_size)
    print(f"tiny model saved to {path}")


if __name__ == "__main__":
    main()
