"""The image build: mirror discovery, the content hash, and the no-op rebuild on real Docker."""

from __future__ import annotations

from pathlib import Path

import pytest

from mathagent.config import SandboxSettings
from mathagent.sandbox.image import (
    DEFAULT_MIRROR,
    HASH_LABEL,
    apt_mirror,
    build_image,
    content_hash,
    image_tag,
)


def test_apt_mirror_reads_deb822_and_one_line_sources(tmp_path: Path):
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n\n"
        "Types: deb\nURIs: http://mirror.example/debian/\nSuites: bookworm bookworm-updates\n"
    )
    assert apt_mirror(tmp_path) == "http://mirror.example/debian"
    (tmp_path / "sources.list.d" / "debian.sources").unlink()
    (tmp_path / "sources.list").write_text("deb http://old.example/debian bookworm main\n")
    assert apt_mirror(tmp_path) == "http://old.example/debian"
    (tmp_path / "sources.list").write_text("# nothing\n")
    assert apt_mirror(tmp_path) == DEFAULT_MIRROR


def test_tag_and_hash():
    assert image_tag(SandboxSettings(image="x")).startswith("x:")
    assert image_tag(SandboxSettings(image="x:dev")) == "x:dev"
    assert content_hash("http://a") != content_hash("http://b")


@pytest.mark.docker
def test_build_is_a_noop_when_current(sandbox_image: str, docker_client):
    again = build_image(SandboxSettings(), client=docker_client)
    assert again.image == sandbox_image and not again.built and again.seconds < 5
    labels = docker_client.images.get(sandbox_image).labels
    assert labels[HASH_LABEL] == content_hash(apt_mirror())
