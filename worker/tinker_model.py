"""A Tinker training client's model in the worker: the base model with a PEFT LoRA and an
AdamW optimizer, running the operations the control plane hands over one at a time.

Gradients accumulate across `forward_backward` calls until `optim_step` applies and clears them,
as in Tinker. Each datum runs on its own (no padding), so a loss is exactly the sum over data."""

import contextlib
from pathlib import Path

import torch

from worker.serve import generate
from worker.tinker_losses import LOSSES, LossInputError, target_logprobs

ATTENTION = {"q_proj", "k_proj", "v_proj", "o_proj"}
MLP = {"gate_proj", "up_proj", "down_proj"}
UNEMBED = {"lm_head"}
OPTIMIZER_FILE = "optimizer.pt"
TORCH_DTYPES = {"float32": torch.float32, "int64": torch.int64}


def from_wire(tensor: dict) -> torch.Tensor:
    """A `{dtype, shape, data}` tensor (the control plane's JSON form of Tinker's TensorData)."""
    if tensor.get("dtype") not in TORCH_DTYPES:
        raise LossInputError(f"Tensors are float32 or int64, not {tensor.get('dtype')!r}.")
    return torch.tensor(tensor["data"], dtype=TORCH_DTYPES[tensor["dtype"]]).reshape(
        tensor["shape"]
    )


def to_wire(tensor: torch.Tensor) -> dict:
    tensor = tensor.detach().cpu()
    dtype = "int64" if not tensor.is_floating_point() else "float32"
    return {"dtype": dtype, "shape": list(tensor.shape), "data": tensor.reshape(-1).tolist()}


def stops(params: dict) -> tuple[list[int], list[str], bool]:
    """Tinker's `stop` (SamplingParams): its token ids, its strings (a string alone is one),
    and whether the model's end-of-sequence token stops too: `[]` stops nothing, not even that."""
    stop = params.get("stop")
    stop = [stop] if isinstance(stop, str) else stop
    ids = [s for s in stop or () if isinstance(s, int)]
    return ids, [s for s in stop or () if isinstance(s, str)], stop != []


class TinkerModel:
    def __init__(self, base_path: Path, lora: dict):
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM

        if lora.get("seed") is not None:
            torch.manual_seed(int(lora["seed"]))
        # On the machine's GPU when it has one (a cloud provider's), else on the CPU.
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
        model.to(self.device)
        linear = {
            name.rsplit(".", 1)[-1]
            for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear)
        }
        wanted = (
            (ATTENTION if lora.get("train_attn", True) else set())
            | (MLP if lora.get("train_mlp", True) else set())
            | (UNEMBED if lora.get("train_unembed", True) else set())
        )
        targets = sorted(wanted & linear)
        if not targets:
            raise LossInputError("The LoRA would train no layer of this model.")
        rank = int(lora["rank"])
        # alpha = rank: the adapter's scale is 1, whatever the rank.
        config = LoraConfig(r=rank, lora_alpha=rank, lora_dropout=0.0, target_modules=targets)
        self.model = get_peft_model(model, config).eval()  # eval: no dropout; gradients still flow
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=1e-4, betas=(0.9, 0.95), eps=1e-12)
        self.tokens_processed = 0
        self.vocab = model.get_input_embeddings().num_embeddings
        self.base_path = base_path
        self.eos = model.config.eos_token_id
        self.snapshots: dict[int, dict[str, torch.Tensor]] = {}  # sampler weights, by save seq
        self._tokenizer = None

    def forward_backward(
        self, data: list[dict], loss_fn: str, config: dict, *, backward: bool = True
    ) -> dict:
        """`{loss_fn_outputs: [{name: tensor}], metrics: {"loss:sum": float}}`; with `backward`,
        the loss's gradients are added to the model's."""
        fn = LOSSES.get(loss_fn)
        if fn is None:
            raise LossInputError(
                f"loss_fn {loss_fn!r} is not supported here; use one of {', '.join(LOSSES)}."
            )
        outputs, total = [], 0.0
        for index, datum in enumerate(data):
            tokens = torch.tensor(datum["tokens"], dtype=torch.int64, device=self.device)
            inputs = {name: from_wire(t).to(self.device) for name, t in datum["inputs"].items()}
            targets = inputs.get("target_tokens")
            if targets is None or targets.dim() != 1 or targets.numel() != tokens.numel():
                raise LossInputError(
                    f"data[{index}]: loss_fn_inputs['target_tokens'] needs one token per input "
                    f"token ({tokens.numel()})."
                )
            if not tokens.numel():
                raise LossInputError(f"data[{index}] has no tokens.")
            for what, ids in (("model_input", tokens), ("target_tokens", targets)):
                if int(ids.min()) < 0 or int(ids.max()) >= self.vocab:
                    raise LossInputError(
                        f"data[{index}]: {what} holds a token outside this model's vocabulary "
                        f"(0 to {self.vocab - 1})."
                    )
            recorded = datum.get("recorded")  # the control plane's, for stable_reinforce
            if recorded is not None:
                recorded = {
                    name: torch.tensor(recorded[name], dtype=torch.float32, device=self.device)
                    for name in ("logprobs", "sampled")
                }
            with torch.set_grad_enabled(backward):
                logits = self.model(input_ids=tokens[None]).logits[0]
                logprobs = target_logprobs(logits, targets.long())
                loss, out = fn(logprobs, inputs, config, recorded)
                if backward:
                    loss.backward()
            total += float(loss.detach())
            self.tokens_processed += tokens.numel()
            outputs.append({name: to_wire(value) for name, value in out.items()})
        return {"loss_fn_outputs": outputs, "metrics": {"loss:sum": total}}

    def optim_step(self, params: dict) -> dict:
        """One AdamW step with Tinker's Adam parameters, then the gradients are cleared."""
        for group in self.optimizer.param_groups:
            group["lr"] = float(params.get("learning_rate", 1e-4))
            group["betas"] = (float(params.get("beta1", 0.9)), float(params.get("beta2", 0.95)))
            group["eps"] = float(params.get("eps", 1e-12))
            group["weight_decay"] = float(params.get("weight_decay", 0.0))
        clip = float(params.get("grad_clip_norm", 0.0))
        norm = torch.nn.utils.clip_grad_norm_(self.params, clip if clip > 0 else float("inf"))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"metrics": {"grad_norm:mean": float(norm)}}

    def snapshot(self, seq_id: int) -> None:
        """The LoRA weights as they are now, kept for the samplers saved at `seq_id` (a
        `save_weights_for_sampler`): they sample with these while training goes on."""
        from peft import get_peft_model_state_dict

        state = get_peft_model_state_dict(self.model)
        self.snapshots[seq_id] = {name: t.detach().clone() for name, t in state.items()}

    def sample(self, seq_id: int, payload: dict) -> dict:
        """`num_samples` completions of the prompt with the weights snapshotted at `seq_id`:
        `{sequences: [{tokens, logprobs, stop_reason}]}`, logprobs as a forward pass scores them
        (and with `prompt_logprobs` each prompt token's, the first's None).
        `stop` is token ids or strings, and the model's end-of-sequence token stops too (a base
        model's turn may end there rather than at the chat format's stop string); `[]` stops
        nothing, as in Tinker's SamplingParams."""
        tokens, params = payload["tokens"], payload["sampling_params"]
        self.check_prompt(tokens)
        stop_ids, stop_texts, eos_stops = stops(params)
        stop_tokens = set(stop_ids)
        if eos_stops and self.eos is not None:
            stop_tokens |= set(self.eos) if isinstance(self.eos, list) else {self.eos}
        with self.snapshot_weights(seq_id):
            sequences = [
                self._one(tokens, params, stop_tokens, stop_texts, index)
                for index in range(int(payload["num_samples"]))
            ]
            if not payload.get("prompt_logprobs"):
                return {"sequences": sequences}
            with torch.no_grad():
                ids = torch.tensor(tokens, dtype=torch.int64, device=self.device)
                logits = self.model(input_ids=ids[None]).logits[0]
                scores = target_logprobs(logits[:-1], ids[1:]).tolist()
        return {"sequences": sequences, "prompt_logprobs": [None, *scores]}

    def check_prompt(self, tokens: list[int]) -> None:
        if not tokens or min(tokens) < 0 or max(tokens) >= self.vocab:
            raise LossInputError(f"The prompt's tokens are 0 to {self.vocab - 1}, at least one.")

    @contextlib.contextmanager
    def snapshot_weights(self, seq_id: int):
        """The model holds the LoRA weights snapshotted at `seq_id` inside (its current ones
        when there is no such snapshot), its current ones again after."""
        from peft import get_peft_model_state_dict, set_peft_model_state_dict

        if seq_id not in self.snapshots:
            yield
            return
        current = {n: t.detach().clone() for n, t in get_peft_model_state_dict(self.model).items()}
        set_peft_model_state_dict(self.model, self.snapshots[seq_id])
        try:
            yield
        finally:
            set_peft_model_state_dict(self.model, current)

    def snapshot_is_base(self, seq_id: int) -> bool:
        """Whether the weights sampled at `seq_id` compute the base model exactly: every LoRA
        `B` is zero, as PEFT starts it (an untrained model, a base model's sampler)."""
        from peft import get_peft_model_state_dict

        state = self.snapshots.get(seq_id) or get_peft_model_state_dict(self.model)
        return all(not t.any() for name, t in state.items() if "lora_B" in name)

    def _one(self, prompt, params, stop_tokens, stop_texts, index) -> dict:
        seed = params.get("seed")
        out, logprobs, reason = [], [], "length"
        for token, logprob, _ in generate(
            self.model,
            prompt,
            max_tokens=int(params.get("max_tokens") or 16),
            temperature=float(params.get("temperature", 1.0)),
            top_p=float(params.get("top_p", 1.0)),
            top_k=int(params.get("top_k", -1)),
            seed=None if seed is None else int(seed) + index,
            stop_tokens=stop_tokens,
        ):
            out.append(token)
            logprobs.append(logprob)
            if token in stop_tokens or (
                stop_texts and any(t in self.tokenizer.decode(out) for t in stop_texts)
            ):
                reason = "stop"
                break
        return {"tokens": out, "logprobs": logprobs, "stop_reason": reason}

    @property
    def tokenizer(self):
        """The base model's tokenizer, loaded the first time a text stop needs it."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.base_path)
        return self._tokenizer

    def save(self, folder: Path, *, optimizer: bool) -> list[Path]:
        """The LoRA (PEFT's adapter files), and the AdamW state with `optimizer`, as files in
        `folder`."""
        folder.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(folder)
        if optimizer:
            torch.save(self.optimizer.state_dict(), folder / OPTIMIZER_FILE)
        return sorted(p for p in folder.iterdir() if p.is_file())

    def load(self, folder: Path, *, optimizer: bool) -> None:
        """A saved state into this model: the LoRA weights, and the AdamW state when asked
        (else the optimizer starts afresh). A checkpoint of another shape is the caller's error."""
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        weights = load_file(folder / "adapter_model.safetensors")
        try:
            result = set_peft_model_state_dict(self.model, weights)
        except RuntimeError as exc:  # shapes differ: another rank or base model
            raise LossInputError(f"The checkpoint does not fit this model: {exc}") from exc
        if getattr(result, "unexpected_keys", None):
            raise LossInputError("The checkpoint's LoRA covers other layers than this model's.")
        self.optimizer = torch.optim.AdamW(self.params, lr=1e-4, betas=(0.9, 0.95), eps=1e-12)
        if optimizer:
            self.optimizer.load_state_dict(torch.load(folder / OPTIMIZER_FILE, weights_only=True))
        self.optimizer.zero_grad(set_to_none=True)
