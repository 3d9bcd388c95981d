#!/bin/sh
# Bare-metal pools for enginectl: one `ray start` per machine, in the builder image or a venv
# with the same enginectl[ray] and Python everywhere. Each GPU machine advertises its catalog
# SKU as the resource enginectl asks for, gpu:<SKU>, one unit per GPU, with as many --num-gpus.
# tests/unit/test_deploy_examples.py parses the lines below.
#
# Token auth (Ray >= 2.52): one token for every node and for every CLI that drives them.
# Make it once (`ray get-auth-token --generate` writes ~/.ray/auth_token and prints it), copy
# it to each machine, and export on each, before this script and before `enginectl build
# --executor ray`:
#   export RAY_AUTH_MODE=token   # the token read from ~/.ray/auth_token (or RAY_AUTH_TOKEN,
#                                # or a file named by RAY_AUTH_TOKEN_PATH)
# This script refuses to start a node without RAY_AUTH_MODE=token.
#
# Stage tasks inherit this environment: put the fetch cache on the file system of the
# enginectl home, where the work directories are (what a node fetched once is then linked,
# not copied, into each), e.g. on the local NVMe:
#   export ENGINECTL_HOME=/nvme/enginectl ENGINECTL_CACHE_DIR=/nvme/enginectl/cache
set -eu
if [ "${RAY_AUTH_MODE:-}" != token ]; then
  echo "ray-start.sh: export RAY_AUTH_MODE=token and RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH)" \
       "first: the same token on every node and every driver" >&2
  exit 2
fi
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
