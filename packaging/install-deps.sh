#!/usr/bin/env bash
# Installs the Debian packages that psfleet's build, tests and demo need. Idempotent: installs only
# what is missing, and says what. Run as root (or through sudo) on Debian 12.
set -euo pipefail

# package                     why
PKGS=(
  build-essential             # C compiler, make
  cmake pkg-config            # the build
  libgrpc-dev                 # RPC: gRPC C core
  libssl-dev openssl          # psfleet certs (libcrypto); openssl(1) checks certificates in tests
  libprotobuf-c-dev protobuf-c-compiler protobuf-compiler grpc-proto  # messages, health.proto
  libsystemd-dev              # sd_notify, journal
  libsqlite3-dev              # chiefd's records
  libjansson-dev              # job files, checkpoint headers
  libopenblas-dev             # CPU sgemm
  zlib1g-dev                  # gzip'd IDX data
  libmicrohttpd-dev           # the daemons' /metrics endpoint
  libcmocka-dev               # unit tests
  python3 python3-grpcio python3-protobuf protobuf-compiler-grpc python3-numpy  # Python test clients
  dataset-fashion-mnist       # the demo's data
  procps psmisc               # pgrep/pkill in tests
  python3-venv                # a venv for PyPI test tools (safetensors, tensorboard)
  debootstrap systemd-container  # the system test: a Debian container booted with systemd-nspawn
  dpkg-dev lintian rpm rpmlint   # building and checking the .deb and .rpm packages
  prometheus                  # promtool and a real Prometheus for the metrics tests
)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages already installed"
  exit 0
fi

echo "install-deps: installing ${#missing[@]} package(s): ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install-deps: done"
