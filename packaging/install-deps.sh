#!/usr/bin/env bash
# Installs the Debian packages that psfleet needs, in two groups: what building and running the demo
# takes (--demo: run-demo.sh), and what the tests add (default, or --all: tests/run.sh and .ci/run).
# Idempotent: installs only what is missing, and says what. Run as root (or through sudo) on Debian 12.
# --list prints the group's packages, one a line, and installs nothing.
set -euo pipefail

# The demo: build it and train the example job.
# package                     why
DEMO_PKGS=(
  build-essential             # C compiler, make
  cmake pkg-config            # the build
  libgrpc-dev                 # RPC: gRPC C core
  libssl-dev                  # libcrypto: TLS credentials, psfleet certs
  libprotobuf-c-dev protobuf-c-compiler grpc-proto  # messages (protoc-c), health.proto
  libsystemd-dev              # sd_notify, journal
  libsqlite3-dev              # chiefd's records
  librocksdb-dev              # psd's disk tier of embedding tables
  libjansson-dev              # job files, checkpoint headers
  libopenblas-dev             # CPU sgemm
  zlib1g-dev                  # gzip'd IDX data
  libmicrohttpd-dev           # the daemons' /metrics endpoint
  libgnutls28-dev             # /metrics over HTTPS: checking the scraper's certificate
  libonnx-dev                 # ONNX's onnx.proto, compiled by protoc-c at build time (the model loader)
  dataset-fashion-mnist       # the demo's data
)

# Only the tests: unit, integration, system and package checks.
TEST_PKGS=(
  libcmocka-dev               # unit tests
  openssl                     # openssl(1) checks certificates in tests
  python3 python3-grpcio python3-protobuf protobuf-compiler protobuf-compiler-grpc python3-numpy  # Python test clients
  procps psmisc               # pgrep/pkill in tests
  python3-venv                # a venv for PyPI test tools (safetensors, tensorboard)
  debootstrap systemd-container  # the system test: a Debian container booted with systemd-nspawn
  iproute2 nftables           # the multi-node tests: a namespace per node, and a partition cut with nft
  podman runc                 # system.k8s: the OCI image and the TFJob's pods (runc: crun refuses hybrid cgroups)
  golang-github-containernetworking-plugin-dnsname  # system.k8s: the pods find each other by name, as Services'
  dpkg-dev lintian rpm rpmlint   # building and checking the .deb and .rpm packages
  prometheus                  # promtool and a real Prometheus for the metrics tests
  clang libclang-rt-14-dev    # the fuzz harnesses: clang with libFuzzer, ASan and UBSan (tests/fuzz)
  python3-torch               # examples/models/export.py: the example models in PyTorch, exported to ONNX
)

group=all list=false
for a in "$@"; do
  case "$a" in
    --demo) group=demo ;;
    --all) group=all ;;
    --list) list=true ;;
    -h|--help) sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install-deps: unknown option $a (--demo, --all, --list)" >&2; exit 2 ;;
  esac
done
PKGS=("${DEMO_PKGS[@]}")
[ "$group" = demo ] || PKGS+=("${TEST_PKGS[@]}")

if $list; then
  printf '%s\n' "${PKGS[@]}"
  exit 0
fi

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages ($group) already installed"
  exit 0
fi

echo "install-deps: installing ${#missing[@]} package(s) ($group): ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install-deps: done"
