#!/usr/bin/env bash
# Installs the package with its test dependencies. torch is pinned to the CPU build on disk;
# the package's own extra keeps a range.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q torch==2.13.0 -e '.[torch,s3,hosted,dev]'
# Three official clients, each only for the test that points it at our fake server, without their
# dependencies (one pip call, since each call costs a couple of seconds):
# - Lightning AI's SDK (its generated REST client): its dependencies are a web stack (fastapi,
#   uvicorn, textual) the test does not need;
# - vastai: it pins cryptography and pillow to exact versions the rest of the environment does not need;
# - runpod (the test loads runpod.api alone): its full install pulls in fastapi, paramiko, boto3 and
#   opentelemetry.
python -m pip install -q --no-deps lightning-sdk==2026.10.13 vastai==1.9.1 runpod==1.12.0
