"""Pure rules and records: what a run, an item, an attempt and an answer are, the one
decision per answer, the retry policy and the state machines. No I/O, no store, no channel."""
