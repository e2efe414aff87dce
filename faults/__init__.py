"""The fault campaign (docs/faults.md): `python -m faults` (`make faults`, `make faults-quick`).

It owns its services (a PostgreSQL server it can restart, a Redis, a limits-service
stub), drives the product only through its command line as an operator would,
injects seeded faults at random points (and writes the product's tables beside its
jobs, as other services do: faults/writers.py), runs recovery, and checks invariants
with code of its own (checker.py never imports the engine or the runner).
"""
