"""The I/O shell of toolbus: server, sessions, pipeline, approvals, jobs, store, CLI."""
