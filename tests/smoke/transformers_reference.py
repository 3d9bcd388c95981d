"""What the tiny Llama's greedy decode must be: the prompts, and transformers decoding them one
argmax at a time, as vLLM detokenizes completions (the reference vLLM's answers are held to)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.models import offline_env

PROMPTS = ["The capital of France is", "Write a haiku about GPUs."]
MAX_TOKENS = 8


# Greedy decoding with transformers, one argmax at a time (no EOS handling, like ignore_eos),
# decoded as vLLM detokenizes completions: special tokens skipped.
TRANSFORMERS_GREEDY = """
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
model_dir, max_tokens, prompts = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
tokenizer = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
texts = []
with torch.no_grad():
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        start = ids.shape[1]
        for _ in range(max_tokens):
            next_id = model(ids).logits[0, -1].float().argmax()
            ids = torch.cat([ids, next_id.view(1, 1)], dim=1)
        texts.append(tokenizer.decode(ids[0, start:], skip_special_tokens=True))
print(json.dumps(texts))
"""


def transformers_greedy(model_dir: Path) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", TRANSFORMERS_GREEDY, str(model_dir), str(MAX_TOKENS), *PROMPTS],
        env=offline_env(), capture_output=True, text=True, timeout=600, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    texts: list[str] = json.loads(proc.stdout)
    return texts
