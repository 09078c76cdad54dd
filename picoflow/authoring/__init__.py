"""The authoring surface: flows, steps, tools, transitions, prompts, decisions and nested step runs.

Also the run context these read and write during a turn. The root ``picoflow`` re-exports the names an author
uses; the other public names live in these modules.
"""
