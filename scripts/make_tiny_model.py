"""Make the tiny Llama that every CPU machine can quantize, convert and serve.

    .venv/bin/python scripts/make_tiny_model.py OUTDIR [--head-dim 64] [--seed 0]

A 2-layer Llama (hidden 128, intermediate 256, vocab 1024) with random weights drawn from a
fixed seed and saved as bf16 safetensors, a byte-level BPE tokenizer trained here on a small
built-in English corpus, a Llama-3-style chat template and a generation config. Nothing comes
from a hub. The same arguments always give the same files, and a second run with the same
arguments does nothing: OUTDIR/.enginectl-tiny-model.json records them and the files written.

--head-dim 64 (2 heads) is the model everything uses; INT4-AWQ needs in_features divisible by
its block (128), which hidden 128 gives. --head-dim 16 (8 heads) exists for tests of what a
runtime refuses. Needs torch, transformers and tokenizers (scripts/install-quantize).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

# Bump when the files this script writes change, so old directories are remade.
FORMAT = 1
STAMP = ".enginectl-tiny-model.json"

HIDDEN = 128
INTERMEDIATE = 256
LAYERS = 2
VOCAB = 1024
MAX_POSITIONS = 2048
ROPE_THETA = 10000.0

BOS, EOS, EOT, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|pad|>"
HEADER_START, HEADER_END = "<|start_header_id|>", "<|end_header_id|>"
SPECIAL_TOKENS = [BOS, EOS, EOT, PAD, HEADER_START, HEADER_END]

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] | trim }}<|eot_id|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)

CORPUS = """\
The quick brown fox jumps over the lazy dog while the engineers build their engines.
Large language models are served on GPUs with compiled engines or with general runtimes.
A calibration set gives the quantizer activations that look like real traffic.
Paris is the capital of France, and Berlin is the capital of Germany.
Rome is the capital of Italy, Madrid is the capital of Spain, and Lisbon is in Portugal.
Write a short poem about the sea, the wind, and a lighthouse keeper at night.
Summarise the meeting: the team agreed to ship the release on Thursday after testing.
The weather today is sunny with a light breeze from the west and a few clouds.
Tomorrow it will rain in the morning, but the afternoon should be dry and warm.
She opened the window, made a cup of tea, and read the letter twice before answering.
He walked to the station, bought a ticket, and waited for the train to the city.
The children played in the garden until their mother called them in for dinner.
Our cat sleeps on the sofa all day and runs around the house all night.
Please answer the question in one sentence and explain your reasoning briefly.
What is the largest planet in the solar system? Jupiter is the largest planet.
How many days are there in a week? There are seven days in a week.
Water boils at one hundred degrees Celsius at sea level and freezes at zero.
The history of computing began with mechanical calculators and punched cards.
Modern processors run billions of instructions every second on many cores.
A good recipe lists its ingredients first and then explains every step in order.
Mix the flour, sugar and butter, add two eggs, and bake the cake for forty minutes.
The library opens at nine in the morning and closes at six in the evening.
Students should read the first three chapters before the lecture on Monday.
The river flows through the valley, past the old mill, and into the sea.
Mountains covered in snow rise above the green forests and quiet lakes.
The doctor told him to drink more water, sleep well, and walk every day.
Music, painting and literature help people share their feelings and ideas.
The market was full of fresh fruit, warm bread, cheese, flowers and fish.
Every good story has a beginning, a middle and an end that surprises the reader.
The company hired new engineers to improve the speed and quality of its service.
Customers asked for lower prices, faster delivery and better support by email.
A user sends a request, the server reads it, and the model writes an answer.
Tokens are pieces of words; the tokenizer turns text into numbers and back again.
Thank you for your help. You are welcome, and have a wonderful day.
Hello, how are you? I am fine, thank you. What would you like to talk about?
Can you tell me a joke? Why did the scientist trust the atom? It made everything up.
One, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve.
January, February, March, April, May, June, July, August, September, October.
Red, orange, yellow, green, blue, indigo and violet are the colours of the rainbow.
def add(a, b):
    return a + b
for item in items:
    print(item)
if value is None:
    raise ValueError("missing value")
"""


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="make_tiny_model.py", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--head-dim", type=int, choices=[16, 32, 64, 128], default=64)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def wanted(args: argparse.Namespace) -> dict[str, Any]:
    return {"format": FORMAT, "head_dim": args.head_dim, "seed": args.seed}


def is_complete(outdir: Path, want: dict[str, Any]) -> bool:
    try:
        stamp = json.loads((outdir / STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(stamp, dict) or stamp.get("args") != want:
        return False
    files = stamp.get("files")
    return isinstance(files, list) and bool(files) and all((outdir / f).is_file() for f in files)


def train_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = CORPUS.splitlines()
    tokenizer.train_from_iterator(lines, trainer=trainer, length=len(lines))
    bos_id = tokenizer.token_to_id(BOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tokenizer


def make(outdir: Path, head_dim: int, seed: int) -> list[str]:
    """Write the model into *outdir*; return the files written (relative names)."""
    import torch
    from transformers import (
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedTokenizerFast,
    )

    backend = train_tokenizer()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS,
        eos_token=EOT,
        pad_token=PAD,
        chat_template=CHAT_TEMPLATE,
        model_input_names=["input_ids", "attention_mask"],
        model_max_length=MAX_POSITIONS,
        clean_up_tokenization_spaces=False,
    )
    if len(tokenizer) > VOCAB:
        raise RuntimeError(f"tokenizer has {len(tokenizer)} tokens, more than the vocab {VOCAB}")
    ids = {name: tokenizer.convert_tokens_to_ids(name) for name in (BOS, EOS, EOT, PAD)}

    heads = HIDDEN // head_dim
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=head_dim,
        hidden_act="silu",
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-5,
        rope_theta=ROPE_THETA,
        tie_word_embeddings=False,
        bos_token_id=ids[BOS],
        eos_token_id=[ids[EOT], ids[EOS]],
        pad_token_id=ids[PAD],
        torch_dtype="bfloat16",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=ids[BOS],
        eos_token_id=[ids[EOT], ids[EOS]],
        pad_token_id=ids[PAD],
        do_sample=False,
    )

    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / STAMP).unlink(missing_ok=True)
    model.save_pretrained(outdir, safe_serialization=True)
    # The chat template stays inside tokenizer_config.json, where every transformers reads it
    # (4.5x would otherwise write chat_template.jinja, which older readers do not know).
    tokenizer.save_pretrained(outdir, save_jinja_files=False)
    return sorted(
        str(p.relative_to(outdir)) for p in outdir.rglob("*") if p.is_file() and p.name != STAMP
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if HIDDEN % args.head_dim:
        raise SystemExit(f"make_tiny_model: --head-dim must divide the hidden size {HIDDEN}")
    want = wanted(args)
    outdir: Path = args.outdir
    if is_complete(outdir, want):
        print(f"make_tiny_model: {outdir} is up to date", file=sys.stderr)
        return 0
    files = make(outdir, args.head_dim, args.seed)
    stamp = {"args": want, "files": files}
    (outdir / STAMP).write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n", "utf-8")
    print(f"make_tiny_model: wrote {outdir} ({len(files)} files)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
