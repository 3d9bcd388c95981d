"""Executors: where a plan's stage runs execute, and the `enginectl build` and `fleet` verbs
that drive them.

The verbs
    build       `build_recipe`: a recipe's stage chain on this machine (or, asked, on Ray)
    noop        a build with nothing to do, answered from one read of the registry (no ORM)
    ray_build   `build_on_ray`: preflight, probe the pools, walk on the cluster
    fleet       `enginectl fleet`: what the Ray cluster has; `require_ray`
    view        a build as a person follows it: lines, a live table, the summary
    result      what a build returns (`BuildResult`), and the Ctrl-C error

Running stage runs
    dag         the walk in dependency order (hits, skips, keep-going, Ctrl-C), for every
                executor
    stage       one stage run on this machine: lease, inputs, run, validate, publish, smoke
    work        running one stage (`produce_output`): inputs in, a validated output out
    leaseguard  the heartbeat of a run's lease, and stopping the run when it is lost
    workdirs    the work directories of a build, removed once nothing reads them
    local       this machine's threads (the default); what each run came to, and a
                build's summary, are `pipeline.planning.outcome` (promote reads them too)

On a Ray cluster (Ray is imported only by these three, after `fleet.require_ray`)
    ray_cluster joining the cluster as a driver, and what it has now
    ray         `RayBackend`: runs as Ray tasks, timeouts and cancels from the driver
    ray_tasks   what runs on the nodes: the probe, one stage run, killing a frozen worker
    pools       pools and placement: where each run goes, what no node can run (pure)
    groups      what keys a pool's targets: its nodes' probes, groups of nodes (pure)

What `enginectl plan` shows
    preview     the plan keyed per pool as the builds would key it, built or not

The process runner every run goes through is `pipeline.host.runner`; the GPU check before a
run starts is `pipeline.planning.capacity`.

Every executor hands each run to `stage.StageWorker.run`, so the stage logic, its
validation and the publish are written once.

May import: the standard library, `registry`, and the lower layers of `pipeline` (`errors`,
`settings`, `host`, the recipe, `stages`, planning, `deploy`, and `serving` for smoking and
promotion). Never `click` (only `pipeline.cli` does), `pipeline.cli` or `pipeline.nightly`,
which import this package.
"""
