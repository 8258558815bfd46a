#!/usr/bin/env bash
# `make peers`: build llama.cpp's llama-bench and llama-quantize from the vendored source of the pinned
# llama-cpp-python sdist, for `kestrel-lab bench --peer llama.cpp` and lessons day29_1 / day29_2.
# Optional: minutes on 2 cores (BUILD.json records how long) plus the download; never part of `make test` or CI.
#
#   KESTREL_PEERS_DIR  where the build goes (default: <kestrel cache dir>/peers)
#   PY                 the venv's python (default .venv/bin/python); requirements-peers.txt goes there
#   JOBS               make -j (default 2)
#   PEER_AMX           on (default): -march=native as it is; off: -march=native without AMX, for hosts
#                      (VMs) that list amx_int8 where ggml's AMX backend dies of SIGILL in tilezero
set -euo pipefail

SDIST_NAME=llama-cpp-python
SDIST_VERSION=0.3.36
SDIST_FILE=llama_cpp_python-${SDIST_VERSION}.tar.gz
SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PY:-$ROOT/.venv/bin/python}"
JOBS="${JOBS:-2}"
if [ -z "${KESTREL_PEERS_DIR:-}" ]; then
    KESTREL_PEERS_DIR="$(cd "$ROOT" && PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c \
        'from kestrel_lab.paths import cache_dir; print(cache_dir() / "peers")')"
fi
PEERS="$KESTREL_PEERS_DIR"
mkdir -p "$PEERS"
echo "peers: building llama.cpp from $SDIST_NAME $SDIST_VERSION into $PEERS"

# 1. The sdist, checked against the pinned hash (kept in the peers dir so a rebuild needs no download).
SDIST="$PEERS/$SDIST_FILE"
if [ ! -f "$SDIST" ] || ! echo "$SDIST_SHA256  $SDIST" | sha256sum -c --quiet - 2>/dev/null; then
    rm -f "$SDIST"
    "$PY" -m pip download -q --no-deps --no-binary :all: "$SDIST_NAME==$SDIST_VERSION" -d "$PEERS"
fi
echo "$SDIST_SHA256  $SDIST" | sha256sum -c --quiet - || {
    echo "peers: sha256 of $SDIST does not match the pinned $SDIST_SHA256" >&2; exit 1; }

# 2. Unpack once.
SRC="$PEERS/src/llama_cpp_python-$SDIST_VERSION"
if [ ! -f "$SRC/vendor/llama.cpp/CMakeLists.txt" ]; then
    rm -rf "$PEERS/src"; mkdir -p "$PEERS/src"
    tar -xzf "$SDIST" -C "$PEERS/src"
fi
LLAMA="$SRC/vendor/llama.cpp"

# 3. Configure and build the two tools only. The flags are the fair-comparison pins of issue 13.
BUILD="$PEERS/build"
FLAGS=(-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_CPU_REPACK=ON -DGGML_BLAS=OFF
       -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF
       -DLLAMA_BUILD_TOOLS=ON -DBUILD_SHARED_LIBS=ON)
case "${PEER_AMX:-on}" in
    on) ;;
    off) NO_AMX="-march=native -mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
         # ggml's native mode appends -march=native after these flags (AMX back on), so native is
         # spelled out here and ggml adds only -m<isa> flags, none of them AMX.
         FLAGS=("${FLAGS[@]/-DGGML_NATIVE=ON/-DGGML_NATIVE=OFF}" "-DCMAKE_C_FLAGS=$NO_AMX" "-DCMAKE_CXX_FLAGS=$NO_AMX") ;;
    *) echo "peers: PEER_AMX is '${PEER_AMX}'; it takes on or off" >&2; exit 2 ;;
esac
start=$(date +%s)
cmake -S "$LLAMA" -B "$BUILD" "${FLAGS[@]}" > "$PEERS/cmake-configure.log"
cmake --build "$BUILD" --target llama-bench llama-quantize -j "$JOBS" > "$PEERS/cmake-build.log"
seconds=$(( $(date +%s) - start ))
test -x "$BUILD/bin/llama-bench" && test -x "$BUILD/bin/llama-quantize"

# 4. The converter's extra requirements (it runs on the venv's torch and transformers).
"$PY" -m pip install -q -r "$ROOT/requirements-peers.txt"

# 5. BUILD.json: what was built, how, and how long it took.
compiler="$(c++ --version | head -n1)"
"$PY" - "$PEERS/BUILD.json" "$seconds" "$compiler" "$SDIST_SHA256" "$LLAMA" "$BUILD" "$JOBS" "${FLAGS[@]}" <<'PYEOF'
import json, os, platform, sys, time
out, seconds, compiler, sha, llama, build, jobs, *flags = sys.argv[1:]
info = {"peer": "llama.cpp", "sdist": "llama-cpp-python==0.3.36", "sdist_sha256": sha,
        "source": llama, "build_dir": build, "bin_dir": os.path.join(build, "bin"),
        "convert_script": os.path.join(llama, "convert_hf_to_gguf.py"),
        "gguf_py": os.path.join(llama, "gguf-py"),
        "cmake_flags": flags, "targets": ["llama-bench", "llama-quantize"], "jobs": int(jobs),
        "compiler": compiler, "seconds": int(seconds), "machine": platform.machine(),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
tmp = out + ".tmp"
with open(tmp, "w") as fh:
    json.dump(info, fh, indent=1); fh.write("\n")
os.replace(tmp, out)
PYEOF
echo "peers: built llama-bench and llama-quantize in ${seconds} s -> $BUILD/bin (see $PEERS/BUILD.json)"
