"""Entrypoints for ``ray job submit -- python -m rayfleet.jobs.<name>`` (see deployments/)."""
