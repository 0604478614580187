#!/usr/bin/env bash
# Every linter and scanner the tests run (tests/scan), by hand, with their own output:
# hadolint on the Dockerfiles, ShellCheck on the shell scripts, checkov on the chart rendered
# with each ci/ values file (.checkov.yaml), on the children the operator makes for the
# sample job (.checkov-children.yaml) and on the Dockerfiles (.checkov-images.yaml).
# Installs the pinned tools first (scripts/scanners.txt).
#   scripts/scan.sh [OUTDIR]   OUTDIR keeps the rendered manifests (default: a temporary dir)
# Exit status 1 when any of them found something.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
tools="$(bash scripts/install-scanners.sh)/bin"
out="${1:-$(mktemp -d)}"
status=0

echo "== hadolint $("$tools/hadolint" --version | awk '{print $NF}')"
"$tools/hadolint" images/*/Dockerfile examples/Dockerfile || status=1

echo "== shellcheck $("$tools/shellcheck" --version | awk '/^version:/ {print $2}')"
mapfile -t scripts < <(git ls-files '*.sh' .ci/run)
"$tools/shellcheck" --external-sources "${scripts[@]}" || status=1

echo "== checkov $("$tools/checkov" --version) (manifests in $out)"
.venv/bin/python -m tests.scan.manifests "$out" >/dev/null
# Run from the output directory so that only the named config applies.
(cd "$out" && "$tools/checkov" --config-file "$root/.checkov.yaml" -d chart --compact --quiet) \
  || status=1
(cd "$out" && "$tools/checkov" --config-file "$root/.checkov-children.yaml" -d children \
  --compact --quiet) || status=1
(cd "$out" && "$tools/checkov" --config-file "$root/.checkov-images.yaml" --compact --quiet \
  -f "$root/images/operator/Dockerfile" -f "$root/images/worker/Dockerfile" \
  -f "$root/examples/Dockerfile" -f "$root/images/pause/Dockerfile" \
  -f "$root/images/coredns/Dockerfile") || status=1
exit "$status"
