"""SqlTx: the store's transaction, put together from one base class per aggregate.

Each aggregate's statements live in their own module over
:class:`~capgate.gateway.state.sql.core.TxCore`, so each file has one job; this class
only puts them together into what the :class:`~capgate.gateway.state.store.Tx`
protocol describes (mypy holds it to the protocol wherever a SqlStore serves as a
Store). Each base knows the core and no other aggregate (mypy would refuse the
call), and no two define the same name, so their order here changes nothing.
"""

from __future__ import annotations

from capgate.gateway.state.sql.connections import ConnectionsTx
from capgate.gateway.state.sql.dispatches import DispatchesTx
from capgate.gateway.state.sql.evidence import EvidenceTx
from capgate.gateway.state.sql.ledger import LedgerTx
from capgate.gateway.state.sql.links import LinksTx
from capgate.gateway.state.sql.notices import NoticesTx
from capgate.gateway.state.sql.operations import OperationsTx
from capgate.gateway.state.sql.pins import PinsTx
from capgate.gateway.state.sql.proposals import ProposalsTx
from capgate.gateway.state.sql.tenants import TenantsTx
from capgate.gateway.state.sql.versions import VersionsTx

__all__ = ["SqlTx"]


class SqlTx(
    TenantsTx,
    ConnectionsTx,
    EvidenceTx,
    LinksTx,
    OperationsTx,
    ProposalsTx,
    DispatchesTx,
    PinsTx,
    VersionsTx,
    NoticesTx,
    LedgerTx,
):
    """One open transaction on one session (see :class:`~capgate.gateway.state.store.Tx`).

    Belongs to the thread that began it and ends with its ``with`` block; using it
    from another thread or afterwards is a StoreError, never a silent write outside
    the transaction.
    """
