"""Effects once, proven across processes: a refund turn fails at every point of its life, the client retries, and
a payments service outside the framework counts the refunds applied (see ``tests/support/effect_timings.py``).

With the payments service honouring the refund tool's key, every timing applies exactly one refund. Ignoring the
key, only the two windows between the payments call and the journal write apply two. A keyless client's re-send
after its turn committed (an answer lost after the write, a 409) is a new turn, whose model here asks again.
"""

from __future__ import annotations

from tests.support.dynamodb_local import DynamoTable
from tests.support.effect_timings import (
    expected,
    expected_decision,
    run_decision_timings,
    run_timings,
    table_markdown,
)


def test_every_failure_timing_applies_the_refund_as_promised(dynamodb_local: str,
                                                            dynamodb_local_table: DynamoTable) -> None:
    rows = run_timings(dynamodb_local, dynamodb_local_table.name)
    print("\n" + table_markdown(rows))
    assert [row.keyed_honoured for row in rows] == [1] * len(rows)
    assert rows == [expected(row) for row in rows]


def test_every_failure_timing_of_an_approval_applies_the_refund_once(dynamodb_local: str,
                                                                    dynamodb_local_table: DynamoTable) -> None:
    """The same timings where the failing request is the user's approval of a waiting refund."""
    rows = run_decision_timings(dynamodb_local, dynamodb_local_table.name)
    print("\n" + table_markdown(rows))
    assert [row.keyed_honoured for row in rows] == [1] * len(rows)
    assert rows == [expected_decision(row) for row in rows]
