"""Stored rows and their column values (SPEC D3, J1, I15, D6).

:class:`SessionRow`, :class:`JobRow` and :class:`LedgerRow` are what every
:class:`~gateway.store.Store` backend stages and reads. The functions below turn a row
into the values bound to its table's columns (JSON columns encoded by
:mod:`protocol.codec`) and a fetched tuple back into a row; both the SQLite and the
PostgreSQL store use them. Encoding happens when a row is *staged*: a value that cannot
be stored raises :class:`BadValue` to that one caller (SPEC D6).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gateway.records import record
from gateway.store_check import StoreError
from protocol.codec import decode_json, encode_json


class BadValue(StoreError, ValueError):
    """A value given to a stage method cannot be stored (not encodable as JSON, text
    that is not valid Unicode). Raised to its caller; nothing of it is staged (SPEC D6)."""


@dataclass(frozen=True, slots=True)
class SessionRow:
    """A session as stored (SPEC D3). Times are Unix seconds."""

    session_id: str
    token_hash: str
    user: str
    tenant: str | None
    profile: str
    context: dict[str, str]
    options: dict[str, Any]
    grants: list[str]
    last_seq: int
    acked_seq: int
    floor_seq: int
    """Events with seq <= floor_seq are gone (acked or over the cap); resume below it fails."""
    created_at: float
    expires_at: float | None
    """When a parked session stops being resumable; ``None`` while a socket holds it."""
    catalog_version: str | None
    credential_ref: str | None = None
    """The reference of the credential it last authenticated with, never the credential
    (SPEC S6, A7): :func:`gateway.credref.encode_ref` JSON; ``None`` for a row written
    before schema version 2, which re-validates as revoked (fail closed)."""


@record
class JobRow:
    """A job as stored (SPEC J1). ``result``/``error`` are JSON objects or ``None``."""

    job_id: str
    tool: str
    state: str
    session_id: str
    user: str
    tenant: str | None
    profile: str
    call_id: str | None
    params: dict[str, Any]
    context: dict[str, str]
    created_at: float
    started_at: float | None
    finished_at: float | None
    summary: str | None
    artifacts: list[dict[str, Any]]
    result: dict[str, Any] | None
    error: dict[str, Any] | None

    def at_state(self, state: str, started_at: float | None) -> JobRow:
        """This row moved to ``state`` (queued again: ``started_at`` ``None``; running: the
        start time), every other field kept (SPEC J3, J6). Built field by field:
        :func:`dataclasses.replace` took 6 us for it, this 0.5 us (issue 13, P5)."""
        kept = (self.finished_at, self.summary, self.artifacts, self.result, self.error)
        return self._moved(state, started_at, *kept)

    def ended(
        self,
        state: str,
        finished_at: float,
        summary: str,
        artifacts: list[dict[str, Any]],
        result: dict[str, Any] | None,
        error: dict[str, Any] | None,
    ) -> JobRow:
        """This row ended as ``state`` (``done``, ``failed``, ``cancelled``; SPEC J3, J4)
        with the given end fields; the rest kept, as :meth:`at_state`."""
        return self._moved(state, self.started_at, finished_at, summary, artifacts, result, error)

    def _moved(
        self,
        state: str,
        started_at: float | None,
        finished_at: float | None,
        summary: str | None,
        artifacts: list[dict[str, Any]],
        result: dict[str, Any] | None,
        error: dict[str, Any] | None,
    ) -> JobRow:
        """This row with its state and its start and end fields given, the rest kept."""
        return JobRow(
            self.job_id,
            self.tool,
            state,
            self.session_id,
            self.user,
            self.tenant,
            self.profile,
            self.call_id,
            self.params,
            self.context,
            self.created_at,
            started_at,
            finished_at,
            summary,
            artifacts,
            result,
            error,
        )


@record
class LedgerRow:
    """One ``call_id`` of a principal in the call ledger (SPEC I15).

    ``tenant`` is ``""`` for a principal without a tenant. ``state`` is ``running`` or
    ``done``; ``outcome`` holds the terminal event's bytes once ``done`` (its ``seq`` is
    the first session's: another session gets the event under a ``seq`` of its own).
    A ``running`` row has none, except while its call's plain handler waits for a
    worker thread: then it holds the terminal event a restart records for it, saying it
    did not run (SPEC J6, :meth:`gateway.ledger.CallLedger.waiting`).
    ``params_hash`` is the SHA-256 hex of the parameters' canonical JSON.
    ``created_at`` is Unix seconds; the row is purged a window after it.
    """

    tenant: str
    user: str
    call_id: str
    tool: str
    params_hash: str
    state: str
    outcome: bytes | None
    created_at: float


def _json(value: Any) -> bytes:
    try:
        return encode_json(value)
    except TypeError as exc:  # orjson.JSONEncodeError: not JSON, int over 64 bits
        raise BadValue(f"value cannot be stored as JSON: {exc}") from exc


def _opt_json(value: Any) -> bytes | None:
    return None if value is None else _json(value)


def _load(raw: bytes | None) -> Any:
    return None if raw is None else decode_json(raw)


def checked(values: tuple[Any, ...], what: str) -> tuple[Any, ...]:
    """``values`` if SQLite can bind every one of them; else :class:`BadValue` (SPEC D6)."""
    for value in values:
        if isinstance(value, str):
            try:
                value.encode()
            except UnicodeEncodeError as exc:
                raise BadValue(f"{what}: text is not valid Unicode ({exc.reason})") from exc
    return values


def session_values(row: SessionRow) -> tuple[Any, ...]:
    """A session row as the ``sessions`` columns' values (JSON columns encoded)."""
    return (
        row.session_id,
        row.token_hash,
        row.user,
        row.tenant,
        row.profile,
        _json(row.context),
        _json(row.options),
        _json(row.grants),
        row.last_seq,
        row.acked_seq,
        row.floor_seq,
        row.created_at,
        row.expires_at,
        row.catalog_version,
        row.credential_ref,
    )


def session_row(row: Iterable[Any]) -> SessionRow:
    """A fetched ``sessions`` row plus its log's ``MAX(seq)`` as a :class:`SessionRow`."""
    (sid, token_hash, user, tenant, profile, context, options, grants, *rest) = row
    last_seq, acked_seq, floor_seq, created_at, expires_at, *rest = rest
    catalog_version, credential_ref, logged = rest
    return SessionRow(
        sid,
        token_hash,
        user,
        tenant,
        profile,
        _load(context),
        _load(options),
        _load(grants),
        max(last_seq, logged or 0),
        acked_seq,
        floor_seq,
        created_at,
        expires_at,
        catalog_version,
        credential_ref,
    )


def ledger_values(row: LedgerRow) -> tuple[Any, ...]:
    """A ledger row as the ``call_ledger`` columns' values."""
    return (
        row.tenant,
        row.user,
        row.call_id,
        row.tool,
        row.params_hash,
        row.state,
        row.outcome,
        row.created_at,
    )


def job_values(row: JobRow) -> tuple[Any, ...]:
    """A job row as the ``jobs`` columns' values (JSON columns encoded)."""
    return (
        row.job_id,
        row.tool,
        row.state,
        row.session_id,
        row.user,
        row.tenant,
        row.profile,
        row.call_id,
        _json(row.params),
        _json(row.context),
        row.created_at,
        row.started_at,
        row.finished_at,
        row.summary,
        _json(row.artifacts),
        _opt_json(row.result),
        _opt_json(row.error),
    )


def job_row(row: Iterable[Any]) -> JobRow:
    """A fetched ``jobs`` row as a :class:`JobRow` (JSON columns decoded)."""
    (job_id, tool, state, sid, user, tenant, profile, call_id, params, context, *rest) = row
    created_at, started_at, finished_at, summary, artifacts, result, error = rest
    return JobRow(
        job_id,
        tool,
        state,
        sid,
        user,
        tenant,
        profile,
        call_id,
        _load(params),
        _load(context),
        created_at,
        started_at,
        finished_at,
        summary,
        _load(artifacts),
        _load(result),
        _load(error),
    )


def anything_staged(batch: Any) -> bool:
    """Whether a staging dataclass (:class:`~gateway.store_batch.SqliteBatch`,
    :class:`~gateway.store_pg_batch.PgBatch`) holds anything to commit: a non-empty
    collection, or a bound (``purge_before``, ``ledger_before``) that is set (not ``None``).
    Derived from the fields, so a field added later is never forgotten (SPEC D1, D6)."""
    for item in dataclasses.fields(batch):
        value = getattr(batch, item.name)
        if value is not None and (not isinstance(value, list | dict) or value):
            return True
    return False
