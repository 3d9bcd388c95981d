"""docs/try-without-a-gpu.md documents the stand-ins' knobs that scripts/try-nightly and a
newcomer use, and only knobs the stand-ins read; the script sets its own home (never the
user's) and the README links the page. (The script itself runs in CI's main job,
scripts/main, on a clean clone.)"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "try-without-a-gpu.md").read_text(encoding="utf-8")
SCRIPT = (ROOT / "scripts" / "try-nightly").read_text(encoding="utf-8")
KNOB = re.compile(r"\bFAKE_[A-Z0-9_]+\b")


def stand_in_knobs() -> set[str]:
    """Every FAKE_* name a stand-in reads from its environment."""
    read = re.compile(r"""environ(?:\.get\(|\[)\s*["'](FAKE_[A-Z0-9_]+)["']""")
    found: set[str] = set()
    for path in (ROOT / "tests" / "fakes").rglob("*"):
        if path.is_file() and path.suffix in ("", ".py") and "__pycache__" not in path.parts:
            found |= set(read.findall(path.read_text(encoding="utf-8", errors="replace")))
    return found


def test_the_page_documents_every_knob_the_script_uses_and_only_real_ones() -> None:
    documented = set(KNOB.findall(PAGE))
    assert set(KNOB.findall(SCRIPT)) - {"FAKE_"} <= documented
    assert documented <= stand_in_knobs()
    assert {"FAKE_NVIDIA_SMI_CONFIG", "FAKE_OPENAI_TOKEN_DELAY_S",
            "FAKE_TRTLLM_VERSION"} <= documented  # GPU and driver, speed, release


def test_the_script_runs_in_a_temp_home_on_the_stand_ins_and_the_readme_links_it() -> None:
    assert 'export ENGINECTL_HOME=$work/home' in SCRIPT
    assert 'export ENGINECTL_CACHE_DIR=$work/cache' in SCRIPT  # the fetch cache: not ~/.cache
    assert 'work=$(mktemp -d' in SCRIPT
    assert "export PATH=$root/tests/fakes/bin:$PATH" in SCRIPT
    assert "(docs/try-without-a-gpu.md)" in (ROOT / "README.md").read_text(encoding="utf-8")
    assert "scripts/try-nightly" in (ROOT / "scripts" / "main").read_text(encoding="utf-8")
