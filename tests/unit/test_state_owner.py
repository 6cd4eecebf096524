"""The state directory's owner stamp (multilane/worker/state/owner.py): a worker never opens stores a
ParallelConsumer with another uid left on a retained volume; its own survive a restart."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from multilane.worker import cli as worker_cli
from multilane.worker.state.owner import OWNER_FILE, claim_state_dir


def _stores(root: Path) -> None:
    (root / "orders-0").mkdir(parents=True)
    (root / "orders-0" / "CURRENT").write_text("rocksdb")
    (root / "orders-1.lock").write_text("")
    (root / "lost+found").mkdir()


def test_fresh_directory_is_stamped(tmp_path: Path) -> None:
    assert claim_state_dir(tmp_path / "state", "uid-a") is False
    assert (tmp_path / "state" / OWNER_FILE).read_text().strip() == "uid-a"


def test_own_stores_are_kept(tmp_path: Path) -> None:
    claim_state_dir(tmp_path, "uid-a")
    _stores(tmp_path)
    assert claim_state_dir(tmp_path, "uid-a") is False
    assert (tmp_path / "orders-0" / "CURRENT").read_text() == "rocksdb"


def test_another_owners_stores_are_wiped_and_the_directory_restamped(tmp_path: Path) -> None:
    """A ParallelConsumer re-created under the same name (new uid) mounting a retained volume."""
    claim_state_dir(tmp_path, "uid-old")
    _stores(tmp_path)
    assert claim_state_dir(tmp_path, "uid-new") is True
    assert sorted(e.name for e in tmp_path.iterdir()) == [OWNER_FILE, "lost+found"]
    assert (tmp_path / OWNER_FILE).read_text().strip() == "uid-new"


def test_unstamped_content_is_wiped(tmp_path: Path) -> None:
    """Stores written before stamps existed (or by an unknown writer) cannot be told apart: wiped."""
    _stores(tmp_path)
    assert claim_state_dir(tmp_path, "uid-a") is True
    assert not (tmp_path / "orders-0").exists()


def test_empty_owner_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="non-empty"):
        claim_state_dir(tmp_path, " ")


def test_worker_state_owner_flag_needs_state_dir() -> None:
    parser = argparse.ArgumentParser()
    worker_cli.add_arguments(parser)
    args = parser.parse_args(
        ["--bootstrap-servers", "k:9092", "--group", "g", "--processor", "m:f", "--state-owner", "u"]
    )
    with pytest.raises(worker_cli.ConfigError, match="--state-owner"):
        worker_cli.check_state_args(args)
