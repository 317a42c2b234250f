#!/usr/bin/env bash
# Installs the package with its test dependencies. torch is pinned to the CPU build on disk;
# the package's own extra keeps a range.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q torch==2.13.0
python -m pip install -q -e '.[torch,s3,hosted,dev]'
# Lightning AI's SDK, only for the test that points its generated REST client at our fake server:
# without --no-deps it pulls a web stack (fastapi, uvicorn, textual) the test does not need.
python -m pip install -q --no-deps lightning-sdk==2026.10.13
# vastai, only for the test that points the official client at our fake Vast server: it pins
# cryptography and pillow to exact versions the rest of the environment does not need.
python -m pip install -q --no-deps vastai==1.9.1
# runpod, only for the test that points its GraphQL client at our fake (its full install pulls in
# fastapi, paramiko, boto3 and opentelemetry; the test loads runpod.api alone).
python -m pip install -q --no-deps runpod==1.12.0
