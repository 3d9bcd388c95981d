# The GPU builder image: TensorRT-LLM's release image plus enginectl.
#
# Build:   docker build -f Dockerfile.builder -t enginectl-builder:1.2.1 .
# Pin:     replace the tag below with its digest once you have pulled it, e.g.
#          FROM nvcr.io/nvidia/tensorrt-llm/release:1.2.1@sha256:<digest>
#          (docker buildx imagetools inspect nvcr.io/nvidia/tensorrt-llm/release:1.2.1),
#          and pass the same digest as ENGINECTL_IMAGE_DIGEST so build keys record it.
# Run:     docker run --gpus all --rm \
#            -e ENGINECTL_STORE_URL=s3://bucket/enginectl -e ENGINECTL_REGISTRY_URL=postgresql+psycopg://… \
#            -e AWS_ACCESS_KEY_ID -e AWS_SECRET_ACCESS_KEY -e HF_TOKEN \
#            enginectl-builder:1.2.1 build recipes/llama70b-h100.yaml
FROM nvcr.io/nvidia/tensorrt-llm/release:1.2.1

ARG IMAGE_DIGEST=unpinned
ENV ENGINECTL_IMAGE_DIGEST=${IMAGE_DIGEST} \
    ENGINECTL_TRTLLM_EXAMPLES=/app/tensorrt_llm/examples \
    ENGINECTL_PYTHON=python3 \
    PIP_NO_CACHE_DIR=1

WORKDIR /opt/enginectl
COPY pyproject.toml README.md alembic.ini ./
COPY pipeline ./pipeline
COPY registry ./registry
COPY migrations ./migrations
COPY recipes ./recipes
# Editable, so the Alembic migrations beside the packages are found. The release image
# already has torch, transformers and nvidia-modelopt at the versions TRT-LLM pins; the
# constraint keeps pip from replacing them.
RUN python3 -m pip freeze | grep -iE '^(torch|transformers|nvidia-modelopt)==' > /tmp/keep.txt \
 && python3 -m pip install --constraint /tmp/keep.txt -e '.[postgres,ray]' \
 && enginectl --help > /dev/null

ENTRYPOINT ["enginectl"]
CMD ["--help"]
