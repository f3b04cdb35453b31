"""Drafter families, one package each, plus the two contracts they implement.

Installed as `domino_graft.adapters` (the bare name `adapters` is taken on PyPI).

    base.py     the adapter contract (DrafterAdapter: hook points for the Domino head)
    family.py   the family contract (Family: recipe schema, plan, build, bundle layout)
    plan.py     plain-data graft plans
    <family>/   one package per built-in family, exposing FAMILY (found by domino_graft.registry)

Third-party families register through the entry-point group `domino_graft.families`.
"""
