#!/usr/bin/env python3
"""Stand-in for TensorRT-LLM's examples/models/core/llama/convert_checkpoint.py.

Accepts exactly the real script's flags, arity and value types (tests/data/cli/
trtllm-llama-convert.json: `--tp_size two` exits 2 as argparse's type=int does), reads the HF
config.json, and writes a TRT-LLM checkpoint's shape: config.json with the fields trtllm-build
reads from it (architecture, dtype, max_position_embeddings, rotary_base, rotary_scaling,
quantization, mapping) and one rank{N}.safetensors per tp x pp rank holding that rank's share
of the HF weights: each tensor of the model's *.safetensors split into tp x pp parts of its
bytes, under its HF name (a real checkpoint is about the size of its weights; the stand-in
does not rename or reshape them). A model whose weights are not safetensors gives ranks
without tensors.

Test knob: FAKE_CONVERT_SKIP_RANK=N exits 0 without writing rank{N}.safetensors.
FAKE_GPU_ENV_LOG=path appends a JSON line with the CUDA_VISIBLE_DEVICES it was started with
(null when unset): which GPUs the real script would see.
"""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from cli_contract import parse
from weights import read_safetensors, write_safetensors

args = parse("trtllm-llama-convert", "convert_checkpoint.py")
if os.environ.get("FAKE_GPU_ENV_LOG"):
    with Path(os.environ["FAKE_GPU_ENV_LOG"]).open("a", encoding="utf-8") as record:
        print(json.dumps({"tool": "convert_checkpoint.py", "output_dir": args["output_dir"],
                          "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}),
              file=record, flush=True)
if args["model_dir"] is None:  # the real script falls back to synthetic weights; not here
    sys.exit("convert_checkpoint.py (stand-in): --model_dir is required")
hf = json.loads((Path(args["model_dir"]) / "config.json").read_text())
tp, pp = args["tp_size"] or 1, args["pp_size"] or 1
dtype = args["dtype"] or "auto"
if dtype == "auto":  # --dtype help: inferred from the source model, float32 becomes float16
    dtype = {"float32": "float16"}.get(hf.get("torch_dtype"), hf.get("torch_dtype") or "float16")
quant_algo = "FP8" if args["use_fp8"] else None
kv_algo = "FP8" if args["fp8_kv_cache"] else "INT8" if args["int8_kv_cache"] else None
out = Path(args["output_dir"] or "tllm_checkpoint")
out.mkdir(parents=True, exist_ok=True)
config = {
    "architecture": hf.get("architectures", ["LlamaForCausalLM"])[0],
    "dtype": dtype,
    "num_hidden_layers": hf["num_hidden_layers"],
    "num_attention_heads": hf["num_attention_heads"],
    "num_key_value_heads": hf.get("num_key_value_heads", hf["num_attention_heads"]),
    "hidden_size": hf["hidden_size"],
    "intermediate_size": hf.get("intermediate_size"),
    "vocab_size": hf["vocab_size"],
    "max_position_embeddings": hf.get("max_position_embeddings"),
    "rotary_base": hf.get("rope_theta", 10000.0),
    "rotary_scaling": hf.get("rope_scaling"),
    "quantization": {"quant_algo": quant_algo, "kv_cache_quant_algo": kv_algo},
    "mapping": {"world_size": tp * pp, "tp_size": tp, "pp_size": pp},
}
(out / "config.json").write_text(json.dumps(config, indent=2))
skip = os.environ.get("FAKE_CONVERT_SKIP_RANK")
hf_weights = {}
for path in sorted(Path(args["model_dir"]).glob("*.safetensors")):
    hf_weights.update(read_safetensors(path))
world = tp * pp
for rank in range(world):
    if skip is not None and rank == int(skip):
        continue
    share = {}
    for name, (_entry, data) in hf_weights.items():
        step = -(-len(data) // world)
        part = data[rank * step:(rank + 1) * step]
        share[name] = ("U8", [len(part)], part)
    write_safetensors(out / f"rank{rank}.safetensors", share)
print(f"Total time of converting checkpoints: 00:00:00 ({tp * pp} ranks)")
