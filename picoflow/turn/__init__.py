"""The turn: the hop loop, model calls, tool dispatch, transitions, and nested, parallel and decision execution."""
