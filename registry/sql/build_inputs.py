"""What builds are made from, in SQL: the recipes they read (by content digest, with where
each name was last read, which a nightly without arguments rebuilds) and the toolchains
probed on the pools.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from registry.sql.models import Recipe, ToolchainRow, utcnow
from registry.sql.rows import insert_for


def record_recipe(session: Session, digest: str, name: str, text: str) -> bool:
    """Store a recipe's text under its content digest; False when it was already there."""
    stmt = insert_for(session, Recipe).values(
        digest=digest, name=name, text=text, created_at=utcnow()
    )
    inserted = session.execute(stmt.on_conflict_do_nothing().returning(Recipe.digest)).first()
    return inserted is not None


def touch_recipe(session: Session, digest: str, path: Path) -> None:
    """Note that the recipe stored under *digest* was just built from *path* (what a
    nightly without arguments reads: every recipe at its latest content)."""
    session.execute(update(Recipe).where(Recipe.digest == digest)
                    .values(path=str(path.resolve()), last_used_at=utcnow()))


@dataclass(frozen=True, slots=True)
class RecordedRecipe:
    digest: str
    name: str
    text: str
    path: str


def recorded_recipes(session: Session) -> list[RecordedRecipe]:
    """Each recipe name's latest built content (with where it was read), by name."""
    query = (select(Recipe.digest, Recipe.name, Recipe.text, Recipe.path)
             .where(Recipe.path.is_not(None), Recipe.last_used_at.is_not(None))
             .order_by(Recipe.last_used_at, Recipe.digest))
    latest = {row.name: RecordedRecipe(row.digest, row.name, row.text, row.path or "")
              for row in session.execute(query)}
    return [latest[name] for name in sorted(latest)]


def get_recipe_text(session: Session, digest: str) -> str | None:
    """The text of the recipe stored under *digest*, if any."""
    return session.scalar(select(Recipe.text).where(Recipe.digest == digest))


@dataclass(frozen=True, slots=True)
class ToolchainProbe:
    """A toolchain fingerprint probed on one pool (`host:<name>` for a machine, a GPU SKU
    for a Ray pool) at one time, on one host."""

    pool: str
    gpu: str
    fingerprint: dict[str, Any]
    host: str
    probed_at: datetime
    node_id: str | None = None  # the Ray node probed (None off Ray)


def record_toolchain(session: Session, pool: str, gpu: str | None,
                     fingerprint: dict[str, Any], host: str, *,
                     node_id: str | None = None, probed_at: datetime | None = None) -> None:
    """Record a probe of *pool* (*gpu* None: no GPU, recorded as "CPU") on *host* (and Ray
    node *node_id*); the nodes of one probing share *probed_at* (default: now)."""
    session.execute(insert(ToolchainRow).values(
        pool=pool, gpu=gpu or "CPU", fingerprint=fingerprint, host=host,
        probed_at=probed_at or utcnow(), node_id=node_id))


def toolchain_history(session: Session, pool: str, limit: int = 2) -> list[ToolchainProbe]:
    """The last *limit* probes of *pool*, newest first."""
    query = (
        select(ToolchainRow.pool, ToolchainRow.gpu, ToolchainRow.fingerprint, ToolchainRow.host,
               ToolchainRow.probed_at, ToolchainRow.node_id)
        .where(ToolchainRow.pool == pool)
        .order_by(ToolchainRow.probed_at.desc(), ToolchainRow.id.desc()).limit(limit)
    )
    return [ToolchainProbe(*row) for row in session.execute(query)]
