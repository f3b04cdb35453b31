"""Shipped recipes (YAML) and the configs they plan from: package data, not code.

`domino-graft recipes` lists them; `domino-graft apply NAME` takes one by name."""
