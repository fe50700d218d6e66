"""What runs cost: instance prices (:mod:`.prices`), a run's cost and a fleet's
projection (:mod:`.run_cost`), and ``pipeline estimate`` (:mod:`.estimate`)."""
