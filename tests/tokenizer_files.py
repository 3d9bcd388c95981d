"""A small real tokenizer for test checkpoints: what transformers' AutoTokenizer loads and
what trtllm-serve (and its stand-in) renders chat with.

    write_tokenizer(model_dir)                  # tokenizer.json, tokenizer_config.json
    write_tokenizer(model_dir, chat=False)      # a tokenizer without a chat template

A word-level vocabulary over a few hundred words (unknown words map to <unk>), built with the
`tokenizers` library, no hub. scripts/make_tiny_model.py makes the full tiny Llama; this is for
tests that need only a directory the runtime can load, fast.
"""

from __future__ import annotations

import json
from pathlib import Path

BOS, EOS, UNK = "<s>", "</s>", "<unk>"
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|> "
    "{{ message['content'] }} {% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
_TEXT = (
    "the quick brown fox jumps over lazy dog capital of france is paris hello world a an "
    "and or to in on at for with what who how why when where this that it be are was were "
    "tell me about say something short answer question please one two three four five"
)
WORDS = tuple(_TEXT.split())


def write_tokenizer(root: Path, *, chat: bool = True) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {word: index for index, word in enumerate([UNK, BOS, EOS, *dict.fromkeys(WORDS)])}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    root.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(root / "tokenizer.json"))
    config: dict[str, object] = {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS,
        "unk_token": UNK, "model_max_length": 4096,
    }
    if chat:
        config["chat_template"] = CHAT_TEMPLATE
    (root / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return root
