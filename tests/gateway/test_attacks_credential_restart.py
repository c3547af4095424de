"""Attacks on SPEC S6, A7 and J6 across a restart: a job queued before the restart must
not start on a credential revoked or expired while the server was stopped. The session
row keeps a credential *reference* (gateway/credref.py), re-validated before the job's
handler starts; both stores (SPEC N1)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

import tests.gateway.fair_tools as ft
from gateway.auth import hash_token
from gateway.config import Settings
from gateway.server import Gateway
from tests.gateway.store_faults import until
from tests.gateway.test_job_truth import dispatch, job_get
from tests.pg_support import store_backend  # noqa: F401 (fixture)
from tests.support import JWT_SECRET, TOKENS, make_jwt, peer, running, settings_for

LATER = 7200.0
"""Seconds the second server's clock runs ahead of the first (past a JWT's ``exp``)."""


class Later(Gateway):
    """A gateway whose clock reads :data:`LATER` seconds ahead (the restart came later)."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings, clock=lambda: time.time() + LATER)


def job_settings(tmp_path: Path, **sections: Any) -> Settings:
    return settings_for(
        tmp_path,
        catalog=ft.write_catalog(tmp_path),
        jobs={"max_per_session": 1},
        server={"drain_grace": 0, "port": 0, "heartbeat_interval": 0},
        sessions={"resume_window": 3 * LATER},
        **sections,
    )


async def queue_behind_a_held_job(settings: Settings, **hello: Any) -> tuple[str, str]:
    """Serve, start a held job and queue a quick one behind it (``max_per_session: 1``),
    drain; returns ``(session_id, queued job id)``. The queued job never started."""
    ft.STATE = ft.State()
    try:
        async with running(settings) as gw, peer(gw, **hello) as p:
            await dispatch(p, "h1", "held_job", {})
            second = await dispatch(p, "q1", "quick_job", {})
            await ft.until(lambda: gw.workers.jobs.stats().busy == 1, gw.workers.jobs.changed)
            assert (await job_get(p, second, "g"))["state"] == "queued"
            session_id: str = p.welcome["session_id"]
    finally:
        ft.STATE.release.set()
    assert ft.STATE.quick == 0
    return session_id, second


async def settle(gw: Gateway) -> None:
    """Wait until no job of the recovered ones is active (each ran or failed). Polled:
    a job leaves ``active`` turns after its worker slot's last change (its start may
    wait for a group commit first, and its end runs after the thread returned)."""
    await until(lambda: not gw.jobs.active, "the recovered jobs to settle")


async def runs_after_restart(settings: Settings, job_id: str) -> None:
    """Serve again on ``settings`` until recovery settles: the queued job ``job_id``
    ran once and is ``done`` (SPEC J6)."""
    async with running(settings) as gw:
        await settle(gw)
        row = gw.store.job(job_id)
    assert row is not None
    assert row.state == "done"
    assert ft.STATE.quick == 1


def rewrite_bob(settings: Settings, entry: dict[str, Any] | None) -> None:
    """The token file with bob's entry replaced by ``entry`` (``None``: removed)."""
    kept = [{"sha256": hash_token(t), **v} for t, v in TOKENS.items() if v["user"] != "bob"]
    if entry is not None:
        kept.append({"sha256": hash_token("bob-token"), **entry})
    settings.auth.token_file.write_text(yaml.safe_dump({"tokens": kept}))  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "entry",
    [None, {"user": "bob", "profiles": ["readonly"]}, {"user": "mallory", "profiles": ["demo"]}],
    ids=["token-removed", "profile-no-longer-granted", "token-names-another-user"],
)
async def test_queued_job_of_a_revoked_token_fails_credential_revoked_after_restart(
    tmp_path: Path,
    store_backend: str,  # noqa: F811
    entry: dict[str, Any] | None,
) -> None:
    """SPEC S6, A7, J6: bob's job waits in the queue; the server drains; bob's token is
    revoked (removed, or no longer granting the profile or the user); after the restart
    the queued job never runs and ends ``failed`` ``credential_revoked``, as a live
    revocation would."""
    settings = job_settings(tmp_path)
    session_id, second = await queue_behind_a_held_job(settings, token="bob-token")
    rewrite_bob(settings, entry)
    async with running(settings) as gw:
        assert gw.sessions.get(session_id) is not None  # the session itself came back
        await settle(gw)
        row = gw.store.job(second)
    assert ft.STATE.quick == 0
    assert row is not None
    assert (row.state, row.started_at, row.error) == (
        "failed",
        None,
        {"code": "credential_revoked", "message": "the session's credential was revoked"},
    )


async def test_queued_job_of_a_still_valid_token_runs_after_restart(
    tmp_path: Path,
    store_backend: str,  # noqa: F811
) -> None:
    """SPEC J6, S6: the same restart with bob's token still in the file runs the queued
    job (the stored reference re-validates; nothing is refused by mistake)."""
    settings = job_settings(tmp_path)
    _, second = await queue_behind_a_held_job(settings, token="bob-token")
    await runs_after_restart(settings, second)


async def test_queued_job_of_an_expired_jwt_fails_credential_expired_after_restart(
    tmp_path: Path,
) -> None:
    """SPEC S6, A7, J6: the session ran on a JWT valid for an hour; the server comes back
    two hours later (its clock): the queued job ends ``failed`` ``credential_expired``."""
    settings = job_settings(tmp_path, auth={"jwt_secret": JWT_SECRET})
    token = make_jwt("carol", ["demo"], time.time() + LATER / 2)
    session_id, second = await queue_behind_a_held_job(settings, token=token)
    gw = Later(settings)
    await gw.start()
    try:
        assert gw.sessions.get(session_id) is not None
        await settle(gw)
        row = gw.store.job(second)
    finally:
        await gw.drain()
    assert ft.STATE.quick == 0
    assert row is not None
    assert (row.state, row.error) == (
        "failed",
        {"code": "credential_expired", "message": "the session's credential expired"},
    )


async def test_queued_job_of_an_unexpired_jwt_runs_after_restart(tmp_path: Path) -> None:
    """SPEC S6, J6: a JWT whose ``exp`` has not passed at the restart runs the job."""
    settings = job_settings(tmp_path, auth={"jwt_secret": JWT_SECRET})
    token = make_jwt("carol", ["demo"], time.time() + 3600)
    _, second = await queue_behind_a_held_job(settings, token=token)
    await runs_after_restart(settings, second)
