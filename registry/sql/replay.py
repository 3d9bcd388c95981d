"""What `registry.sql.resilient` keeps of a transaction to run it again: each statement with
its answer (`Step`, read whole by `ask`), and the serial ids the second run drew anew
(`Ids`), mapped back to the ones the caller was answered first."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final


@dataclass(slots=True)
class Answer:
    description: Any
    rowcount: int
    rows: list[Any] | None
    statusmessage: str | None


@dataclass(slots=True)
class Step:
    method: str
    sql: Any
    params: Any
    kwargs: dict[str, Any]
    answer: Answer


def ask(cursor: Any, method: str, sql: Any, params: Any, kwargs: dict[str, Any]) -> Answer:
    getattr(cursor, method)(sql, params, **kwargs)
    rows = cursor.fetchall() if cursor.description is not None else None
    return Answer(cursor.description, cursor.rowcount, rows,
                   getattr(cursor, "statusmessage", None))


_ID_PARAM: Final = re.compile(r"(^|_)id(_+\d+)?$")
_ID_COLUMN: Final = re.compile(r"(^|_)id$")


class Ids:
    """Serial ids a transaction run again drew anew: the caller keeps the ones it was
    answered first (an INSERT ... RETURNING id), so the ids of the new run are given back
    as those in answers and put in place of those in parameters named for an id, for the
    rest of the transaction. Ids from a sequence are never drawn twice, so an old id can
    name nothing else in the database."""

    def __init__(self) -> None:
        self.new: dict[int, int] = {}
        self.old: dict[int, int] = {}

    def forth(self, params: Any) -> Any:
        if not self.new:
            return params
        if isinstance(params, dict):
            return {name: self.new.get(value, value)
                    if _ID_PARAM.search(str(name)) and type(value) is int else value
                    for name, value in params.items()}
        if isinstance(params, list):
            return [self.forth(each) for each in params]
        return params

    def back(self, answer: Answer) -> Answer:
        if not self.old or answer.rows is None or answer.description is None:
            return answer
        columns = [_ID_COLUMN.search(column.name) is not None for column in answer.description]
        rows = [type(row)(self.old.get(value, value) if is_id and type(value) is int else value
                          for value, is_id in zip(row, columns, strict=True))
                for row in answer.rows]
        return Answer(answer.description, answer.rowcount, rows, answer.statusmessage)

    def learn(self, step: Step, again: Answer) -> bool:
        """Whether *again* answers as *step* did, once the ids an INSERT drew anew are
        mapped (and learnt, when *step* is such an INSERT)."""
        if self.back(again).rows == step.answer.rows and again.rowcount == step.answer.rowcount:
            return True
        first, then = step.answer.rows, again.rows
        if (not str(step.sql).lstrip().upper().startswith("INSERT") or first is None
                or then is None or len(first) != len(then) or again.description is None):
            return False
        columns = [_ID_COLUMN.search(column.name) is not None for column in again.description]
        for old_row, new_row in zip(first, then, strict=True):
            for old, new, is_id in zip(old_row, new_row, columns, strict=True):
                if old == new:
                    continue
                if not (is_id and type(old) is int and type(new) is int) or \
                        self.new.get(old, new) != new or self.old.get(new, old) != old:
                    return False
                self.new[old], self.old[new] = new, old
        return True
