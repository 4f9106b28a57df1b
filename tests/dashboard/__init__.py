"""Tests of memtp_sim.dashboard: settings and runs without a browser, the app in headless Chromium."""
