"""The pipeline side of enginectl: from a recipe to proven, promoted artifacts, and onto
serving nodes. Each room has its own docstring; from the bottom up, each importing only the
rooms below it (import-linter's contracts in pyproject.toml check it):

    host/       this machine: the process runner and its guard, which Python runs vLLM
    recipe/     the recipe's schema and its reader (pure)
    stages/     one module per stage: its external program's argv (pure), the Hub, the
                quantizer driver
    planning/   targets, memory fit, keys, toolchain fingerprints, GPU capacity, the plan
    deploy/     from the registry to a serving node: pull, serve
    serving/    serving an artifact and judging it: smoke (and smoking an artifact here),
                load, compare, A/B gate, promote
    executors/  where stage runs execute (this machine, Ray), running a stage, the build
                that drives them, what `plan` shows
    nightly/    the nightly requalification
    cli/        the `enginectl` command line, the only importer of click

Beside them, at the top level, the modules every room reads and none owns:

    errors      the pipeline's errors (exit codes), under registry.errors.EnginectlError
    settings    where things live on this machine, from the environment (imports `host`)
    listings    the text the CLI and a build print for plans and the registry's listings
    info        `enginectl info`: locations, reachability and runtimes, read by the CLI only
                but drawing on settings, serving's runtimes and the registry alike

`pipeline` may import `registry`; `registry` never imports `pipeline`.
"""
