"""Self-contained HTML reports (calc, scan, sweep). Plotly lives in the optional `[report]` extra."""
