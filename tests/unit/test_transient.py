"""Which registry errors are a blip worth retrying (`registry.sql.transient.is_transient`):
the one rule every registry call's retry follows."""

from __future__ import annotations

import sqlite3

import psycopg
import pytest
from psycopg import errors

from registry.sql.transient import is_transient

REFUSED = ('connection failed: connection to server at "127.0.0.1", port 1 failed: '
           "Connection refused")


@pytest.mark.parametrize(("error", "transient"), [
    (psycopg.OperationalError(REFUSED), True),
    (psycopg.OperationalError("consuming input failed: server closed the connection "
                              "unexpectedly"), True),
    (psycopg.OperationalError("the connection is lost"), True),
    (errors.AdminShutdown("terminating connection due to administrator command"), True),
    (errors.CannotConnectNow("the database system is starting up"), True),
    (ConnectionResetError(104, "Connection reset by peer"), True),
    (ConnectionRefusedError(111, "Connection refused"), True),
    # the server answered, and said no: retrying will not change it
    (psycopg.OperationalError('connection failed: ... FATAL:  password authentication '
                              'failed for user "x"'), False),
    (psycopg.OperationalError('connection failed: ... FATAL:  role "x" is not permitted to '
                              "log in"), False),
    (psycopg.OperationalError('connection failed: ... FATAL:  the database system is '
                              "shutting down"), True),
    (errors.UniqueViolation("duplicate key value"), False),
    (errors.SerializationFailure("could not serialize access"), False),
    (errors.QueryCanceled("canceling statement due to statement timeout"), False),
    (sqlite3.OperationalError("database is locked"), False),
    (ValueError("server closed the connection unexpectedly"), False),
])
def test_a_blip_is_retried_and_an_answer_is_not(error: BaseException, transient: bool) -> None:
    assert is_transient(error) is transient


def test_sqlalchemys_wrapper_is_judged_by_the_driver_error_under_it() -> None:
    from sqlalchemy.exc import OperationalError

    wrapped = OperationalError("SELECT 1", {}, psycopg.OperationalError(REFUSED))
    assert is_transient(wrapped)
    refused = OperationalError("SELECT 1", {}, errors.UniqueViolation("duplicate key"))
    assert not is_transient(refused)
    invalidated = OperationalError("SELECT 1", {}, errors.UniqueViolation("x"),
                                   connection_invalidated=True)
    assert is_transient(invalidated)
