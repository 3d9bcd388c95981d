"""Operations over the store and the SQL registry together: what the CLI's verbs call. The
only room that holds a `Context` and changes the store and SQL together (`registry.sql` is
functions over a session, `registry.store` moves bytes).

    publish       store a directory as an artifact and register it, in crash-safe phases
    fetch         what a ref fetches: the artifact, its manifest, what is said of its status
    fetch_files   placing a manifest's files through the cache, all or nothing
    placement     the one way pull, serve and fetch put a directory in place; target: what
                  they may replace; marker: what a former placement left to prove it
    gc, fsck      remove what nothing references; check every manifest and blob matches
    damage        set a damaged blob or manifest aside (and find those set aside)
    inventory     ls and show: what the registry holds, with aliases, provenance, smokes
    resolve       which artifact a node with this GPU should serve: pure ranking over rows
    alias_fit     which of an alias's targets fits this node's toolchain
    reindex       rebuild an empty registry from the store (the bucket is the whole truth)
    adopt         `enginectl import`: adopt an engine or checkpoint built elsewhere
    history       status changes, smoke reports and alias moves: store record, then SQL row
    aliases       tag, untag and rollback: name and status checks, then history
    pending       a publish's blobs in flight, kept from gc until its rows commit
    logs          a stage run's log stored as a blob when its lease is released; reading it

May import everything else in `registry` (identity, store, sql, the top-level helpers), never
`pipeline`. Importing this package imports nothing: a fetch must stay free of SQLAlchemy.
"""
