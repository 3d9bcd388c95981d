#!/usr/bin/env python3
"""Stand-in for TensorRT-LLM's examples/models/core/llama/convert_checkpoint.py.

Accepts exactly the real script's flags (tests/data/cli/trtllm-llama-convert.json), reads
the HF config.json, and writes a TRT-LLM checkpoint's shape: config.json (architecture,
dtype, mapping, quantization, rotary_base) and one rank{N}.safetensors per tp × pp rank.
It converts no weights.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from cli_contract import parser_for

args = parser_for("trtllm-llama-convert", "convert_checkpoint.py").parse_args()
hf = json.loads((Path(args.model_dir) / "config.json").read_text())
tp, pp = int(args.tp_size or 1), int(args.pp_size or 1)
out = Path(args.output_dir or "tllm_checkpoint")
out.mkdir(parents=True, exist_ok=True)
config = {
    "architecture": hf.get("architectures", ["LlamaForCausalLM"])[0],
    "dtype": args.dtype or "auto",
    "num_hidden_layers": hf["num_hidden_layers"],
    "hidden_size": hf["hidden_size"],
    "vocab_size": hf["vocab_size"],
    "rotary_base": hf.get("rope_theta", 10000.0),
    "quantization": {"quant_algo": None, "kv_cache_quant_algo": None},
    "mapping": {"world_size": tp * pp, "tp_size": tp, "pp_size": pp},
}
(out / "config.json").write_text(json.dumps(config, indent=2))
for rank in range(tp * pp):
    (out / f"rank{rank}.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
print(f"Total time of converting checkpoints: 00:00:00 ({tp * pp} ranks)")
