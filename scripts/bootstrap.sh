#!/usr/bin/env bash
# Create or reuse the project's virtualenv and install everything the demo and the tests need.
#
# Order matters: the CPU build of torch is installed from the local wheel *first*; installing the project
# before that would let pip resolve "torch" to a multi-GB CUDA build from PyPI.
set -euo pipefail

VENV=${1:-.venv}
PYTHON=${PYTHON:-}
if [ -z "$PYTHON" ]; then
  for candidate in python3.11 python3.12 python3; do
    if command -v "$candidate" >/dev/null 2>&1; then PYTHON=$candidate; break; fi
  done
fi
if [ -z "$PYTHON" ]; then
  echo "error: no python3 found; install Python 3.11 and retry" >&2
  exit 2
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "==> creating virtualenv $VENV with $PYTHON"
  "$PYTHON" -m venv "$VENV"
fi
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip 2>&1 | grep -v "is ignored" || true

if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
  echo "==> installing torch (CPU build) first"
  $PIP install -q "torch==2.13.0" 2>&1 | grep -v "is ignored" || true
  "$VENV/bin/python" -c "import torch" || {
    echo "error: could not install torch==2.13.0. On a machine without the local wheel, install a CPU" >&2
    echo "       build first: $PIP install torch --index-url https://download.pytorch.org/whl/cpu" >&2
    exit 2
  }
fi

echo "==> installing diet-capc and its dev tools"
$PIP install -q -e ".[dev]" 2>&1 | grep -v "is ignored" || true
"$VENV/bin/python" -c "import capc_common, capc_cli, capc_services" || {
  echo "error: the project did not install; see pip's output above" >&2
  exit 1
}

FMNIST=/usr/share/datasets/fashion-mnist
if [ ! -f "$FMNIST/train-images-idx3-ubyte.gz" ] && [ ! -f "$FMNIST/train-images-idx3-ubyte" ]; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
    echo "==> installing the Fashion-MNIST Debian package"
    (apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist) >/dev/null 2>&1 || true
  elif command -v apt-get >/dev/null 2>&1 && command -v sudo >/dev/null 2>&1; then
    echo "==> installing the Fashion-MNIST Debian package (sudo)"
    (sudo apt-get update -qq && sudo apt-get install -y -qq dataset-fashion-mnist) >/dev/null 2>&1 || true
  fi
  if [ ! -f "$FMNIST/train-images-idx3-ubyte.gz" ]; then
    echo "note: Fashion-MNIST is not installed at $FMNIST (needs apt-get: 'apt-get install dataset-fashion-mnist')." >&2
    echo "      Anything that needs it will say so; point CAPC_FASHION_MNIST at another IDX directory instead." >&2
  fi
fi
# The dashboard's browser test drives Debian's chromium through chromium-driver (no browser download).
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  CHROMIUM="apt-get install -y -qq chromium chromium-driver"
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
    echo "==> installing Debian's chromium and chromium-driver (for the dashboard's browser test)"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive $CHROMIUM) >/dev/null 2>&1 || true
  elif command -v apt-get >/dev/null 2>&1 && command -v sudo >/dev/null 2>&1; then
    echo "==> installing Debian's chromium and chromium-driver (sudo; for the dashboard's browser test)"
    (sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive $CHROMIUM) >/dev/null 2>&1 || true
  fi
  if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
    echo "note: chromium/chromedriver are not installed ('$CHROMIUM' needs apt-get);" >&2
    echo "      the dashboard's browser test will be skipped and say so." >&2
  fi
fi
# The link lab (tests/e2e/test_links.py, benchmarks/wan.py, chaos.py --faults) partitions links with iptables
# inside its network namespaces (a Debian package).
if ! command -v iptables >/dev/null 2>&1; then
  LAB="apt-get install -y -qq iptables"
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
    echo "==> installing Debian's iptables (for the link lab)"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive $LAB) >/dev/null 2>&1 || true
  fi
  if ! command -v iptables >/dev/null 2>&1; then
    echo "note: iptables is not installed ('$LAB' needs root); the link lab's tests will say so." >&2
  fi
fi
echo "==> environment ready: $VENV"
