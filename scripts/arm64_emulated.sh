#!/usr/bin/env bash
# An aarch64 Python under qemu-user, to compile and test tallow's CPU kernels for arm64 on an
# x86-64 box (docs/cpu-kernels.md, "aarch64"). Neither CI nor `make test` needs it.
#
#   scripts/arm64_emulated.sh            set up (idempotent: a finished set-up is reused)
#   scripts/arm64_emulated.sh run ARGS   python3.11 ARGS under qemu-aarch64-static
#   scripts/arm64_emulated.sh path       print the runner's path (the test reads it)
#
# What it makes, in $TALLOW_HOME/arm64 (default ~/.cache/tallow/arm64):
#   sysroot/      Debian 12 arm64 .debs of python3.11 and the libraries it and the wheels load,
#                 unpacked with `dpkg -x` (nothing installed into this system: a private apt state
#                 under apt/ lists and downloads the arm64 packages)
#   site/         manylinux aarch64 wheels of numpy, numba, llvmlite (the venv's versions) and
#                 pytest, pip-installed with --target; `tallow` links to this checkout's core/
#   python        the runner: qemu-aarch64-static -L sysroot -cpu ${ARM64_CPU:-max} python3.11
# Needs root for `apt-get install qemu-user-static` when it is missing (Debian's package).
# ARM64_CPU picks qemu's CPU: `max` has the ARMv8.2 dot products (sdot/udot), `cortex-a72`
# (a Raspberry Pi 4) has not. Emulation says nothing about speed.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
HOME_DIR="${TALLOW_HOME:-$HOME/.cache/tallow}"
DIR="$HOME_DIR/arm64"
SYSROOT="$DIR/sysroot"
SITE="$DIR/site"
RUNNER="$DIR/python"
PY="${PYTHON:-$ROOT/.venv/bin/python}"

if [ "${1:-}" = "path" ]; then
  echo "$RUNNER"
  exit 0
fi
if [ "${1:-}" = "run" ]; then
  shift
  exec "$RUNNER" "$@"
fi

# Debian arm64 packages: the interpreter and every shared library it, its extension modules and
# the wheels (libstdc++ and libgcc_s for llvmlite/numba; libgomp is bundled) load.
DEBS=(libc6 libgcc-s1 libstdc++6 zlib1g libexpat1 libffi8 libssl3 libbz2-1.0 liblzma5
      libuuid1 libncursesw6 libtinfo6 libreadline8 libsqlite3-0 libcrypt1 libnsl2 libtirpc3
      libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libcom-err2 libkeyutils1 libdb5.3
      python3.11-minimal libpython3.11-minimal libpython3.11-stdlib python3.11)

if [ -x "$RUNNER" ] && [ -f "$DIR/.done" ] && [ "$(cat "$DIR/.done")" = "$("$PY" -c \
    'import numpy, numba, llvmlite; print(numpy.__version__, numba.__version__, llvmlite.__version__)')" ]; then
  echo "arm64 python ready: $RUNNER"
  exit 0
fi

if ! command -v qemu-aarch64-static >/dev/null; then
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q qemu-user-static
fi

# A private apt state for arm64: lists and .debs under $DIR/apt, this system's dpkg untouched.
APT="$DIR/apt"
mkdir -p "$APT/state/lists/partial" "$APT/cache/archives/partial" "$APT/debs"
touch "$APT/status"
APT_OPTS=(-q -o "Dir::State=$APT/state" -o "Dir::State::status=$APT/status" -o "Dir::Cache=$APT/cache"
          -o "APT::Architecture=arm64" -o "APT::Architectures::=arm64" -o "APT::Sandbox::User=root")
apt-get "${APT_OPTS[@]}" update
(cd "$APT/debs" && apt-get "${APT_OPTS[@]}" download "${DEBS[@]/%/:arm64}")
rm -rf "$SYSROOT"
mkdir -p "$SYSROOT"
for deb in "$APT/debs"/*.deb; do
  dpkg -x "$deb" "$SYSROOT"
done
test -x "$SYSROOT/usr/bin/python3.11"

# The wheels: the versions this checkout's venv runs, for CPython 3.11 on manylinux aarch64 (gguf:
# the tests' reference quantiser).
read -r NUMPY NUMBA LLVMLITE GGUF <<<"$("$PY" -c 'import importlib.metadata as m, numpy, numba, llvmlite
print(numpy.__version__, numba.__version__, llvmlite.__version__, m.version("gguf"))')"
rm -rf "$SITE"
"$PY" -m pip install -q --target "$SITE" --platform manylinux2014_aarch64 --platform manylinux_2_28_aarch64 \
  --platform manylinux_2_17_aarch64 --implementation cp --python-version 3.11 --abi cp311 --only-binary=:all: \
  "numpy==$NUMPY" "numba==$NUMBA" "llvmlite==$LLVMLITE" "gguf==$GGUF" pytest threadpoolctl
ln -sfn "$ROOT/core" "$SITE/tallow"

cat >"$RUNNER" <<EOF
#!/bin/sh
# aarch64 python3.11 under qemu-user (scripts/arm64_emulated.sh); ARM64_CPU picks qemu's CPU.
export PYTHONPATH="$SITE\${PYTHONPATH:+:\$PYTHONPATH}"
export PYTHONHOME="$SYSROOT/usr"
export PYTHONNOUSERSITE=1
# LLVM reads the host CPU from /proc/cpuinfo, which qemu-user leaves the x86 host's ("generic", no
# features): name the emulated CPU's to numba (the kernels choose their instructions from these).
if [ -z "\${NUMBA_CPU_NAME:-}" ]; then
  case "\${ARM64_CPU:-max}" in
    max|cortex-a76|neoverse-n1)  # ARMv8.2 with the dot products (a Raspberry Pi 5's Cortex-A76)
      export NUMBA_CPU_NAME=cortex-a76 NUMBA_CPU_FEATURES=+neon,+fp-armv8,+crc,+lse,+rdm,+rcpc,+fullfp16,+dotprod ;;
    cortex-a72)  # ARMv8.0 (a Raspberry Pi 4)
      export NUMBA_CPU_NAME=cortex-a72 NUMBA_CPU_FEATURES=+neon,+fp-armv8,+crc ;;
    *) export NUMBA_CPU_NAME=generic NUMBA_CPU_FEATURES=+neon ;;
  esac
fi
exec qemu-aarch64-static -L "$SYSROOT" -cpu "\${ARM64_CPU:-max}" "$SYSROOT/usr/bin/python3.11" "\$@"
EOF
chmod +x "$RUNNER"
"$RUNNER" -c 'import platform, numpy, numba, llvmlite; print(platform.machine(), numpy.__version__, numba.__version__)'
echo "$NUMPY $NUMBA $LLVMLITE" >"$DIR/.done"
echo "arm64 python ready: $RUNNER"
