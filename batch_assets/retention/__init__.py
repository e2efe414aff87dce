"""Retention (`retention run`; docs/reference/cli.md, docs/production/operations.md): prune what the product itself
keeps, in short batches."""
