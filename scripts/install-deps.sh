#!/usr/bin/env bash
# Installs the Debian packages g4's build and tests need, only when they are missing.
# Run as root (or with sudo available). Safe to run repeatedly: when everything is there it does
# nothing (no apt-get update either).
set -euo pipefail

# gcc-aarch64-linux-gnu, libc6-dev-arm64-cross and qemu-user: `make neon-test` cross-compiles the
# NEON kernels and their tests for aarch64 and runs them under qemu-aarch64.
# parallel: GNU parallel, which tests/test_eval_shard.c runs the README's sharded eval under.
# python3, python3-venv: make python-test makes a venv and pip-installs ./python into it; make
# serve-test makes one for the openai client. libmicrohttpd-dev: g4 serve's HTTP server. nginx:
# make serve-test runs two g4 serve replicas behind it (examples/serve/nginx.conf). chromium,
# chromium-driver: make serve-test loads g4 serve's chat page in headless Chromium, driven through
# chromedriver's WebDriver API (tests/serve/test_page.py). perl: the build embeds that page with
# tools/serve/embed_page.pl (Digest::SHA for its policy's hashes). python3-jsonschema: tests/
# test_structured.c validates constrained outputs with it (tests/structured/validate.py). libpng-dev,
# libjpeg62-turbo-dev: image input's PNG and JPEG decoding (src/vision/image.c); libsoxr-dev,
# libkissfft-dev: audio input (src/audio/: resampling to 16 kHz, the log-mel FFT). Host build only,
# not the aarch64 cross build.
packages=(gcc make libc6-dev libcjson-dev libpcre2-dev pkgconf clang libclang-rt-14-dev
          gcc-aarch64-linux-gnu binutils-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user parallel
          python3 python3-venv libmicrohttpd-dev nginx chromium chromium-driver perl
          python3-jsonschema libpng-dev libjpeg62-turbo-dev libsoxr-dev libkissfft-dev)

# The arm64 builds of cJSON and PCRE2 for that cross build are unpacked (dpkg-deb -x) into
# AARCH64_DEPS, not installed as multiarch packages (libcjson-dev:arm64 libpcre2-dev:arm64):
# installing them pulls libc6-dev:arm64 in (libpcre2-dev depends on libc-dev), and with it about
# 25 arm64 packages whose Multi-Arch: same versions must equal the host's, so on Debian 12 it
# upgraded ~15 host packages (openssl, krb5, e2fsprogs, linux-libc-dev) and would fail whenever
# the archive's arm64 and amd64 builds of one of them are out of step. Unpacked, the four
# packages need only `dpkg --add-architecture arm64` (so apt can download them) and touch nothing
# installed. Debian has no static libcjson, so the tests link these dynamically (see Makefile).
# Keep the default in step with the Makefile's AARCH64_DEPS.
a64_dir=${AARCH64_DEPS:-/opt/g4-aarch64-deps}
a64_packages=(libcjson1 libcjson-dev libpcre2-8-0 libpcre2-dev)
a64_stamp="$a64_dir/.g4-complete"

missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
need_a64=0
[ -e "$a64_stamp" ] || need_a64=1
if [ ${#missing[@]} -eq 0 ] && [ $need_a64 -eq 0 ]; then
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
if [ $need_a64 -eq 1 ] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
  echo "install-deps: adding the arm64 architecture to apt (for downloading ${a64_packages[*]})" >&2
  $sudo dpkg --add-architecture arm64
fi
$sudo apt-get update -qq

if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}" >&2
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ $need_a64 -eq 1 ]; then
  echo "install-deps: unpacking arm64 ${a64_packages[*]} into $a64_dir" >&2
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  chmod 755 "$tmp"
  mkdir "$tmp/debs" "$tmp/root"
  # apt fetches as the unprivileged _apt user when it can write the folder (no warning then).
  if id _apt >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then chown _apt "$tmp/debs"; fi
  (cd "$tmp/debs" && apt-get download -qq "${a64_packages[@]/%/:arm64}")
  for deb in "$tmp"/debs/*.deb; do dpkg-deb -x "$deb" "$tmp/root"; done
  rm -rf "$tmp/root/usr/share" "$tmp/root/usr/bin"
  for f in usr/include/cjson/cJSON.h usr/include/pcre2.h usr/lib/aarch64-linux-gnu/libcjson.so \
           usr/lib/aarch64-linux-gnu/libpcre2-8.so; do
    [ -e "$tmp/root/$f" ] || { echo "install-deps: $f missing from the arm64 packages" >&2; exit 1; }
  done
  $sudo rm -rf "$a64_dir"
  $sudo mkdir -p "$(dirname "$a64_dir")"
  $sudo cp -a "$tmp/root" "$a64_dir"
  $sudo touch "$a64_stamp" # last: a run cut short is redone next time
fi
