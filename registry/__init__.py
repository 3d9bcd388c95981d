"""The registry side of enginectl: digests, manifests, the store and the SQL registry.

`registry` never imports `pipeline`; deploy tools import this package alone.
"""
