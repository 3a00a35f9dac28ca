"""Real processes killed (-9), signalled (Ctrl-C, SIGTERM), frozen, or contending with each
other: the promises only a real process can break."""
