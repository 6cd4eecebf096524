"""``multilane state get|dump --state-dir`` (rendering and the read-only store read) and the input
parsing of ``multilane produce``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from multilane.cli import main
from multilane.worker.produce_cli import LineError, parse_lines
from multilane.worker.state.dump import show


def test_show_formats() -> None:
    assert show(b'{"total": 3}', "auto") == {"total": 3}
    assert show(b"alice", "auto") == "alice"
    assert show(b"\xff\x00", "auto") == {"base64": "/wA="}
    assert show(b"12", "str") == "12"
    assert show(b"12", "bytes") == {"base64": "MTI="}
    assert show(b"{bad", "json") == {"base64": "e2JhZA==", "error": "not json"}
    assert show(None, "auto") is None


def test_parse_lines() -> None:
    lines = ['{"customer": "alice", "amount": 5}\n', "\n", '{"customer": 7, "amount": 1}\r\n']
    assert parse_lines(lines, key_field="customer") == [
        (b"alice", b'{"customer": "alice", "amount": 5}'), (b"7", b'{"customer": 7, "amount": 1}')]
    assert parse_lines(["plain text\n", "more"], key="k") == [(b"k", b"plain text"), (b"k", b"more")]
    assert parse_lines(["x"]) == [(None, b"x")]
    with pytest.raises(LineError, match="line 2: no field 'customer'"):
        parse_lines(['{"customer": "a"}', '{"amount": 1}'], key_field="customer")
    with pytest.raises(LineError, match="line 1: not JSON"):
        parse_lines(["{oops"], key_field="customer")
    with pytest.raises(LineError, match="line 1: a JSON list"):
        parse_lines(["[1]"], key_field="customer")


def test_produce_refuses_a_bad_file_before_sending(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "orders.jsonl"
    bad.write_text('{"customer": "a"}\nnot json\n')
    # an unreachable broker: nothing is sent, the bad line is named
    code = main(["produce", "--bootstrap-servers", "127.0.0.1:9", "--topic", "t", "--key-field", "customer",
                 "--input", str(bad)])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [f"multilane produce: {bad}: line 2: not JSON (Expecting value: line 1 "
                                "column 1 (char 0)); --key-field needs JSON objects"]


def test_state_dump_and_get_from_a_state_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("rocksdict")
    from multilane.worker.state.store import PartitionStore, partition_dir

    for partition, items in ((0, {b"alice": b"12", b"bob": b'{"n": 2}'}), (1, {b"carol": b"\xff"})):
        store = PartitionStore(partition_dir(tmp_path, "orders", partition)).open()
        for k, v in items.items():
            store.put(k, v)
        store.close()
    PartitionStore(partition_dir(tmp_path, "other", 0)).open().close()
    assert main(["state", "dump", "--state-dir", str(tmp_path), "--topic", "orders"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines == [{"partition": 0, "key": "alice", "value": 12},
                     {"partition": 0, "key": "bob", "value": {"n": 2}},
                     {"partition": 1, "key": "carol", "value": {"base64": "/w=="}}]
    assert main(["state", "get", "bob", "--state-dir", str(tmp_path), "--value-format", "str"]) == 0
    assert json.loads(capsys.readouterr().out) == {"partition": 0, "key": "bob", "value": '{"n": 2}'}
    assert main(["state", "get", "dave", "--state-dir", str(tmp_path)]) == 1
    assert capsys.readouterr().err.strip() == "multilane state: key 'dave' not found"
    assert main(["state", "dump"]) == 2
    assert "give one of --state-dir DIR or --changelog TOPIC" in capsys.readouterr().err
    assert main(["state", "dump", "--state-dir", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
