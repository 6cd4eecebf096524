"""The files a platform review looks for: LICENSE matching the package metadata, SECURITY.md naming
the supported version, CHANGELOG.md with a section for the released version and upgrade notes."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def _version() -> str:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["license"] == {"text": "Apache-2.0"}
    return str(project["version"])


def test_license_is_the_apache_2_text_the_metadata_names() -> None:
    _version()
    text = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_changelog_and_security_policy_follow_the_version() -> None:
    version = _version()
    chart = yaml.safe_load((REPO / "charts" / "multilane" / "Chart.yaml").read_text(encoding="utf-8"))
    assert chart["version"] == chart["appVersion"] == version
    changelog = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## (.+)$", changelog, flags=re.M)
    assert headings[0] == "Unreleased" and version in headings, headings
    assert "### Upgrade notes" in changelog
    minor = ".".join(version.split(".")[:2])
    security = (REPO / "SECURITY.md").read_text(encoding="utf-8")
    assert re.search(rf"^\| {re.escape(minor)}\.x \| yes \|$", security, flags=re.M), security
    assert "## Reporting a vulnerability" in security
