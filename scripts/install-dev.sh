#!/usr/bin/env bash
# Installs the package with its test dependencies. torch is pinned to the CPU build on disk;
# the package's own extra keeps a range.
set -euo pipefail
cd "$(dirname "$0")/.."
extras=torch,s3,hosted,dev
clients=(lightning-sdk==2026.10.13 vastai==1.9.1 runpod==1.12.0)  # see below
if python scripts/deps_ready.py "$extras" torch==2.13.0 "${clients[@]}" 2>/dev/null; then
  # Everything is there in a version the project allows: only this checkout is installed again
  # (editable), in about 3 s instead of the 9 s pip takes to resolve the whole set and find it there.
  python -m pip install -q --no-deps --no-build-isolation -e .
  exit 0
fi
python -m pip install -q torch==2.13.0 -e ".[$extras]"
# Three official clients, each only for the test that points it at our fake server, without their
# dependencies (one pip call, since each call costs a couple of seconds):
# - Lightning AI's SDK (its generated REST client): its dependencies are a web stack (fastapi,
#   uvicorn, textual) the test does not need;
# - vastai: it pins cryptography and pillow to exact versions the rest of the environment does not need;
# - runpod (the test loads runpod.api alone): its full install pulls in fastapi, paramiko, boto3 and
#   opentelemetry.
python -m pip install -q --no-deps "${clients[@]}"
