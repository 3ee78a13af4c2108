"""Pure functions over the tables: a timeline becomes a Report (``triage.py``).

Every module here is a function of what was read and the rules; nothing is printed, nothing is
imported from the renderers, the profiler or the command line (``tests/test_layers.py``).
"""
