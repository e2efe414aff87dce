"""Database access: URL resolution, the embedded server, engines, schema and migrations."""
