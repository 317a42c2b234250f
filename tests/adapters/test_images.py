"""The image lookup (adapters/images.py) against a real registry (Debian's docker-registry) on
127.0.0.1, directly and behind a Bearer token realm as Docker Hub and ghcr.io answer."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from adapters.images import DOCKER_HUB, ImageLookup, parse_image
from tests.fakes.oci_registry import TokenFront


@pytest.fixture
def lookup() -> Iterator[ImageLookup]:
    client = ImageLookup(timeout=5)
    yield client
    client.close()


@pytest.fixture
def front(oci_registry: Any) -> Iterator[TokenFront]:
    server = TokenFront(oci_registry).start()
    yield server
    server.stop()


@pytest.mark.parametrize(("image", "registry", "repository", "reference"), [
    ("ubuntu", DOCKER_HUB, "library/ubuntu", "latest"),
    ("pytorch/pytorch:2.3.1-cuda12.1-cudnn8-runtime", DOCKER_HUB, "pytorch/pytorch", "2.3.1-cuda12.1-cudnn8-runtime"),
    ("docker.io/library/python:3.11", DOCKER_HUB, "library/python", "3.11"),
    ("ghcr.io/owner/trainer:v1", "ghcr.io", "owner/trainer", "v1"),
    ("localhost:5000/team/img", "localhost:5000", "team/img", "latest"),
    ("127.0.0.1:5000/img@sha256:" + "a" * 64, "127.0.0.1:5000", "img", "sha256:" + "a" * 64),
])
def test_names_are_read_as_docker_reads_them(image: str, registry: str, repository: str, reference: str) -> None:
    name = parse_image(image)
    assert (name.registry, name.repository, name.reference) == (registry, repository, reference)


def test_a_name_docker_refuses_is_one_sentence(lookup: ImageLookup) -> None:
    answer = lookup.check("Team/Trainer:v1")
    assert not answer.found and "is not an image name Docker accepts" in answer.detail


def test_a_pushed_image_is_found_with_its_digest(oci_registry: Any, lookup: ImageLookup) -> None:
    digest = oci_registry.push("team/trainer", "v1")
    answer = lookup.check(f"{oci_registry.host}/team/trainer:v1")
    assert answer.found and answer.digest == digest
    by_digest = lookup.check(f"{oci_registry.host}/team/trainer@{digest}")
    assert by_digest.found


def test_a_missing_tag_and_a_missing_repository_are_not_found(oci_registry: Any, lookup: ImageLookup) -> None:
    oci_registry.push("team/trainer", "v1")
    for image in (f"{oci_registry.host}/team/trainer:v2", f"{oci_registry.host}/team/nothing:v1"):
        answer = lookup.check(image)
        assert not answer.found and answer.reachable and "does not exist" in answer.detail


def test_an_unreachable_registry_is_said_to_be_unknown(lookup: ImageLookup) -> None:
    answer = lookup.check("127.0.0.1:9/team/trainer:v1")
    assert not answer.found and not answer.reachable and "could not be asked" in answer.detail


def test_a_token_realm_is_followed_with_its_service_and_scope(oci_registry: Any, front: TokenFront,
                                                               lookup: ImageLookup) -> None:
    oci_registry.push("team/behind", "v3")
    assert lookup.check(f"{front.host}/team/behind:v3").found
    assert front.token_requests[-1] == {"service": [front.service], "scope": ["repository:team/behind:pull"]}
    missing = lookup.check(f"{front.host}/team/behind:v4")
    assert not missing.found and "does not exist" in missing.detail
    assert set(front.methods) <= {"HEAD", "GET"}  # a lookup never pushes
