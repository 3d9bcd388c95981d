"""The nightly requalification (`enginectl nightly`), what a scheduler runs every night.

    run      `nightly`: re-plan every recorded recipe on today's toolchain, build what moved,
             re-prove, gate and promote, one verdict per target
    verdict  the verdicts, the report types and the exit code from them (pure)
    diff     what a toolchain change moved: fingerprint fields and stage keys (pure)
    alarm    a toolchain regression: the same artifact slower than its last proof
    lease    the one nightly lease, kept by a heartbeat while a run lasts
    report   the text, the HTML page (`--html`) and the webhook POST (`--notify`)

May import: the standard library, `registry`, and the rest of `pipeline` below the CLI
(`errors`, `settings`, `host`, the recipe, planning, `executors`, `serving`). Never `click` (only
`pipeline.cli` does), `pipeline.cli` or `pipeline.deploy`.
"""
