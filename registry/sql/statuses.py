"""The statuses an artifact and a stage run can have, apart from the ORM models (whose CHECK
constraints are made of them), so that a command that only checks a `--status` or reads on
the database driver imports no SQLAlchemy."""

from __future__ import annotations

from typing import Final

ARTIFACT_STATUSES: Final = ("building", "built", "ready", "quarantined", "superseded", "deleted")
RUN_STATUSES: Final = ("running", "succeeded", "failed", "cancelled")
