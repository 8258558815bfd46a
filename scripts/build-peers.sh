#!/usr/bin/env bash
# `make peers`: build llama.cpp's llama-bench and llama-quantize from the vendored source of the pinned
# llama-cpp-python sdist, for `kestrel-lab bench --peer llama.cpp` and lessons day29_1 / day29_2.
# Optional: minutes on 2 cores (BUILD.json records how long) plus the download; never part of `make test` or CI.
#
# The strongest build that runs: -march=native first (GGML_NATIVE=ON); a smoke run of llama-bench on the
# bench's own Q4_0 model follows, and if it dies (ggml's AMX backend dies of SIGILL on VMs that list AMX they
# do not provide) the build is redone with explicit ISA flags read from the host (GGML_NATIVE=OFF,
# GGML_AVX2/FMA/F16C/BMI2/AVX_VNNI/AVX512/AVX512_VBMI/AVX512_VNNI/AVX512_BF16 as the CPU lists them, AMX off).
# BUILD.json says which build was chosen, with what flags, and why.
#
#   KESTREL_PEERS_DIR  where the build goes (default: <kestrel cache dir>/peers)
#   PY                 the venv's python (default .venv/bin/python); requirements-peers.txt goes there
#   JOBS               make -j (default 2)
#   PEER_BUILD         auto (default): native, then isa if native dies; native; isa; native-noamx
#                      (-march=native without AMX: the older fallback, for comparison); avx2 (AVX2 and FMA
#                      only: the same-ISA comparison of day29_1, beside the engine forced onto its AVX2
#                      kernels; build it into its own KESTREL_PEERS_DIR)
#   PEER_AMX=off       the same as PEER_BUILD=native-noamx (kept for old notes)
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
COMMON=(-DCMAKE_BUILD_TYPE=Release -DGGML_CPU_REPACK=ON -DGGML_BLAS=OFF
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF
        -DLLAMA_BUILD_TOOLS=ON -DBUILD_SHARED_LIBS=ON)
isa_flags() {   # GGML_<ISA>=ON for each instruction set /proc/cpuinfo lists (x86-64), AMX off
    local cpu; cpu=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
    local out=(-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
    local pair
    for pair in avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2 avx_vnni:AVX_VNNI avx512f:AVX512 \
                avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
        case "$cpu" in *" ${pair%%:*} "*) out+=("-DGGML_${pair##*:}=ON") ;; *) out+=("-DGGML_${pair##*:}=OFF") ;; esac
    done
    echo "${out[@]}"
}
flags_for() {   # the cmake flags of one build kind
    case "$1" in
        native) echo "${COMMON[*]} -DGGML_NATIVE=ON" ;;
        isa) [ "$(uname -m)" = x86_64 ] || { echo "peers: PEER_BUILD=isa is for x86-64 hosts" >&2; return 2; }
             echo "${COMMON[*]} $(isa_flags)" ;;
        native-noamx) echo "${COMMON[*]} -DGGML_NATIVE=OFF" ;;   # -march=native comes through CMAKE_*_FLAGS
        avx2) [ "$(uname -m)" = x86_64 ] || { echo "peers: PEER_BUILD=avx2 is for x86-64 hosts" >&2; return 2; }
              echo "${COMMON[*]} -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" \
                   "-DGGML_BMI2=ON -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF" \
                   "-DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF" \
                   "-DGGML_AMX_BF16=OFF" ;;
        *) echo "peers: PEER_BUILD is '$1'; it takes auto, native, isa, avx2 or native-noamx" >&2; return 2 ;;
    esac
}
build() {   # build kind $1 into $PEERS/build-$1; prints the seconds it took
    local kind=$1 dir="$PEERS/build-$1" start
    local -a flags; read -r -a flags <<< "$(flags_for "$kind")"
    if [ "$kind" = native-noamx ]; then
        local no_amx="-march=native -mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
        flags+=("-DCMAKE_C_FLAGS=$no_amx" "-DCMAKE_CXX_FLAGS=$no_amx")
    fi
    start=$(date +%s)
    cmake -S "$LLAMA" -B "$dir" "${flags[@]}" > "$PEERS/cmake-configure-$kind.log"
    cmake --build "$dir" --target llama-bench llama-quantize -j "$JOBS" > "$PEERS/cmake-build-$kind.log"
    test -x "$dir/bin/llama-bench" && test -x "$dir/bin/llama-quantize"
    write_build_json "$PEERS/build-$kind.json" "$kind" "$(( $(date +%s) - start ))" "$dir" "${flags[@]}"
}

# 4. BUILD.json: what was built, how, how long it took, and (for the chosen one) why.
compiler="$(c++ --version | head -n1)"
write_build_json() {   # $1 file, $2 kind, $3 seconds, $4 build dir, then the cmake flags
    "$PY" - "$1" "$2" "$3" "$compiler" "$SDIST_SHA256" "$LLAMA" "$4" "$JOBS" "${@:5}" <<'PYEOF'
import json, os, platform, sys, time
out, kind, seconds, compiler, sha, llama, build, jobs, *flags = sys.argv[1:]
info = {"peer": "llama.cpp", "sdist": "llama-cpp-python==0.3.36", "sdist_sha256": sha, "build_kind": kind,
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
}

# 5. Build, smoke-test (llama-bench on the bench's own Q4_0 model), choose; BUILD.json is the chosen build's.
kind="${PEER_BUILD:-auto}"
[ "${PEER_AMX:-on}" = off ] && kind=native-noamx
case "$kind" in auto) tries=(native isa) ;; *) tries=("$kind") ;; esac
[ "$(uname -m)" = x86_64 ] || tries=(native)
"$PY" -m pip install -q -r "$ROOT/requirements-peers.txt"
tried=()
for k in "${tries[@]}"; do
    echo "peers: building the $k build …"
    build "$k"
    if result=$(cd "$ROOT" && PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m kestrel_lab.bench.peer smoke \
                "$PEERS/build-$k.json" 2>&1 | tail -n1); then
        tried+=("$k: $result")
        "$PY" -m kestrel_lab.bench.peer choose "$PEERS/build-$k.json" "$PEERS/BUILD.json" "${tried[@]}"
        echo "peers: chose the $k build ($result) -> $PEERS/BUILD.json"
        exit 0
    fi
    tried+=("$k: $result")
    echo "peers: the $k build does not run here: $result" >&2
done
echo "peers: no build ran here: ${tried[*]}" >&2
exit 1
