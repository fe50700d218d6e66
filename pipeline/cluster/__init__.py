"""The Dask cluster: connecting to a scheduler or starting the embedded one
(:mod:`.connect`), TLS material (:mod:`.tls`), users' code shipped to workers
(:mod:`.shipped_code`), the workers' preload (:mod:`.worker`) and the Dask processes'
environment every deployment reads (:mod:`.environment`, ``worker.env``)."""
