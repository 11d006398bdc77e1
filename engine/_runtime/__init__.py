"""Drivers and transports: the per-run session, in-process and MPI clusters, the controller."""
