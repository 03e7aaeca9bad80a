"""tests/python/replay_json.py: what the Python tests compare of the CLI's --json answers."""


def without_timings(value):
    """`value` less what differs between two runs of one replay: host time and the trace's path."""
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if not k.startswith("host_") and k != "trace"}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value
