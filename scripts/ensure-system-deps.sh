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
exit 0
