"""The Dask cluster: connecting to a scheduler or starting the embedded one
(:mod:`.connect`), TLS material (:mod:`.tls`), users' code shipped to workers
(:mod:`.shipped_code`) and the workers' preload (:mod:`.worker`)."""
