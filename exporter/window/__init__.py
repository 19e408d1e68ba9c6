"""Sliding windows over Snapshots (rates, quantiles, gauge statistics) and the `observed`
signals built from a snapshot and its window."""
from exporter.window.signals import OBSERVED_KEYS, observed_signals
from exporter.window.window import Observed, Quantiles, Window, is_reset

__all__ = ["Window", "Observed", "Quantiles", "is_reset", "observed_signals", "OBSERVED_KEYS"]
