"""Where things live on this machine, from the environment. Nothing here changes a key.

    ENGINECTL_HOME            data directory
                              (default: $XDG_DATA_HOME/enginectl, else ~/.local/share/enginectl)
    ENGINECTL_WORK_DIR        stage work directories (default: <home>/work)
    ENGINECTL_TRTLLM_EXAMPLES TensorRT-LLM's examples/
                              (default: /app/tensorrt_llm/examples, as in the release image)
    ENGINECTL_PYTHON          the Python that runs TRT-LLM and modelopt scripts
                              (default: the Python running enginectl)
    ENGINECTL_VLLM_PYTHON     the Python of vLLM's environment (default: python3)
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from registry.config import data_home


@dataclass(frozen=True, slots=True)
class Settings:
    home: Path
    work_dir: Path
    trtllm_examples: Path
    python: str
    vllm_python: str

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        home = data_home(env)
        return cls(
            home=home,
            work_dir=Path(env.get("ENGINECTL_WORK_DIR") or home / "work").expanduser(),
            trtllm_examples=Path(
                env.get("ENGINECTL_TRTLLM_EXAMPLES") or "/app/tensorrt_llm/examples"
            ),
            python=env.get("ENGINECTL_PYTHON") or sys.executable,
            vllm_python=env.get("ENGINECTL_VLLM_PYTHON") or "python3",
        )
