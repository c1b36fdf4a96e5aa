#!/bin/sh
# Every binary we ship or document answers --version ("<name> <version>"
# on stdout, exit 0) and --help (a usage on stdout, exit 0), without
# starting anything. Arguments: the version, then the binaries.
version=$1
shift
failed=0
for b in "$@"; do
  name=$(basename "$b")
  out=$("$b" --version </dev/null 2>&1)
  rc=$?
  case "$out" in
    *"$name $version"*) [ $rc -eq 0 ] || { echo "$name --version: exit $rc: $out"; failed=1; } ;;
    *) echo "$name --version: exit $rc, no \"$name $version\" in: $out"; failed=1 ;;
  esac
  out=$("$b" --help </dev/null 2>&1)
  rc=$?
  if [ $rc -ne 0 ] || [ -z "$out" ]; then
    echo "$name --help: exit $rc: $(printf '%s' "$out" | head -3)"
    failed=1
  fi
done
[ $failed -eq 0 ] && echo "$# binaries answer --version and --help"
exit $failed
