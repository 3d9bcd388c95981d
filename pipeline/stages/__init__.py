"""Stages: one module per stage of the chain, with the argv of its external program.

    snapshot    pin the source checkpoint (a local directory, the Hub, S3) and refuse garbage
    hub         the Hugging Face Hub boundary: every call to `huggingface_hub`, one error
    quantize    the modelopt driver's argv (`python -m pipeline.stages.quantizer`)
    quantizer/  the modelopt driver itself, its own program (run in the builder's Python)
    convert     TensorRT-LLM's per-family `convert_checkpoint.py` argv
    build       `trtllm-build`'s argv and the plugin settings it really applies
    serve       the serving argv of the three runtimes (trtllm-serve, vLLM on GPU and CPU)
    timing_cache  the TensorRT timing cache of engine builds, one per (GPU SKU, SM, TensorRT,
                CUDA, tactic flags): read before trtllm-build, published after; not in the key

The argv builders (quantize, convert, build, serve) are pure: planning imports them to key
each stage run. What runs a stage with its plan lives above: `pipeline.executors.work`, and
for the smoke stage `pipeline.serving.smoke_here`. May import: the standard library,
`registry`, `pipeline.errors`, `pipeline.settings`, `pipeline.recipe` and `pipeline.host`.
Never planning, deploy, serving, executors, the nightly, the CLI or `click`.
"""
