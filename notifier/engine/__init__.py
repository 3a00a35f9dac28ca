"""The send engine: the runner, its committer and senders, pacing, brakes, membership
(one process alone or workers sharing a run) and the one settle-by-query path."""
