"""The tutorials' bench, which ships in the library as ``picoflow.local.bench``; pages import it from there."""

from picoflow.local.bench import Bench, replay

__all__ = ["Bench", "replay"]
