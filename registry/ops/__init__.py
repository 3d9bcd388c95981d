"""Operations over the store and the SQL registry together: what the CLI's verbs call.

    publish       store a directory as an artifact and register it, in crash-safe phases
    fetch         what a ref fetches: the artifact, its manifest, what is said of its status
    fetch_files   placing a manifest's files through the cache, all or nothing
    gc, fsck      remove what nothing references; check every manifest and blob matches
    damage        set a damaged blob or manifest aside (and find those set aside)
    inventory     ls and show: what the registry holds, with aliases, provenance, smokes
    resolve       which artifact a node with this GPU should serve: pure ranking over rows
    reindex       rebuild an empty registry from the store (the bucket is the whole truth)
    adopt         `enginectl import`: adopt an engine or checkpoint built elsewhere

May import everything else in `registry` (identity, store, sql, the top-level helpers), never
`pipeline`. Importing this package imports nothing: a fetch must stay free of SQLAlchemy.
"""
