"""The nightly requalification (`enginectl nightly`): `run` does it, `diff` says what a
toolchain change moved (pure), `report` renders and sends what happened."""
