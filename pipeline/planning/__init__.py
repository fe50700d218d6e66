"""How a job's units become tasks: the recorded plan (:mod:`.plan`), the probe tasks
that measure the cost model (:mod:`.probes`), and task sizes from that model
(:mod:`.sizing`)."""
