#!/usr/bin/env bash
# Runs a command inside the Debian 13 root (stacks/debian_root.sh), in this checkout: the checkout is bind-mounted
# at the same path, with /proc, /dev and /sys, in a mount namespace of its own (the mounts end with the command).
# The environment is clean but for what the tests and the run read (CI, IMAGEPIPE_*, the terminal).
#
#   stacks/in_root.sh ROOT COMMAND [ARG...]
set -euo pipefail
ROOT=$(cd "${1:?usage: stacks/in_root.sh ROOT COMMAND...}" && pwd)
shift
HERE=$(pwd)
# The checkout's parent too, where shared material may lie beside it (../shared): bind it read-only if present.
PARENT=$(dirname "$HERE")
# The legacy stack's Python, where .venv is one (its venv lies in the checkout): the tests of one stack's roots and
# models used by the other run it inside the root too. Its own installation folder only, never a system one.
LEGACY_PREFIX=""
if [ -x "$HERE/.venv/bin/python" ]; then
  LEGACY_PREFIX=$(dirname "$(dirname "$(readlink -f "$HERE/.venv/bin/python")")")
  case "$LEGACY_PREFIX" in /|/usr|/usr/local|/bin|"$HERE"*) LEGACY_PREFIX="";; esac
fi
ENVS=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 LC_ALL=C.UTF-8
      SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt PIP_DISABLE_PIP_VERSION_CHECK=1)
while IFS='=' read -r name value; do
  case "$name" in CI|TERM|COLUMNS|PYTHONDONTWRITEBYTECODE|IMAGEPIPE_*|STACK|TEST_WORKERS|PYTEST_ADDOPTS)
    ENVS+=("$name=$value");; esac
done < <(env)
exec unshare --mount --propagation private -- /bin/bash -c '
  set -e
  root=$1 here=$2 parent=$3 legacy=$4; shift 4
  for d in proc dev sys; do mount --rbind /$d "$root/$d"; done
  mkdir -p "$root$here"
  mount --bind "$here" "$root$here"
  if [ -d "$parent/shared" ]; then mkdir -p "$root$parent/shared"; mount --bind -o ro "$parent/shared" "$root$parent/shared" 2>/dev/null || mount --bind "$parent/shared" "$root$parent/shared"; fi
  if [ -n "$legacy" ]; then mkdir -p "$root$legacy"; mount --bind -o ro "$legacy" "$root$legacy"; fi
  exec chroot "$root" /usr/bin/env -i "$@"
' in_root "$ROOT" "$HERE" "$PARENT" "$LEGACY_PREFIX" "${ENVS[@]}" /bin/sh -c 'cd "$1" && shift && exec "$@"' cd "$HERE" "$@"
