"""Deploy: from the registry to a serving node (DESIGN §6b).

    pull     the artifact this node should serve and everything it serves from, in one
             directory, with `serve.json`: the command that serves it here
    serve    pull into a cache-backed directory, then run the server in the foreground
    command  the serve argv for this node, from what a manifest records (pure)
    runtime  the runtime executables found on this node
    dest     the directory a pull fills: staged, then put into place all or nothing
    tokenizer  where an engine's tokenizer directory comes from (its own, or its provenance)
    warm     the warm cache of this node: its key, the runtimes' cache variables, and the
             exact-match lookup and placement a pull does (`pipeline.serving.warm` captures)

`pipeline.deploy.pull.pull` and `pipeline.deploy.serve.serve` are the public functions the
CLI calls; deploy tools import them.

May import: the standard library, `registry`, and the lower layers of `pipeline` (`errors`,
`settings`, `host` for the process runner and vLLM's Python, `stages.serve`'s argv forms,
planning's toolchain probe, `planning.capacity` and `planning.keys`). Never `click` (only
`pipeline.cli` does), `pipeline.cli`, `pipeline.nightly`, `pipeline.executors` or
`pipeline.serving` — those import this package.
"""
