"""Sliding windows over Snapshots (rates, quantiles, gauge statistics), the `observed` signals
built from a snapshot and its window, and windows to and from the state file."""
from exporter.window.persist import window_from_dict, window_to_dict
from exporter.window.signals import OBSERVED_KEYS, observed_signals
from exporter.window.window import Observed, Quantiles, Window, is_reset

__all__ = ["Window", "Observed", "Quantiles", "is_reset", "observed_signals", "OBSERVED_KEYS",
           "window_from_dict", "window_to_dict"]
