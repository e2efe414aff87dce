-- Checkpoint generations (issue 15): the plan of a sweep run registers every cursor range of the run
-- under one generation id, so a range that finished stays finished (DONE within its generation) until
-- every range of the generation has finished; only then does the next run of that mode start over.
-- Nullable: checkpoints saved by a run without a plan (the engine used on its own) have none.
ALTER TABLE ba_checkpoints ADD COLUMN IF NOT EXISTS generation text NULL;
