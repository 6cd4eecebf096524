"""The install is reproducible and its extras match the code.

- constraints.txt pins every dependency that pyproject.toml names (core and every extra), each pin
  inside pyproject's range, once;
- the venv the tests run in holds exactly the pinned versions (bootstrap.sh installs with the file);
- :data:`multilane.extras.EXTRAS` and pyproject's extras agree, and ``all`` covers every extra;
- a missing extra gives a one-line error naming it (the wheel test in tests/install checks the same
  from a venv where the extras really are absent).
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from multilane import cli
from multilane.extras import EXTRAS, MissingExtraError, extra_for_module, require

ROOT = Path(__file__).resolve().parents[2]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for raw in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([A-Za-z0-9_.+!\-]+)", line)
        assert m, f"constraints.txt: {raw!r} is not an exact pin name==version"
        name = canonicalize_name(m.group(1))
        assert name not in pins, f"constraints.txt pins {name} twice"
        pins[name] = m.group(2)
    return pins


def _requirements() -> list[Requirement]:
    project = _pyproject()["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        reqs += [Requirement(r) for r in extra]
    return [r for r in reqs if canonicalize_name(r.name) != "multilane"]


def test_constraints_pin_every_requirement_inside_its_range() -> None:
    pins = _pins()
    reqs = _requirements()
    assert len(reqs) > 20
    for req in reqs:
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} ({req}) is in pyproject.toml but not pinned in constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"constraints.txt pins {name}=={pins[name]}, outside pyproject's {req}")


def test_the_test_venv_runs_the_pinned_versions() -> None:
    """What CI tests is what constraints.txt says (scripts/bootstrap.sh installs with it)."""
    drift = []
    for name, version in _pins().items():
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            drift.append(f"{name}: pinned {version}, not installed")
            continue
        if installed != version:
            drift.append(f"{name}: pinned {version}, installed {installed}")
    assert not drift, "run bash scripts/bootstrap.sh: " + "; ".join(drift)


def test_extras_in_code_and_pyproject_agree() -> None:
    declared = _pyproject()["project"]["optional-dependencies"]
    for extra in EXTRAS:
        assert extra in declared, f"multilane.extras names {extra!r}, pyproject.toml has no such extra"
    everything = Requirement(declared["all"][0])
    assert canonicalize_name(everything.name) == "multilane"
    assert set(declared) - {"all", "demo"} <= everything.extras, "`all` must include every extra"
    demo = Requirement(declared["demo"][0])
    assert demo.extras == set(cli.COMMANDS["demo"][2]), "the demo extra is what `multilane demo` requires"
    for name, (_module, _help, extras) in cli.COMMANDS.items():
        assert set(extras) <= set(EXTRAS), f"multilane {name} needs an unknown extra"


def test_a_missing_extra_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "kopf", None)  # find_spec() answers None: not importable
    with pytest.raises(MissingExtraError) as err:
        require("operator", for_what="multilane operator")
    message = str(err.value)
    assert "\n" not in message
    assert "'operator' extra" in message and "kopf" in message and "multilane[operator]" in message
    assert cli.main(["operator", "--help"]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.strip() == message
    assert extra_for_module("kopf.on") == "operator"
    assert extra_for_module("confluent_kafka") is None
