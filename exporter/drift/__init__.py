"""Drift detection: compare what a vLLM server does with what the calculator predicts is optimal
for its observed traffic, and say where it has drifted, how badly, what to change and what it
costs.

- `inputs`: `DriftInput`, the plain, frozen view of one (target, model) the rules read;
- `rules`: one pure function per finding, `DriftInput -> Candidate | None`;
- `stability`: hysteresis, minimum durations, clearing, config-change events (per target);
- `state`: atomic, versioned persistence of windows and active findings across restarts.
"""
