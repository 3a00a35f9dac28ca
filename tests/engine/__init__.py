"""The engine and the store in-process, on both stores, at N = 1 and N >= 8: through the API
(notifier.api) with a scripted or loopback receiver, or through the CLI in-process
(CliRunner) where what is pinned is the engine's doing, not the command's wording."""
