"""Does a container image exist? A small read-only client of the OCI distribution API.

`reconciler doctor` asks before the first paid run, so that a job is not rented a GPU only to fail
pulling a misspelt image. One manifest lookup per image: `HEAD /v2/<name>/manifests/<reference>`
with the Accept types of an OCI index and manifest and of a Docker v2 manifest list and manifest
(a registry answers 404 for a type it is not asked for). On a 401 whose `WWW-Authenticate` is a
Bearer challenge, an anonymous token is fetched from its realm (with its service and scope, or a
pull scope on the repository), as Docker Hub and ghcr.io want, and the lookup is repeated once.
A registry that refuses HEAD (405) is asked with GET.

Names are read as Docker reads them: a first component with a '.' or ':' or `localhost` is the
registry; otherwise Docker Hub (`registry-1.docker.io`), with `library/` before a bare name.
Loopback registries are spoken to over plain HTTP (Docker allows that for 127.0.0.0/8 too); every
other registry over HTTPS. Nothing is pulled or pushed; no credential is ever put in a message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import httpx

DOCKER_HUB = "registry-1.docker.io"
MANIFEST_TYPES = ", ".join((
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
))
LOOPBACK = re.compile(r"^(localhost|127(\.\d{1,3}){3}|\[::1\])(:\d+)?$")
CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')


@dataclass(frozen=True)
class ImageName:
    """An image reference split as Docker splits it."""

    registry: str  # host[:port]; Docker Hub is registry-1.docker.io
    repository: str  # e.g. library/ubuntu
    reference: str  # a tag or a digest (sha256:...)

    @property
    def base_url(self) -> str:
        scheme = "http" if LOOPBACK.match(self.registry) else "https"
        return f"{scheme}://{self.registry}"


def parse_image(image: str) -> ImageName:
    """`ubuntu` -> Docker Hub library/ubuntu:latest; `ghcr.io/o/n:tag`; `host:5000/n@sha256:...`.
    Raises ValueError, in one sentence, for a name Docker would refuse."""
    text = image.strip()
    name, digest = text.split("@", 1) if "@" in text else (text, "")
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        registry, path = first, rest
    else:
        registry, path = DOCKER_HUB, name
    tag = ""
    last_slash = path.rfind("/")
    if ":" in path[last_slash + 1:]:
        path, tag = path.rsplit(":", 1)
    if registry in ("docker.io", "index.docker.io"):
        registry = DOCKER_HUB
    if registry == DOCKER_HUB and "/" not in path:
        path = f"library/{path}"
    if not path or not re.fullmatch(r"[a-z0-9]+([._-]+[a-z0-9]+|/[a-z0-9]+)*", path.replace("__", "_")):
        raise ValueError(f"{image!r} is not an image name Docker accepts "
                         "(a lower-case repository, then an optional :tag or @digest)")
    return ImageName(registry, path, digest or tag or "latest")


@dataclass(frozen=True)
class ImageAnswer:
    """What the registry said: `found` (with the manifest's digest), or not, and why."""

    found: bool
    detail: str  # one sentence for a person
    digest: str = ""
    reachable: bool = True  # False: the registry could not be asked (network, 5xx): nothing is known


class ImageLookup:
    """Looks images up; one httpx client for every registry (tokens are kept per repository)."""

    def __init__(self, timeout: float = 15.0, transport: httpx.BaseTransport | None = None) -> None:
        self.client = httpx.Client(timeout=timeout, transport=transport, follow_redirects=True)

    def close(self) -> None:
        self.client.close()

    def check(self, image: str) -> ImageAnswer:
        try:
            name = parse_image(image)
        except ValueError as exc:
            return ImageAnswer(False, str(exc))
        try:
            return self._check(name)
        except httpx.HTTPError as exc:
            return ImageAnswer(False, f"registry {name.registry} could not be asked ({type(exc).__name__})",
                               reachable=False)

    def _check(self, name: ImageName) -> ImageAnswer:
        url = f"{name.base_url}/v2/{name.repository}/manifests/{name.reference}"
        headers = {"Accept": MANIFEST_TYPES}
        response = self._ask(url, headers)
        if response.status_code == 401:
            token = self._anonymous_token(response.headers.get("WWW-Authenticate", ""), name)
            if token:
                response = self._ask(url, {**headers, "Authorization": f"Bearer {token}"})
        where = f"{name.registry}/{name.repository}:{name.reference}"
        status = response.status_code
        if status == 200:
            digest = response.headers.get("Docker-Content-Digest", "")
            short = digest[:19] + "…" if len(digest) > 20 else digest  # sha256: and 12 hex digits, as docker shows
            return ImageAnswer(True, f"{where} exists" + (f" ({short})" if short else ""), digest)
        if status == 404:
            return ImageAnswer(False, f"{where} does not exist (the registry answered 404)")
        if status in (401, 403):
            return ImageAnswer(False, f"{where} does not exist or is private: the registry refused an "
                                      f"anonymous pull (HTTP {status})")
        return ImageAnswer(False, f"registry {name.registry} answered HTTP {status} for {where}",
                           reachable=status < 500 and status != 429)

    def _ask(self, url: str, headers: dict[str, str]) -> httpx.Response:
        response = self.client.head(url, headers=headers)
        if response.status_code == 405:
            response = self.client.get(url, headers=headers)
        return response

    def _anonymous_token(self, challenge: str, name: ImageName) -> str | None:
        """The Bearer challenge's realm asked for a pull token with no credentials (None if none)."""
        scheme, _, params = challenge.partition(" ")
        if scheme.lower() != "bearer":
            return None
        fields = dict(CHALLENGE_PARAM.findall(params))
        realm = fields.get("realm")
        if not realm:
            return None
        query = {"scope": fields.get("scope") or f"repository:{name.repository}:pull"}
        if fields.get("service"):
            query["service"] = fields["service"]
        answer = self.client.get(realm, params=query)
        if answer.status_code != 200:
            return None
        try:
            body = answer.json()
        except ValueError:
            return None
        token = body.get("token") or body.get("access_token") if isinstance(body, dict) else None
        return token if isinstance(token, str) and token else None
