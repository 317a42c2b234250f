"""A real OCI distribution registry on 127.0.0.1 (Debian's `docker-registry`), and a token realm in front.

`Registry` runs `/usr/bin/docker-registry serve CONFIG` with a generated config on a free port and
a temp storage folder; `push()` puts a tiny image into it with plain HTTP calls, as a client does:
each blob by a monolithic upload (POST /v2/<name>/blobs/uploads/, then PUT ?digest=), then the
manifest (PUT /v2/<name>/manifests/<tag>).

`TokenFront` stands in front of it the way Docker Hub and ghcr.io do: a request without the token
gets 401 with `WWW-Authenticate: Bearer realm=...,service=...,scope=...`; its realm (`/token`)
hands out an anonymous token (recording what it was asked); with the token, requests are passed
on to the registry. Every request's method is recorded, so a test can prove nothing was pushed.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx

from tests.fakes.server import FakeServer, Reply, Request

REGISTRY_BIN = "/usr/bin/docker-registry"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


class RegistryUnavailable(Exception):
    pass


class Registry:
    def __init__(self, workdir: Path, port: int) -> None:
        self.workdir, self.port = workdir, port
        self.host = f"127.0.0.1:{port}"
        self.url = f"http://{self.host}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Registry:
        if not Path(REGISTRY_BIN).exists():
            raise RegistryUnavailable(f"{REGISTRY_BIN} is not installed (apt-get install docker-registry)")
        storage = self.workdir / "storage"
        storage.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "config.yml"
        config.write_text(json.dumps({  # YAML is a superset of JSON
            "version": 0.1, "log": {"level": "error"},
            "storage": {"filesystem": {"rootdirectory": str(storage)}},
            "http": {"addr": self.host},
        }))
        log = (self.workdir / "registry.log").open("wb")
        self.proc = subprocess.Popen([REGISTRY_BIN, "serve", str(config)], stdout=log, stderr=log)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                if httpx.get(f"{self.url}/v2/", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.1)
        self.stop()
        raise RegistryUnavailable(f"docker-registry did not answer on {self.host}: "
                                  f"{(self.workdir / 'registry.log').read_text()[-400:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        shutil.rmtree(self.workdir / "storage", ignore_errors=True)

    def push(self, repository: str, tag: str) -> str:
        """Push a one-layer image; returns its manifest digest."""
        config = json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}})
        layer = f"layer of {repository}:{tag}".encode()
        blobs = [self._blob(repository, config.encode()), self._blob(repository, layer)]
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": OCI_MANIFEST,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **blobs[0]},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **blobs[1]}],
        }).encode()
        answer = httpx.put(f"{self.url}/v2/{repository}/manifests/{tag}", content=manifest,
                           headers={"Content-Type": OCI_MANIFEST})
        answer.raise_for_status()
        return answer.headers["Docker-Content-Digest"]

    def _blob(self, repository: str, data: bytes) -> dict[str, Any]:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        start = httpx.post(f"{self.url}/v2/{repository}/blobs/uploads/")
        start.raise_for_status()
        location = start.headers["Location"]
        if location.startswith("/"):
            location = self.url + location
        sep = "&" if "?" in location else "?"
        done = httpx.put(f"{location}{sep}digest={digest}", content=data,
                         headers={"Content-Type": "application/octet-stream"})
        done.raise_for_status()
        return {"digest": digest, "size": len(data)}


class TokenFront(FakeServer):
    """A Bearer-token realm in front of `registry`, as Docker Hub and ghcr.io answer anonymous pulls."""

    token = "anonymous-pull-token"
    service = "registry.test"
    http_methods = ("GET", "HEAD")

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.token_requests: list[dict[str, list[str]]] = []
        self.methods: list[str] = []  # every request to /v2/ (method), for "nothing was pushed"

    @property
    def host(self) -> str:
        return self.url.removeprefix("http://")

    def start(self) -> TokenFront:
        self.start_serving()
        return self

    def stop(self) -> None:
        self.stop_serving()

    def respond(self, request: Request) -> Reply:
        if request.path == "/token":
            self.token_requests.append(parse_qs(urlsplit(request.target).query))
            return Reply(200, json.dumps({"token": self.token}).encode())
        self.methods.append(request.method)
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            name = request.path.split("/manifests/")[0].removeprefix("/v2/")
            challenge = (f'Bearer realm="http://{self.host}/token",service="{self.service}",'
                         f'scope="repository:{name}:pull"')
            return Reply(401, b'{"errors":[{"code":"UNAUTHORIZED"}]}', {"WWW-Authenticate": challenge})
        answer = httpx.request(request.method, self.registry.url + request.target,
                               headers={"Accept": request.headers.get("Accept", "*/*")})
        keep = {k: v for k, v in answer.headers.items() if k.lower() in ("docker-content-digest", "content-type")}
        return Reply(answer.status_code, answer.content, keep)
