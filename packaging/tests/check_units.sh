#!/usr/bin/env bash
# The systemd units as systemd reads them: `systemd-analyze verify` on the
# three units in a scratch root holding the real binaries at /usr/bin (the paths of
# the .deb) and a copy of this machine's unit tree, then
# `systemd-analyze security --offline=yes` with a ceiling on each unit's
# exposure score (0-10 as printed; --threshold takes tenths):
#   ckptd.service            <= 3.5 (root with six capabilities; measured 2.9)
#   ckpt-coordinator.service <= 2.0 (no capability, own user; measured 1.2)
#   ckpt-relay.service       <= 2.0 (the same, no state; measured 1.2)
# Usage: check_units.sh CKPTD_BINARY COORDINATOR_BINARY RELAY_BINARY. Exit 77
# (skipped) without systemd-analyze.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
ckptd="$1" coordinator="$2" relay="$3"
command -v systemd-analyze >/dev/null || { echo "SKIP: no systemd-analyze"; exit 77; }
[[ -d /usr/lib/systemd/system ]] || { echo "SKIP: no /usr/lib/systemd/system to verify against"; exit 77; }
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/usr/bin" "$root/usr/lib/systemd" "$root/etc/systemd/system"
cp -a /usr/lib/systemd/system "$root/usr/lib/systemd/"
cp "$ckptd" "$root/usr/bin/ckptd"
cp "$coordinator" "$root/usr/bin/ckpt-coordinator"
cp "$relay" "$root/usr/bin/ckpt-relay"
units=(ckptd.service ckpt-coordinator.service ckpt-relay.service)
for unit in "${units[@]}"; do cp "$here/$unit" "$root/etc/systemd/system/"; done

status=0
# verify prints problems on stderr and exits non-zero on errors; warnings
# (e.g. an unknown directive) only print: both fail this test.
out="$(systemd-analyze verify --root="$root" "${units[@]}" 2>&1)" || status=1
if [[ -n "$out" ]]; then
  echo "systemd-analyze verify:"; echo "$out"; status=1
else
  echo "systemd-analyze verify: ${units[*]} clean"
fi
for pair in ckptd.service:35 ckpt-coordinator.service:20 ckpt-relay.service:20; do
  unit="${pair%%:*}" max="${pair##*:}"
  line="$(systemd-analyze security --offline=yes --root="$root" "$unit" 2>&1 | grep 'Overall exposure level')" || true
  echo "$line (ceiling $((max / 10)).$((max % 10)))"
  if ! systemd-analyze security --offline=yes --root="$root" --threshold="$max" "$unit" >/dev/null 2>&1; then
    echo "FAIL: $unit is more exposed than $((max / 10)).$((max % 10))"; status=1
  fi
done
exit $status
