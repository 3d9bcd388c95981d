"""This machine: running its processes and finding what it runs vLLM with.

    runner    the process runner every external program goes through (argv lists, logs,
              timeouts, process groups stopped as one)
    guard     the supervisor each child runs under, run as a script by path
              (`python -I -S .../guard.py`, so stdlib only), and `signal_group`, the one way
              a process group is signalled
    runtimes  vLLM's Python (found one way, `vllm_pythons`) and the vllm in it, programs on
              PATH

The bottom room of `pipeline`: every other room may import it. May import: the standard
library only (`guard` not even the rest of this package); no `registry`, no other part of
`pipeline`, never `click`.
"""
