"""The handover's one codec on the wire (``multilane.formats.handover``), both ways: what the operator's
client encodes the worker's control endpoint decodes to the same values, and a bad item is refused in
one line naming it."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from multilane.formats.handover import Handover, HandoverError, decode_handovers, encode_handovers
from multilane.operator.rollout.workers import ReleasedPartition

RECORD = base64.b64encode(b"MLP\x01 record").decode()


def test_encode_then_decode_gives_the_same_handovers() -> None:
    handovers = {
        ("in", 3): Handover(RECORD, 740),
        ("in", 0): Handover(RECORD),
        ("other", 12): Handover("", 0),
    }
    wire = encode_handovers(handovers)
    assert [(i["topic"], i["partition"]) for i in wire] == [("in", 0), ("in", 3), ("other", 12)]  # sorted
    assert "changelog_end" not in wire[0] and wire[1]["changelog_end"] == 740
    assert decode_handovers(wire) == handovers
    assert decode_handovers(wire)[("in", 3)].record() == b"MLP\x01 record"


def test_decode_then_encode_gives_the_same_wire() -> None:
    wire = [
        {"topic": "in", "partition": 1, "progress": RECORD, "changelog_end": 5},
        {"topic": "in", "partition": 2, "progress": RECORD},
    ]
    assert encode_handovers(decode_handovers(wire)) == wire


def test_a_release_answer_becomes_the_handover_of_its_partition() -> None:
    assert ReleasedPartition("in/3", 100, RECORD, 740).handover == Handover(RECORD, 740)
    assert ReleasedPartition("in/3", 100, None, 740).handover is None  # an end without its record: none


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"in/3": RECORD}, "'progress' must be a list"),
        (["x"], "must be an object"),
        ([{"topic": "", "partition": 3, "progress": RECORD}], "bad partition"),
        ([{"topic": "in", "partition": True, "progress": RECORD}], "bad partition"),
        ([{"topic": "in", "partition": 3}], "must be a base64 string"),
        ([{"topic": "in", "partition": 3, "progress": "not base64!"}], "in/3: progress is not base64"),
        (
            [{"topic": "in", "partition": 3, "progress": RECORD, "changelog_end": -1}],
            "'changelog_end' must be",
        ),
        (
            [{"topic": "in", "partition": 3, "progress": RECORD, "changelog_end": 1.5}],
            "'changelog_end' must be",
        ),
    ],
)
def test_a_bad_item_is_refused_in_one_line(raw: Any, message: str) -> None:
    with pytest.raises(HandoverError, match=message) as exc:
        decode_handovers(raw)
    assert "\n" not in str(exc.value)


def test_the_operators_client_sends_what_the_worker_reads() -> None:
    """Over HTTP: ``WorkerControlClient.assign(handovers=...)`` -> the body the worker's control endpoint
    decodes (``multilane.worker.control._handovers``) holds the same handovers."""
    import asyncio

    from aiohttp import web

    from multilane.operator.rollout.workers import WorkerControlClient
    from multilane.worker.control import _handovers

    received: list[dict[tuple[str, int], Handover]] = []

    async def assignment(request: web.Request) -> web.Response:
        received.append(_handovers(await request.json()))
        return web.json_response({"generation": 4, "released": []})

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/assignment", assignment)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        client = WorkerControlClient("t" * 40, timeout_s=5)
        try:
            sent = {"in/3": Handover(RECORD, 740), "in/4": Handover(RECORD)}
            await client.assign(f"http://127.0.0.1:{port}", 4, ["in/3", "in/4"], 1.0, sent)
            await client.assign(f"http://127.0.0.1:{port}", 5, ["in/3"], 1.0)
        finally:
            await client.close()
            await runner.cleanup()

    asyncio.run(main())
    assert received == [{("in", 3): Handover(RECORD, 740), ("in", 4): Handover(RECORD)}, {}]
