"""Users' functions for the map tests: importable on the driver and (by the inherited
import path) on the embedded cluster's workers."""
