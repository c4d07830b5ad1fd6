"""`make install` writes bytecode for what the worker runs (scripts/compile_worker_bytecode.py),
since a sandboxed training process cannot: every module the training imports is among the files
it compiles, but the few the libraries take only when they are there; the control plane's and the
tests' packages are left to their first import."""

import json
from pathlib import Path

from scripts.compile_worker_bytecode import sources
from tests import model_python

# What worker.train imports as it builds a trainer of each method (in the model checks' process,
# which has torch, transformers and PEFT already: the test process never imports them).
TRAINING_IMPORTS = """
import json, sys
import datasets, torch.distributed
from peft import LoraConfig, PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import DPOTrainer, GRPOTrainer, SFTTrainer
import worker.graders, worker.train
print(json.dumps([getattr(m, "__file__", None) for m in list(sys.modules.values())]))
"""


def test_the_modules_a_training_imports_are_compiled_at_install():
    imported = json.loads(model_python.run(TRAINING_IMPORTS).stdout)
    ours = {
        f for f in imported if f and f.endswith(".py") and ("site-packages" in f or "/worker/" in f)
    }
    compiled = set(sources())
    missing = ours - compiled
    assert len(ours) > 3000 and len(missing) < 0.02 * len(ours), sorted(missing)
    assert not {Path(f).parent.name for f in missing} & {"torch", "transformers", "trl", "worker"}
    others = ("/site-packages/stripe/", "/site-packages/openai/", "/site-packages/moto/")
    assert not [f for f in compiled if f.startswith(others, f.find("/site-packages/"))]
