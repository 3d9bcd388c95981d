"""Executors: where a plan's stage runs execute.

    dag       the walk in dependency order (hits, skips, keep-going, Ctrl-C), for every executor
    stage     one stage run on this machine: lease, inputs, run, validate, publish, smoke
    local     this machine's threads (the default)
    runner    the process runner every external program goes through
    outcome   what a run came to, and a build's summary

Every executor hands each run to `stage.StageWorker.run`, so the stage logic, its
validation and the publish are written once.
"""
