"""One module per stage. Each holds the pure argv builder for its external program; the code
that runs it through the process runner joins it in the build issue."""
