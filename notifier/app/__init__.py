"""What each command does, between parsing (notifier/commands/) and the layers below. No
SQL, no rendering: these modules open the store, pick the run (env.py's steps, shared with
the read-only commands), take the lease and run the work. One module per concern:

- planning.py: validate, plan and store a batch (`send` up to its first request);
- working.py: work a stored run (channels, lease, drafting, the runner);
- approving.py: approve or reject a run, and who decided;
- settling.py: cancel, reconcile, and decisions by hand.

Callers use `app.NAME`: every name they need is re-exported here, so where a function lives
is this package's business (and a test can still replace `app.plan_batch`)."""

from ..drafting import compose_key
from ..who import operator_name
from .approving import approve, reject
from .planning import (
    DryRun,
    Stored,
    check_channels,
    check_send_options,
    compare_composed,
    dry_run,
    plan_batch,
    prior_summary,
    read_rows,
    refusal_message,
    run_stored,
    store_drafting_run,
    store_plan,
    stored_options,
)
from .settling import (
    MARKS,
    CancelResult,
    cancel,
    complete_if_done,
    decide_by_hand,
    reconcile_by_query,
)
from .working import draft_run, run_channels, take_lease, work_run

__all__ = [
    "MARKS",
    "CancelResult",
    "DryRun",
    "Stored",
    "approve",
    "cancel",
    "check_channels",
    "check_send_options",
    "compare_composed",
    "complete_if_done",
    "compose_key",
    "decide_by_hand",
    "draft_run",
    "dry_run",
    "operator_name",
    "plan_batch",
    "prior_summary",
    "read_rows",
    "reconcile_by_query",
    "refusal_message",
    "reject",
    "run_channels",
    "run_stored",
    "store_drafting_run",
    "store_plan",
    "stored_options",
    "take_lease",
    "work_run",
]
