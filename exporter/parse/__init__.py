"""Reading vLLM `/metrics`: a fast exposition reader (`exposition`), the metric names of every
vLLM era (`eras`), and their canonicalisation into `Snapshot`s (`canonical`)."""
