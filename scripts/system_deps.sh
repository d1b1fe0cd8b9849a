#!/usr/bin/env bash
# Install the system packages the demo and the tests need, on Debian/Ubuntu:
# Chromium (browser tests), lavapipe (WebGPU without a GPU), ffmpeg (audio
# decoding), node + npm (Pyodide), lld (wasm-ld: links kernels.wasm). Does nothing when all are present.
# Works as root (no sudo needed) and as a user with sudo. Any other box gets a
# one-line message naming what is missing and how to install it.
set -euo pipefail

missing=()
command -v chromium >/dev/null || missing+=(chromium)
command -v ffmpeg >/dev/null || missing+=(ffmpeg)
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
command -v wasm-ld >/dev/null || missing+=(lld)
ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1 || missing+=(mesa-vulkan-drivers)
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" = 0 ]; then
  as_root=()
elif command -v sudo >/dev/null; then
  as_root=(sudo)
else
  echo "system_deps: missing ${missing[*]}; run as root or install sudo, or install them yourself: apt-get install -y ${missing[*]}" >&2
  exit 1
fi
command -v apt-get >/dev/null || {
  echo "system_deps: missing ${missing[*]} and this is not a Debian/Ubuntu box (no apt-get): install them with your package manager" >&2
  exit 1
}
# `env` makes the variable an argument, so it works with and without sudo
# (a bare `VAR=value` after an empty expansion would be taken as a command).
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "system_deps: installed ${missing[*]}"
