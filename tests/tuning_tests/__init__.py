"""Tests of memtp_sim.tuning, one module per private module of the package."""
