"""The ledger: the one authority for leases, fencing tokens, continuity records and durable queues.

``LedgerClient`` (in ``_contract.py``) is the typed contract every caller uses; ``Ledger``
implements it over a store, with the fencing rules written once. Plain Python, no Ray.
Internal: nothing here is part of the public API except through :mod:`rayfleet.testing`.
"""
