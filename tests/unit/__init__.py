"""One component on its own, in-process: the pure rules (decide, retries, state machines,
windows), the channels against a loopback server, the sandbox, and the rules the tree itself
keeps (layering, citations)."""
