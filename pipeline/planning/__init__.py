"""Planning: from a read recipe to the DAG of stage runs, each with its key.

    source       what the recipe's model source says (config.json, content digest, the
                 commit of a branch, the calibration file): the I/O planning does, cached
    target       `Target`, one point of the matrix, and `selects`
    targets      the matrix expanded and checked (support, shape, memory, tool rules)
    memory       weights + KV cache against a GPU's memory
    tool_rules   what the real tools would refuse, said at plan time
    keys         stage keys
    versions     version strings as fingerprints keep them
    toolchain    toolchain fingerprints: this machine's probe (the one reading of
                 nvidia-smi, `query_gpus`; the Pythons), pins, what each stage is keyed with
    capacity     GPUs a run or an artifact needs against what a node has (`shortfall`)
    channels     the recipe's promotion channels rendered over the plan's targets
    plan         `plan_recipe` -> `Plan`
    outcome      what a stage run of the plan came to, and a build's summary (the
                 executors write them, the nightly and promote read them)

May import `pipeline.stages` (argv builders, the Hub boundary), `pipeline.recipe`,
`pipeline.host` (the process runner for the probes, vLLM's Python), `pipeline.errors`,
`pipeline.settings` and `registry`. Never deploy, serving, executors, the nightly, the CLI
or click. Pure but for `source` (files and the Hub, cached) and `toolchain`'s probes
(subprocesses; `capacity.this_node` reads nvidia-smi through it).
"""
