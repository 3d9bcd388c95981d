"""enginectl's modelopt driver: quantize a Hugging Face checkpoint and export it.

    python -m pipeline.stages.quantizer --model_dir DIR --dtype bfloat16 --qformat fp8 \\
        [--kv_cache_dtype fp8] --calib_dataset calib.jsonl --calib_size 16 \\
        --calib_max_seq_length 64 --batch_size 4 [--awq_block_size 128] \\
        [--tp_size 1 --pp_size 1 | --export_format hf] --output_dir OUT

Its flags are a subset of TensorRT-LLM's `examples/quantization/quantize.py`, spelled the same
(`--export_format` is from one version of it; `--traceback` is ours), so the argv that
`pipeline.stages.quantize.quantize_argv` emits reads the same to anyone who knows that script.

What it does: load the model (CPU unless CUDA is there) and tokenizer; run NVIDIA modelopt
post-training quantization with the qformat's config (plus a KV-cache config) over calibration
text from a local `.jsonl` ("text" per line) or text file, or a named dataset when `datasets`
is installed; export a TensorRT-LLM checkpoint (`config.json` + `rank{N}.safetensors`) or a
unified Hugging Face checkpoint; copy the tokenizer beside it; check what was written (the
ranks, the quantization algorithms, the mapping, `rotary_base` against the source's
`rope_theta`); record what was done in `enginectl-quantize.json`. The output appears whole or
not at all: it is written beside OUT and renamed into place after the checks.

Exit status: 0 done, 1 failed (one `quantizer: error: ...` line on stderr; the stack with
`--traceback`), 2 bad usage. torch, transformers and modelopt are imported only when the
work starts, so importing this module is cheap.

    options   the flags, the constants they name, and the calibration text
    checks    what is checked before the work and on what was written (pure)
    run       the work (`quantize`) and `main`; `__main__` runs it

Its own program: imports the standard library and, when the work starts, torch,
transformers and modelopt; nothing of enginectl.
"""
