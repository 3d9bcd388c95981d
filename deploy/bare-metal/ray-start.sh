#!/bin/sh
# Bare-metal pools for enginectl: one `ray start` per machine, in the builder image or a venv
# with the same enginectl[ray] and Python everywhere. Each GPU machine advertises its catalog
# SKU as the resource enginectl asks for, gpu:<SKU>, one unit per GPU, with as many --num-gpus.
# tests/unit/test_deploy_examples.py parses the lines below.
#
# Token auth: make one token and give it to every node and to every CLI that drives it:
#   export RAY_AUTH_MODE=token RAY_AUTH_TOKEN=$(openssl rand -hex 32)   # or RAY_AUTH_TOKEN_PATH
set -eu
case "${1:-}" in
  head)  # a CPU machine: snapshot and no-build entries run here; the Ray client on 10001
    ray start --head --port 6379 --ray-client-server-port 10001 --num-cpus 16 ;;
  h100)
    ray start --address "$HEAD:6379" --num-gpus 8 --resources '{"gpu:H100-SXM5-80GB": 8}' ;;
  l40s)
    ray start --address "$HEAD:6379" --num-gpus 4 --resources '{"gpu:L40S": 4}' ;;
  a100)
    ray start --address "$HEAD:6379" --num-gpus 8 --resources '{"gpu:A100-SXM4-80GB": 8}' ;;
  *)
    echo "usage: HEAD=host deploy/bare-metal/ray-start.sh head|h100|l40s|a100" >&2; exit 2 ;;
esac
