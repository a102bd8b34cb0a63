r"""The store, written once in SQL for both backends.

:class:`SqlStore` implements :class:`~capgate.gateway.state.store.Store` and
:class:`SqlTx` implements :class:`~capgate.gateway.state.store.Tx` over any
:class:`~capgate.gateway.state.backend.Backend`; SQLite and PostgreSQL differ only in their
dialect and sessions. How each concurrency guarantee holds:

- **Writers.** A writing transaction begins with what serialises writers on its
  backend: ``BEGIN IMMEDIATE`` on SQLite (one writer at a time, across processes),
  ``READ COMMITTED`` plus the row locks below on PostgreSQL.
- **Operations** are inserted with ``INSERT ... ON CONFLICT DO NOTHING`` on the
  ``(tenant, operation_id)`` primary key: the database lets exactly one insert
  through, however many race, and the others see that no row was added.
- **Budgets** are read with ``SELECT ... FOR UPDATE`` on the tenant's row (always
  before the task's row, so two transactions never wait for each other in
  opposite orders), checked, then updated; the row lock makes the check and the
  update one step.
- **Reviews** are consumed with a conditional ``UPDATE ... WHERE consumed_at IS
  NULL``: the first writer changes the row, every later one changes nothing.
- **Dispatch jobs** are claimed and settled with conditional ``UPDATE`` statements on
  their claim (PostgreSQL reads the candidates ``FOR UPDATE SKIP LOCKED``): each job goes
  to one worker at a time.
- **Ledger** appends take a transaction-scoped lock (an advisory lock on
  PostgreSQL; SQLite's writer lock) before reading the last row, so sequence
  numbers have no gaps and each ``prev_hash`` is the previous ``hash``.

Expected refusals (an id that exists, a budget that does not fit, an unknown
tenant) are found with conditional statements, never by letting a constraint fail:
on PostgreSQL a failed statement aborts the whole transaction. A transaction in
which a statement did fail is rolled back even if the caller caught the error, on
both backends, so no half of a step is ever committed.

Modules: ``core`` (what every statement goes through: the transaction base and the
value and row helpers); one per aggregate, each a base class of :class:`SqlTx`:
``tenants`` (with their budgets), ``connections``, ``evidence``, ``operations``,
``proposals`` (with their reviews), ``dispatches`` (the execution workers' queue),
``pins``, ``notices`` (webhook notices' cursors and deliveries), ``ledger``;
``listen`` (notices at commit and who waits for them); ``tx`` (:class:`SqlTx`, which
puts them together); ``store`` (:class:`SqlStore`: where a transaction begins and how
it ends).
"""

from capgate.gateway.state.sql.pins import MAX_DEFINITION_BYTES
from capgate.gateway.state.sql.store import SqlStore
from capgate.gateway.state.sql.tx import SqlTx

__all__ = ["MAX_DEFINITION_BYTES", "SqlStore", "SqlTx"]
