"""Every outbound frame fits the announced ``max_message_bytes`` (SPEC E2, C3, J3): a
catalog too large for it is refused at start and at hot reload; ``job``/``jobs``
replies leave out results that would not fit (gateway/catalog_fit.py, job_fit.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import orjson
import pytest
import yaml

import tests.gateway.tools_for_tests as tt
from catalog.loader import load_catalog
from gateway.catalog_fit import CatalogTooLarge, frame_bytes, oversized
from gateway.cli import main
from gateway.config import DEMO_DIR
from gateway.job_fit import fit_job
from gateway.server import Gateway
from protocol import messages as m
from protocol.codec import encode, encode_json
from tests.support import peer, running, settings_for

DEMO = load_catalog([DEMO_DIR / "tools.yaml"], [DEMO_DIR / "profiles.yaml"])
WIDEST = max(frame_bytes(DEMO, profile) for profile in DEMO.profiles.values())
"""The demo catalog's largest catalog frame over its profiles, in bytes."""


def refusal(max_frame: int) -> list[str]:
    return [
        f"profile {name!r}: its catalog frame takes {frame_bytes(DEMO, p)} bytes, more than "
        f"server.max_message_bytes ({max_frame}); raise server.max_message_bytes or grant "
        f"the profile fewer tools"
        for name, p in sorted(DEMO.profiles.items())
        if frame_bytes(DEMO, p) > max_frame
    ]


def test_demo_catalog_over_4096_bytes_is_refused_at_start(tmp_path: Path) -> None:
    """SPEC E2, O5: the demo catalog with ``max_message_bytes: 4096`` (its catalog frame
    was sent at 4,668 bytes) stops the server at start, one line per profile naming
    the profile and both sizes."""
    lines = refusal(4096)
    assert [line.split(":")[0] for line in lines] == ["profile 'demo'", "profile 'voice'"]
    settings = settings_for(tmp_path, server={"port": 0, "max_message_bytes": 4096})
    with pytest.raises(CatalogTooLarge) as raised:
        Gateway(settings)
    assert str(raised.value) == "\n".join(lines)


def test_toolbus_check_names_the_profile_and_the_sizes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SPEC E2, O5: ``toolbus check`` fails on a catalog frame that cannot fit."""
    config = tmp_path / "toolbus.yaml"
    config.write_text(
        yaml.safe_dump({"data_dir": str(tmp_path / "d"), "server": {"max_message_bytes": 4096}})
    )
    assert main(["check", "--config", str(config)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if "catalog frame" in line] == [
        f"error: {line}" for line in refusal(4096)
    ]


async def test_catalog_at_the_exact_bound_starts_and_every_catalog_frame_fits(
    tmp_path: Path,
) -> None:
    """SPEC E2, C3: at exactly the widest frame's size the server starts (one byte less
    is refused) and real catalog frames, even one answering the widest request id, fit
    the size ``welcome`` announces."""
    assert oversized(DEMO, WIDEST) == []
    assert len(oversized(DEMO, WIDEST - 1)) >= 1
    settings = settings_for(
        tmp_path, server={"port": 0, "heartbeat_interval": 0, "max_message_bytes": WIDEST}
    )
    async with running(settings) as gw, peer(gw, context={"project_id": "p1"}) as p:
        initial = await p.expect("catalog", reason="initial")
        widest_id = "\x00" * 128
        await p.send({"type": "catalog.get", "id": widest_id})
        catalog = await p.expect("catalog", id=widest_id)
        limit = p.welcome["limits"]["max_message_bytes"]
        assert limit == WIDEST
        assert len(encode_json(initial)) <= limit
        assert len(encode_json(catalog)) <= limit


async def test_hot_reload_of_a_catalog_too_large_keeps_the_previous_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SPEC E2, C3: a reload whose catalog frame would exceed the announced size is
    refused with an error logged; sessions keep the previous catalog."""
    tools = tmp_path / "tools.yaml"
    tools.write_text((DEMO_DIR / "tools.yaml").read_text())
    catalog = {"tools": [tools], "profiles": [DEMO_DIR / "profiles.yaml"], "hot_reload": False}
    settings = settings_for(
        tmp_path,
        catalog=catalog,
        server={"port": 0, "heartbeat_interval": 0, "max_message_bytes": WIDEST},
    )
    async with running(settings) as gw, peer(gw) as p:
        before = await p.expect("catalog", reason="initial")
        grown = yaml.safe_load(tools.read_text())
        grown["tools"][0]["description"] += " More words." * 40
        tools.write_text(yaml.safe_dump(grown))
        with caplog.at_level(logging.ERROR, logger="gateway.catalog"):
            assert gw.catalog.reload() is False
        refused = [r.getMessage() for r in caplog.records if r.name == "gateway.catalog"]
        assert len(refused) == 1
        assert refused[0].startswith(
            "catalog reload refused; keeping the previous catalog: profile 'demo': its "
            "catalog frame takes "
        )
        await p.send({"type": "catalog.get", "id": "c", "version": before["version"]})
        await p.expect("catalog.not_modified", id="c")


ARTIFACT = {"blob": "a" * 6000}
"""One artifact of about 6 KB: two jobs carrying it share a 16 KB frame, three cannot."""


async def test_jobs_reply_leaves_out_results_that_would_not_fit(tmp_path: Path) -> None:
    """SPEC E2, J3: a ``jobs`` reply stays within the announced size: the newest jobs
    whole, the one that would not fit listed without ``result`` and ``artifacts``;
    ``job.get`` of each fits too."""
    limit = 16384
    async with tt.serve(tmp_path, server={"max_message_bytes": limit}) as gw, peer(gw) as p:
        ids = []
        for n in range(3):
            key = f"k{n}"
            await p.invoke(f"c{n}", "hold_job", {"key": key, "artifacts": [ARTIFACT]})
            ids.append((await p.expect("dispatched", call_id=f"c{n}"))["job_id"])
            tt.STATE.job_event(tt.STATE.job_release, key).set()
            await p.expect("job.done", job_id=ids[-1])
        await p.send({"type": "job.list", "id": "l"})
        raw = await p.ws.recv()
        jobs = orjson.loads(raw)["jobs"]
        assert len(raw.encode()) <= limit
        assert [j["job_id"] for j in jobs] == ids[::-1]
        assert [("result" in j, len(j["artifacts"])) for j in jobs] == [
            (True, 1),
            (True, 1),
            (False, 0),
        ]
        for job_id in ids:
            await p.send({"type": "job.get", "id": job_id, "job_id": job_id})
            raw = await p.ws.recv()
            assert len(raw.encode()) <= limit
            assert orjson.loads(raw)["job"]["result"]["key"].startswith("k")


def test_job_reply_too_large_is_sent_without_result() -> None:
    """SPEC E2, J3: a ``job`` reply that would exceed the bound drops result and
    artifacts (they were delivered whole by ``job.done``); one that fits is whole."""
    info = m.JobInfo(
        job_id="j",
        tool="t",
        state=m.JobState.DONE,
        created_at=1.0,
        artifacts=[ARTIFACT],
        result={"r": "x" * 5000},
        summary="s",
    )
    whole = fit_job("i", info, 20_000)
    assert whole.job == info
    bare = fit_job("i", info, 4096)
    assert (bare.job.result, bare.job.artifacts, bare.job.summary) == (None, [], "s")
    assert len(encode(bare)) <= 4096
