"""One module per `vllm-drift` sub-command. Each exposes `register(subparsers)`, which adds its
parser and sets `func` to a callable taking the parsed arguments and returning the exit status."""
