"""notifier: send a batch of notifications durably.

Every row becomes a frozen intent stored in SQLite before anything leaves; every send is
bracketed by an intent/attempt record before and a receipt after; `resume` settles whatever
was in flight by asking the downstream, by key, before anything else moves.
"""

__version__ = "0.1.0"
