"""`oncely demo`: the Friday 18:00 leaderboard incident, replayed with real processes.

See `replay.py` for the orchestration and `leaderboard.py` for the app and its three versions.
"""
