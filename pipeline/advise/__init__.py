"""From proofs to a fleet's decision: the capacity each proven artifact has at a latency
objective, what a request rate costs on each (`advise`), and the router configuration that
follows from the ranking (`route`).

- `inputs`: the objective and rate as written on the command line (pure).
- `decide`: proofs → ranked options (pure).
- `advise`: reads the registry, then `decide` (the one function `enginectl advise` and
  `enginectl route` call).
- `manifest`: the neutral routing manifest from an advice (pure).
- `routers`: LiteLLM, Envoy AI Gateway and Gateway API inference extension configurations
  rendered from that manifest (pure).

Sits above pipeline.serving (it reads its capacity curves) and below the CLI.
"""
