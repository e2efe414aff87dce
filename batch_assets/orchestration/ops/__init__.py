"""Ops of the jobs: thin wrappers that validate config, call an engine and record its summary."""
