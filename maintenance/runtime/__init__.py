"""The runtime every job shares: database access, logs, the runner, the scheduler, HTTP, telemetry, signals."""
