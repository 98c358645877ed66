#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment outside the clone and link it as .venv.
# The environment is keyed by a hash of the Python version and the dependency files, so
# every clone and every CI run on this machine shares one install of torch (several GB).
set -euo pipefail
cd "$(dirname "$0")/.."

cache="${STREAMLEARN_CACHE:-$HOME/.cache/streamlearn}"
py="${PYTHON:-python3}"
command -v "$py" >/dev/null || { echo "setup: $py not found; install Python 3.11+ or set PYTHON=" >&2; exit 1; }
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "setup: Python 3.11+ required ($py is older)" >&2; exit 1; }

# Debian packages the project runs: installed with apt-get if missing, which needs root.
apt_install() {  # apt_install COMMAND PACKAGE WHY
  command -v "$1" >/dev/null && return 0
  if [ "$(id -u)" != 0 ]; then
    echo "setup: '$1' is missing ($3); installing it needs root: run 'sudo apt-get install -y $2', then make setup again" >&2
    exit 1
  fi
  echo "setup: installing $2 ($3)" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$2" >/dev/null
}
apt_install openssl openssl "the secured test broker's certificates, tests/integration/test_security.py"
apt_install prometheus prometheus "streamlearn monitor and tests/integration/test_metrics.py run a real Prometheus"

key=$( { "$py" -c 'import sys; print(sys.version)'; cat requirements.txt requirements-dev.txt; } | sha256sum | cut -c1-12)
venv="$cache/venv-$key"
mkdir -p "$cache"

if [ ! -f "$venv/.complete" ]; then
  echo "setup: building environment $venv (first run only; torch is large)"
  # uv resolves and downloads in parallel: minutes instead of pip's tens of minutes for torch.
  boot="$cache/bootstrap"
  [ -x "$boot/bin/uv" ] || { "$py" -m venv "$boot" && "$boot/bin/pip" install -q 'uv>=0.9,<1'; }
  rm -rf "$venv"
  "$boot/bin/uv" venv -q --python "$py" "$venv"
  "$boot/bin/uv" pip install -q --python "$venv/bin/python" -r requirements.txt -r requirements-dev.txt
  touch "$venv/.complete"
fi

# Bytecode, compiled once per environment. uv installs sources only, and with PYTHONDONTWRITEBYTECODE=1
# (set on this project's build machines) no process ever caches one, so every Ray worker, Train
# worker and replica compiled torch and Ray from source as it started: `import torch` 3.2 s -> 1.7 s,
# the training loop's imports 7.1 s -> 3.3 s, the first optimizer 3.9 s -> 1.1 s (DECISIONS §8).
if [ ! -f "$venv/.bytecode" ]; then
  echo "setup: compiling the environment's bytecode (once, ~20 s)"
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # torch ships one test helper written for Python 3.12's syntax; it is never imported here.
  "$venv/bin/python" -m compileall -q -j 0 -x '/torch/testing/_internal/py312_intrinsics\.py$' "$site" >/dev/null \
    || echo "setup: warning: some files in $site did not compile; they compile each time they are imported" >&2
  touch "$venv/.bytecode"
fi

# The package itself is cheap to (re)install, so do it every time: the venv is shared by clones.
"$cache/bootstrap/bin/uv" pip install -q --python "$venv/bin/python" --no-deps -e .
ln -sfn "$venv" .venv
echo "setup: environment ready at .venv -> $venv"
