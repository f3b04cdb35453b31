"""The drafter-family registry: the one way the core reaches a family.

Families are found in two places, on first use:

* the built-in ones: every package under `domino_graft.adapters` that exposes `FAMILY`;
* installed third-party packages: entry points in the group `domino_graft.families`, each
  naming a `Family` instance (or a class to instantiate), e.g. in the package's pyproject:

      [project.entry-points."domino_graft.families"]
      toyheads = "toyheads_family:FAMILY"

Loading a family imports only its torch-free part (its recipe schema), so `validate` stays
torch-free. Lookups of unknown names list what exists.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import sys

ENTRY_POINT_GROUP = "domino_graft.families"


class FamilyError(ValueError):
    """A family is unknown, or a registered one is malformed."""


FAMILY_ATTRIBUTES = ("name", "display_name", "schema", "model_module", "bundle_files")


def _check(family, origin: str):
    """A registered object must be a Family (adapters/family.py), or a class of one; checked by
    its attributes, so the registry does not import the contract's torch-side helpers."""
    if isinstance(family, type):
        try:
            family = family()
        except Exception as e:
            raise FamilyError(f"{origin}: {family.__name__}() failed ({type(e).__name__}: {e})") from None
    missing = [a for a in FAMILY_ATTRIBUTES if not hasattr(family, a)]
    if missing:
        raise FamilyError(f"{origin}: {type(family).__name__} is not a domino_graft.adapters.family.Family "
                          f"(no {', '.join(missing)})")
    if not isinstance(family.name, str) or not family.name:
        raise FamilyError(f"{origin}: name {family.name!r} is not a family name; valid: a non-empty string")
    tag = getattr(family.schema, "model_fields", {}).get("family")
    if tag is None or getattr(tag.annotation, "__args__", None) != (family.name,):
        raise FamilyError(f"{origin}: {family.name!r}'s schema must declare family: Literal[{family.name!r}]")
    return family


def _builtin():
    from . import adapters

    for info in pkgutil.iter_modules(adapters.__path__):
        if info.ispkg:
            module = importlib.import_module(f"{adapters.__name__}.{info.name}")
            if hasattr(module, "FAMILY"):
                yield module.FAMILY, module.__name__, None


def _installed():
    """(object or None, origin, entry point name) per installed plug-in; None when it failed to import."""
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        origin = f"entry point {ep.name!r} ({ep.value}) in group {ENTRY_POINT_GROUP}"
        try:
            obj = ep.load()
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # SystemExit too: a plug-in must not end the CLI silently
            yield FamilyError(f"{origin}: could not be imported ({type(e).__name__}: {e})"), origin, ep.name
            continue
        yield obj, origin, ep.name


@functools.lru_cache(maxsize=None)
def _scan() -> tuple[dict, dict]:
    """({name: Family}, {name: why that plug-in is ignored}). A broken built-in is a bug and
    raises; a broken or colliding plug-in is set aside with its reason, so one bad package does
    not take every command down, and a recipe naming it gets the reason (get_family)."""
    found: dict = {}
    origins: dict = {}
    broken: dict = {}
    for obj, origin, ep_name in (*_builtin(), *_installed()):
        try:
            if isinstance(obj, FamilyError):
                raise obj
            family = _check(obj, origin)
            if family.name in found:
                raise FamilyError(f"{origin}: family name {family.name!r} is already registered by "
                                  f"{origins[family.name]}")
        except FamilyError as e:
            if ep_name is None:
                raise
            broken.setdefault(ep_name, f"{e}; the plug-in is ignored (fix or uninstall it)")
            continue
        found[family.name] = family
        origins[family.name] = origin
    for why in broken.values():
        print(f"warning: {why}", file=sys.stderr)
    return found, broken


def _families() -> dict:
    return _scan()[0]


def broken_plugins() -> dict:
    """{entry point name: why it is ignored} for installed plug-ins that failed to load."""
    return dict(_scan()[1])


def families() -> dict:
    """name -> Family, built-in first, then installed ones."""
    return dict(_families())


def family_names() -> tuple[str, ...]:
    return tuple(_families())


def get_family(name: str):
    found = _families()
    if name not in found:
        why = _scan()[1].get(name)
        if why is not None and name not in found:
            raise FamilyError(f"drafter.family: {name!r} is an installed plug-in that failed to load: {why}")
        raise FamilyError(f"drafter.family: {name!r} is not a registered drafter family; valid: {', '.join(found)}")
    return found[name]
