"""The library's migration set (`migrate.LIBRARY`): numbered SQL files (`NNNN_name.sql`, see
batch_assets/db/migrate.py) that make only the library's own objects, every table and function named `ba_*`.

Numbers only grow, start at 0001 and have no gap (a test holds every set to that); a file once released is
never changed, a change is a new file. Every statement is guarded (IF NOT EXISTS, a catalog check before an
ALTER), so a file is also correct on a database that already has some of its objects.

The previous release had one combined set (files 0001-0009, without 0003), recorded in `ba_schema_versions`;
this set starts again at 0001 and is recorded in `ba_migrations`. `ba_schema_versions` is left as it was.
"""
