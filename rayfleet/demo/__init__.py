"""The demo: agents it spawns and the script ``rayfleet demo`` runs (``python -m rayfleet.jobs.demo`` as a Ray job)."""
