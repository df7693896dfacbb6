#!/usr/bin/env bash
# What the test suite needs besides Python, installed when missing (make test runs this):
#   protoc + protoc-gen-go   `iac proto compile` tests
#   zstd                     the independent decoder of the JS interop verifier
#   redis-server             Redis replay-store and registry tests (tests start their own server)
#   node + npm               the JS interop verifier and buf (tests/interop/js, npm ci)
#   iptables + conntrack     the NAT tests (tests/test_nat.py builds NATs in network namespaces)
#   nats-server              the NATS contender of the benchmark suite (tests/test_bench_brokers.py)
# Debian packages are installed with apt-get when this runs as root (or with sudo).
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v protoc >/dev/null || need+=(protobuf-compiler)
command -v protoc-gen-go >/dev/null || need+=(protoc-gen-go)
command -v zstd >/dev/null || need+=(zstd)
command -v redis-server >/dev/null || need+=(redis-server)
command -v node >/dev/null || need+=(nodejs)
command -v npm >/dev/null || need+=(npm)
command -v iptables >/dev/null || need+=(iptables)
command -v conntrack >/dev/null || need+=(conntrack)
command -v nats-server >/dev/null || need+=(nats-server)

if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=""
  elif command -v sudo >/dev/null; then SUDO="sudo"
  else
    echo "test-deps: missing ${need[*]}; install these Debian packages (needs root)" >&2
    exit 1
  fi
  echo "test-deps: installing ${need[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

js=tests/interop/js
if [ ! -d "$js/node_modules" ] || [ "$js/package-lock.json" -nt "$js/node_modules" ]; then
  (cd "$js" && npm ci --no-audit --no-fund --loglevel=error)
  touch "$js/node_modules"
fi
