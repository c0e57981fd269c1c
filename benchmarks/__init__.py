"""rayfleet benchmarks, each measured side by side with raw Ray doing the same work."""
