"""Version strings as real images print them, made into the values a fingerprint holds. Pure.

One rule for every package (`fingerprint_version`); what it does to the forms seen in the
TensorRT-LLM 1.2 release image, NGC containers and local installs:

    TensorRT       10.14.1.48                   10.14.1.48   all four parts: TensorRT refuses
                                                             an engine serialized by another
                                                             build of it, so the build number
                                                             matters
    NGC torch      2.9.0a0+145a3a7bda.nv25.10   2.9.0a0+145a3a7bda
                                                             a pre-release names its source by
                                                             commit: two 2.9.0a0 builds from
                                                             different commits are different
                                                             code; the container release
                                                             (nv25.10) is packaging
    TRT-LLM        1.2.0rc1                     1.2.0rc1
    local tags     2.13.0+cpu, 2.9.1+cu130      2.13.0, 2.9.1
                                                             the CUDA a torch was built for is
                                                             the fingerprint's own `cuda` field
                                                             (torch.version.cuda), not part of
                                                             the torch version
    git describe   0.6.4.dev12+g1234abc.cu124   0.6.4.dev12+g1234abc

CUDA versions (`cuda_release`) keep major.minor, the form torch.version.cuda and nvidia-smi's
banner print (`12.9`, `13.0`); a toolkit version such as the NGC images' CUDA_VERSION
(`13.0.2.006`) is cut to that form.
"""

from __future__ import annotations

import re
from typing import Final

_PUBLIC: Final = re.compile(r"^\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?$")
_COMMIT: Final = re.compile(r"^g?[0-9a-f]{7,40}$")
_CUDA: Final = re.compile(r"^(\d+)\.(\d+)(\.\d+)*$")


def fingerprint_version(text: str | None) -> str | None:
    """The fingerprint value of a package version as its metadata prints it (module doc);
    None for no version. A form this does not know is kept whole (stripped), so that a
    change in it still changes the key."""
    if text is None or not text.strip():
        return None
    text = text.strip()
    public, _, local = text.partition("+")
    if not _PUBLIC.match(public):
        return text
    commits = [part for part in local.split(".") if _COMMIT.match(part)] if local else []
    return f"{public}+{'.'.join(commits)}" if commits else public


def cuda_release(text: str | None) -> str | None:
    """major.minor of a CUDA version (`13.0.2.006` → `13.0`); None for none; an unknown
    form kept whole."""
    if text is None or not text.strip():
        return None
    text = text.strip()
    found = _CUDA.match(text)
    return f"{found.group(1)}.{found.group(2)}" if found else text
