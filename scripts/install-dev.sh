#!/usr/bin/env bash
# Installs the package with its test dependencies. torch is pinned to the CPU build on disk;
# the package's own extra keeps a range.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q torch==2.13.0
python -m pip install -q -e '.[torch,s3,dev]'
