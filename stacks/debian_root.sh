#!/usr/bin/env bash
# Builds a Debian 13 (trixie, glibc 2.41) root from Debian's package index, for running the modern stack
# (TFX 1.21: its TFDV and ML Metadata wheels need glibc 2.39+) on a machine whose own glibc is older.
# Needs root (debootstrap, chroot). About a minute with a warm package cache; the result is cached in ROOT
# and reused until this script changes.
#
#   stacks/debian_root.sh ROOT
set -euo pipefail
ROOT=${1:?usage: stacks/debian_root.sh ROOT}
STAMP="$ROOT/.imagepipe-root"
WANT=$(sha256sum "$0" | cut -c1-16)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then exit 0; fi
if [ "$(id -u)" -ne 0 ]; then
  echo "error: building the Debian 13 root for STACK=modern needs root (debootstrap, chroot); run as root, or use STACK=legacy" >&2
  exit 1
fi
if ! command -v debootstrap >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi
echo "stacks: building a Debian 13 root in $ROOT (once; cached)"
rm -rf "$ROOT.partial"
mkdir -p "$(dirname "$ROOT")"
debootstrap --variant=minbase trixie "$ROOT.partial" http://deb.debian.org/debian >"$ROOT.log" 2>&1 || {
  echo "error: debootstrap failed; see $ROOT.log" >&2; exit 1; }
cp /etc/resolv.conf "$ROOT.partial/etc/resolv.conf"
# The package index must answer inside the root as outside: the host's locally added CA certificates and pip's
# certificate setting (its other settings name folders of the host).
mkdir -p "$ROOT.partial/usr/local/share/ca-certificates"
cp /usr/local/share/ca-certificates/*.crt "$ROOT.partial/usr/local/share/ca-certificates/" 2>/dev/null || true
[ -f /etc/pip.conf ] && grep -E '^\[global\]|^cert' /etc/pip.conf >"$ROOT.partial/etc/pip.conf" || true
# Python 3.13 (Debian 13's), a compiler and headers (pyfarmhash builds from source on 3.13), chromium for the report's
# browser tests, git (tests read the history) and make.
chroot "$ROOT.partial" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
  sh -c 'apt-get update -qq && apt-get install -y -qq --no-install-recommends ca-certificates python3 python3-venv \
    python3-dev g++ make git chromium fonts-dejavu-core >/dev/null && update-ca-certificates >/dev/null' \
  >>"$ROOT.log" 2>&1 || { echo "error: installing Python and the compiler in the root failed; see $ROOT.log" >&2; exit 1; }
echo "$WANT" >"$ROOT.partial/.imagepipe-root"
rm -rf "$ROOT"
mv "$ROOT.partial" "$ROOT"
