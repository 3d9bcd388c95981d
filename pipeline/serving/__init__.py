"""Serving an artifact and judging what it served (DESIGN §7).

    loadgen   the OpenAI-API client and the load it sends; percentiles and cost (pure)
    checks    the checks run on a ready server (models, greedy, chat, stream, long prompt)
    server    an artifact's server as a process: started on a free port, awaited until it
              generates, always stopped (the whole group)
    smoke     serve an artifact, run the checks and the load: a smoke report
    smoke_here  smoking here: whether this machine can smoke an artifact, what it serves
              (`enginectl smoke REF`)
    verdict   the one smoke verdict, for `enginectl smoke REF` and a build's smoke stage:
              the checks with the recipe's references, a warm start retried cold, the
              machine's faults, then recording it and capturing the warm cache
    compare   the side-by-side table of a model's ready artifacts from their smoke reports;
              `compare_html` writes it as one page
    abgate    the nightly's same-run A/B of an alias's incumbent and its candidate
    warm      start a smoke's server so that its compile and tuning caches can be captured,
              and publish them after a pass as a `warm-cache` artifact
    promote   move a recipe's promotion aliases: after a build (an empty channel) or after
              the nightly's gate (the candidate won) — here because the gate decides it

May import: the standard library, `registry`, and the lower layers of `pipeline`
(`errors`, `settings`, `host`, the recipe, `stages`, planning, and `deploy` for an engine's
serve template, tokenizer and warm-cache key; `planning.outcome`, a build's outcomes).
Never `click` (only `pipeline.cli` does), `pipeline.cli`, `pipeline.nightly` or
`pipeline.executors` — those import this package.
"""
