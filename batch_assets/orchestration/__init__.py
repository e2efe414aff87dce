"""The Dagster layer: config, resources, ops, jobs, schedules, sensors, assets, checks and the CLI launch path.

Everything here is a thin wiring of the engine (which knows nothing of Dagster).
"""

import warnings

# Two of Dagster 1.13's API-stability notices that this code cannot act on, filtered here once for every process
# that loads the code location (webserver, daemon, code servers, each run worker), by their exact text:
# - Binding the instance's resources to an op job that a sensor targets (payment_queue_drain_sensor's drain job),
#   Dagster rebuilds the sensor through SensorDefinition.with_attributes, which passes the sensor's owners (an
#   empty list: we give none) back to the beta `owners` parameter, so every load warned about a parameter no one
#   set (`make ui` printed it once per process, 277 times in a session).
# - multi_observable_source_asset (payment_status) is beta and Dagster 1.13 has no stable way to declare an
#   observable asset; the product uses it knowingly (metadata.observable_table does the same for the tables).
# Any other beta, preview or supersession notice still shows (tests/ui/test_ui_cli.py asserts none at start-up).
for _notice in (r"Parameter `owners` of initializer `SensorDefinition\.__init__` is currently in beta",
                r"Function `multi_observable_source_asset` is currently in beta"):
    warnings.filterwarnings("ignore", message=_notice)

# Nothing here imports dagster: the CLI imports this package (instance_home) for commands that never load it
# (`--help`, a refused argument, `db`, `seed`). The mend of Dagster's busy wait for a pool slot is applied where the
# executors are defined (orchestration/executors.py), which every process that runs a job imports.
