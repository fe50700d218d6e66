"""Parquet datasets as job inputs: discovering files and schemas (:mod:`.dataset`),
hive partitions (:mod:`.partitions`), planning chunks over them (:mod:`.chunks`) and
reading a task's rows on a worker (:mod:`.task_rows`)."""
