"""The sweep engine: plain Python over SQLAlchemy, no Dagster."""
