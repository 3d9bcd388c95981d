"""What an artifact is, as pure values: canonical JSON (`canonical`), digests (`digest`),
manifests (`manifest`), the store's key layout (`layout`) and the refs users type (`refs`).

Pure code over plain values and local files: this package imports only `registry.errors`
and itself — never `registry.store`, never `registry.sql`, never SQLAlchemy or boto3.
"""
