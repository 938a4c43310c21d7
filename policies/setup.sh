#!/usr/bin/env bash
# Installs the toolchains that build the example policies (make policies)
# and that their tests need, from Debian's packages, idempotently, as root:
#   Go                 the go command that builds codemode itself
#   WebAssembly text   wat2wasm              (wabt)
#   Rust               rustc 1.63, the standard library of wasm32-wasi
#                      (rustc, libstd-rust-dev-wasm32); no crates, no network
#   C                  clang 14 and lld 14 with wasi-libc and compiler-rt's
#                      wasm32 builtins (clang-14, lld-14, wasi-libc,
#                      libclang-rt-14-dev-wasm32)
set -euo pipefail

packages=(wabt rustc libstd-rust-dev-wasm32 clang-14 lld-14 wasi-libc libclang-rt-14-dev-wasm32)
missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
[ "$(id -u)" = 0 ] || { echo "policies/setup.sh: installing ${missing[*]} needs root" >&2; exit 1; }
echo "policies: apt-get install ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
