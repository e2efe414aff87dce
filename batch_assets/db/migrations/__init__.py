"""The numbered SQL migrations `db migrate` applies (`NNNN_name.sql`, see batch_assets/db/migrate.py).

Numbers only grow and are never reused. A number may be absent; every absent one is listed in
`migrate.NEVER_SHIPPED` with why, and a test holds the numbering to that list:

* 0003 was never shipped. The files were numbered by hand and the operations migration was written
  as 0004; there never was a 0003 file, so no database has version 3 in `ba_schema_versions`.
  It is not filled in afterwards: a new 0003 would run after 0004-0006 on every existing database
  and before them on a new one, so databases would reach the same version by different orders.
"""
