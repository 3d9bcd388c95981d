"""The content-addressed store: the interface (`base`), opening one from its URL (`opener`),
the `file://` backend (`filestore`), the S3 backend (`s3store`, with its multipart upload in
`s3upload`) and its transfer parts (`s3bucket`: boto3 control calls; `s3get`: obstore ranged
reads; `s3sendfile` and `s3splice`: the kernel moving bodies over plain http; `ranges`:
parallel ranged reads into one file), and the local fetch cache (`cache`).

May import `registry.identity`, `registry.errors` and `registry.workers`; never `registry.sql`,
`registry.ops` or SQLAlchemy. Only `opener` imports the backends; boto3 is imported only when
an `s3://` store is opened.
"""
