#!/usr/bin/env bash
# Install the pinned linters and scanners of scripts/scanners.txt (hadolint, shellcheck,
# checkov) into their own virtualenv, ${MONARCH_OPERATOR_CACHE:-~/.cache/monarch-operator}/
# scanners-<hash of scanners.txt>/, once; later runs only print its path. Idempotent.
#   scripts/install-scanners.sh          install if missing; print the virtualenv's directory
#   scripts/install-scanners.sh --path   print the directory only (installs nothing)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
requirements="$here/scanners.txt"
cache="${MONARCH_OPERATOR_CACHE:-$HOME/.cache/monarch-operator}"
venv="$cache/scanners-$(sha256sum "$requirements" | cut -c1-12)"
if [ "${1:-}" = "--path" ]; then
  echo "$venv"
  exit 0
fi
if [ ! -f "$venv/.complete" ]; then
  echo "[install-scanners] pip install -r scripts/scanners.txt into $venv" >&2
  # Built in place (a virtualenv's scripts name its directory); .complete marks success, so
  # an interrupted install starts again from scratch.
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$requirements" >&2
  for tool in hadolint shellcheck checkov; do
    "$venv/bin/$tool" --version >/dev/null
  done
  touch "$venv/.complete"
fi
echo "$venv"
