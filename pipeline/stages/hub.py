"""The Hugging Face Hub boundary: every call enginectl makes to `huggingface_hub` is here, and
whatever it raises (hub, network and offline errors share no useful base) becomes one
`HubError` naming the repo and revision. Callers say what they were doing (a recipe's
revision, a snapshot's download) in their own error. Imports nothing of enginectl but errors."""

from __future__ import annotations

from pathlib import Path

from registry.errors import EnginectlError


class HubError(EnginectlError):
    """The Hub (or the way to it) refused: *kind* is the exception's type name, *detail* its
    text."""

    def __init__(self, repo: str, revision: str | None, exc: Exception) -> None:
        self.repo = repo
        self.revision = revision
        self.kind = type(exc).__name__
        self.detail = str(exc)
        super().__init__(f"{repo}@{revision}: {self.kind}: {self.detail}")

    @property
    def first_line(self) -> str:
        """`Kind: the first line of the detail`."""
        return f"{self.kind}: {self.detail.splitlines()[0] if self.detail else ''}"


def resolve_commit(repo: str, revision: str) -> str | None:
    """The commit *revision* (a branch or tag) of model *repo* points at now, as the Hub
    says (None when it gives none)."""
    from huggingface_hub import HfApi

    try:
        return HfApi().model_info(repo, revision=revision).sha
    except Exception as exc:
        raise HubError(repo, revision, exc) from exc


def download(repo: str, revision: str | None, local_dir: Path) -> Path:
    """Model *repo* at *revision*, downloaded into *local_dir*."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id=repo, revision=revision, local_dir=local_dir))
    except Exception as exc:
        raise HubError(repo, revision, exc) from exc
