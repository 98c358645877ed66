# streamlearn on Ray: the CPU image (gloo DDP), run by every pod in deploy/kuberay/.
#
# Tag convention (the manifests use these names; tests/unit/test_deploy_manifests.py checks them):
#   docker build -t streamlearn:latest -f Dockerfile .       CPU head and cpu-workers
#   docker build -t streamlearn:gpu -f Dockerfile.gpu .      gpu-workers (NCCL)
# Push them to your registry under these names, or change both the tags and the manifests.
#
# The base image's Ray version must equal requirements.txt's ray pin: nodes of another Ray
# version cannot join the cluster, and KubeRay's `rayVersion` in the manifests says the same.
FROM rayproject/ray:2.60.0-py311

# The base image already runs as the non-root user `ray` (uid 1000, gid 100) whose conda
# Python is on PATH, so pip installs there without root.
WORKDIR /home/ray/streamlearn

# Dependencies first: a code change then reuses this layer instead of reinstalling torch.
# The default torch wheel bundles CUDA libraries (gigabytes) that a CPU node never loads:
# pass --build-arg TORCH_INDEX_URL=<PyTorch's CPU wheel index> for a smaller image.
# requirements-dev.txt is copied because pyproject.toml reads it for the `dev` extra.
ARG TORCH_INDEX_URL=""
COPY --chown=1000:100 requirements.txt requirements-dev.txt ./
RUN pip install --no-cache-dir ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} -r requirements.txt

COPY --chown=1000:100 pyproject.toml README.md ./
COPY --chown=1000:100 streamlearn ./streamlearn
COPY --chown=1000:100 pipelines ./pipelines
COPY --chown=1000:100 load ./load
# --no-deps: the pins above are the tested set; the package must not re-resolve them.
RUN pip install --no-cache-dir --no-deps .

# Numeric, so Kubernetes can verify `runAsNonRoot: true` (it cannot resolve a user name).
USER 1000:100
