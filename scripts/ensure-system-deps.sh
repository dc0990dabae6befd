#!/usr/bin/env bash
# Install the system programs the tests use when missing and possible (root with apt); otherwise the
# tests that need them skip with the reason.
set -u
if ! command -v prometheus >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing prometheus (Debian package) for the Prometheus-source tests"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus) >/dev/null 2>&1 \
      || echo "could not install prometheus: its tests will be skipped"
  else
    echo "prometheus is not installed and cannot be installed here: its tests will be skipped"
  fi
fi
# kustomize, for the manifests/ tests: kubectl's built-in one or a kustomize on PATH, else one built from
# the Go module proxy into the virtualenv given as $1 (the tests look there too).
venv_bin="${1:-.venv}/bin"
if ! command -v kustomize >/dev/null 2>&1 && ! command -v kubectl >/dev/null 2>&1 && [ ! -x "$venv_bin/kustomize" ]; then
  if command -v go >/dev/null 2>&1 && [ -d "$venv_bin" ]; then
    echo "installing kustomize v5.5.0 (Go module proxy) into $venv_bin for the manifests tests (about a minute)"
    GOBIN="$(cd "$venv_bin" && pwd)" GOFLAGS=-mod=mod go install sigs.k8s.io/kustomize/kustomize/v5@v5.5.0 >/dev/null 2>&1 \
      || echo "could not install kustomize: the manifests tests will be skipped"
  else
    echo "neither kustomize nor kubectl is installed, and no Go to build kustomize: the manifests tests will be skipped"
  fi
fi
exit 0
